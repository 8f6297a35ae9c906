"""GptHDF5MapDataProcessor end to end: `weightstream run` trains a tiny byte-level GPT-2 on HDF5 files
(ModelZoo's layout, padding after the end of most documents) built from Python's own documentation, on one
and on two CS-2 workers; the loss falls, both runs follow the reference trainer step for step, and one
worker's weights are the reference's bit for bit. (Not one worker's against two workers' bit for bit: their
gradient sums round in another order, as in test_appliance, which compares node counts by the losses.)"""

from __future__ import annotations

import copy
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any

import numpy as np
import pytest
import yaml
from numpy.testing import assert_allclose

from tests.integration.appliance import LOSS_RTOL, TINY, checkpoint_weights, metrics, run
from tests.integration.hdf5_corpus import SEQ, byte_documents, write_corpus
from weightstream.params import load_params
from weightstream.training.reference import ReferenceTrainer

h5py = pytest.importorskip("h5py", reason="GptHDF5MapDataProcessor reads HDF5 with h5py")

STEPS = 40
# Two workers against one: the same steps, but float32 gradient sums in another order (two shards summed
# by SwarmX), and Adam turns the ~1e-7 differences of near-zero gradients into whole updates of ~lr, so
# after 40 steps the weights differ by ~1e-4 (measured 7e-5); a wrong denominator on either side
# scales every update from step 1 and shows in the losses first (a step's loss off by the ratio).
WEIGHT_ATOL_40 = 1e-3


def hdf5_params(tmp: Path) -> Path:
    # the Python documentation's topics that ship with Python: English that stays the same from one commit
    # of ours to the next (a corpus of our own README would change the test with every edit of it)
    docs = byte_documents("\n".join(topics[k] for k in sorted(topics)))
    assert len(docs) > 500
    n_train = write_corpus(tmp / "train", docs[:-60], files=3)
    write_corpus(tmp / "eval", docs[-60:], files=1)
    assert n_train > 8 * STEPS  # no sample twice: the falling loss is learning, not memorising
    raw: dict[str, Any] = copy.deepcopy(TINY)
    common = {"data_processor": "GptHDF5MapDataProcessor", "max_sequence_length": SEQ, "batch_size": 8}
    raw["train_input"] = {**common, "data_dir": str(tmp / "train"), "shuffle_seed": 3}
    raw["eval_input"] = {**common, "data_dir": str(tmp / "eval")}
    raw["model"].update(vocab_size=256, max_position_embeddings=SEQ)
    raw["optimizer"]["learning_rate"] = [
        {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 5e-3, "total_iters": 5},
        {
            "scheduler": "CosineDecay",
            "initial_learning_rate": 5e-3,
            "end_learning_rate": 5e-4,
            "total_iters": 35,
        },
    ]
    raw["runconfig"].update(max_steps=STEPS, log_steps=1, eval_steps=2)
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow  # ~12 s: the default suite stays well under 10 minutes
def test_hdf5_with_padding_trains_the_same_on_one_and_two_workers(tmp_path: Path) -> None:
    params_path = hdf5_params(tmp_path)
    ref = ReferenceTrainer(load_params(params_path), num_shards=1)
    ref_losses = [ref.train_step().loss for _ in range(STEPS)]
    ref_eval = ref.evaluate()
    runs = {}
    for n in (1, 2):
        model_dir = tmp_path / f"csx{n}"
        r = run(params_path, model_dir, "--num_csx", str(n))
        assert r.returncode == 0, r.stderr
        runs[n] = model_dir
        losses, evals = metrics(model_dir)
        assert sorted(losses) == list(range(1, STEPS + 1))
        # the padded tokens are out of the loss and its denominator on every worker: the reference's curve
        assert_allclose([losses[s] for s in range(1, STEPS + 1)], ref_losses, rtol=LOSS_RTOL, err_msg=f"{n}")
        assert_allclose(evals[STEPS], ref_eval, rtol=LOSS_RTOL)
        assert np.mean([losses[s] for s in range(STEPS - 4, STEPS + 1)]) < losses[1] - 1.5  # ln 256 = 5.5
    one, two = (checkpoint_weights(runs[n], STEPS) for n in (1, 2))
    assert sorted(one) == sorted(two) == sorted(ref.weights)
    for name, w in ref.weights.items():  # one worker computes exactly what the reference computes
        np.testing.assert_array_equal(one[name], w, err_msg=name)
    for name in one:
        assert_allclose(two[name], one[name], rtol=0, atol=WEIGHT_ATOL_40, err_msg=name)
    # padding is out of the loss: Hugging Face's GPT-2 on the same checkpoint and eval samples, read from
    # the file here with labels -100 at attention_mask 0, gives the eval loss the two workers reported
    assert ref.eval_data is not None
    rows = [ref.eval_data.sample_indices(b) for b in range(2)]  # epoch 0 of one file: ids are its rows
    hf_masked, hf_counting_padding = hf_eval_losses(runs[2] / f"checkpoint_{STEPS}", tmp_path / "eval", rows)
    _, evals = metrics(runs[2])
    assert_allclose(evals[STEPS], hf_masked, rtol=1e-5)
    assert abs(hf_counting_padding - hf_masked) > 1e-2 * hf_masked  # so the check above has teeth


def hf_eval_losses(checkpoint: Path, eval_dir: Path, batches: list[np.ndarray]) -> tuple[float, float]:
    """Mean over ``batches`` (rows of the one eval file) of transformers' mean token loss: with padding
    ignored, and (for contrast) with padding counted as label 0."""
    torch = pytest.importorskip("torch", reason="pip install -e .[test]")
    transformers = pytest.importorskip("transformers", reason="pip install -e .[test]")
    model = transformers.GPT2LMHeadModel.from_pretrained(checkpoint).eval()
    with h5py.File(eval_dir / "part-00.h5", "r") as f:
        data = f["data"][...].astype(np.int64)  # [n, 3, SEQ]
    masked, counted = [], []
    for rows in batches:
        x, mask, labels = (torch.as_tensor(data[rows, k]) for k in range(3))  # [8, SEQ] each
        with torch.no_grad():
            logits = model(x).logits.reshape(-1, 256)
        ignored = torch.where(mask == 0, -100, labels).reshape(-1)
        masked.append(torch.nn.functional.cross_entropy(logits, ignored).item())
        counted.append(torch.nn.functional.cross_entropy(logits, labels.reshape(-1)).item())
    return float(np.mean(masked)), float(np.mean(counted))
