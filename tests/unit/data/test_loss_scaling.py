"""ModelZoo's ``loss_scaling``/``loss_weight``: the loss and gradients are ModelZoo's GPTLMHeadModelLoss
(computed here in torch on Hugging Face's GPT-2 with the same weights), the denominator is the global
batch's whatever the number of workers, ``num_tokens`` is bitwise what it was, the denominator crosses the
wire as float64, and the params keys are checked as ModelZoo checks them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from numpy.testing import assert_allclose, assert_array_equal

from tests.params_files import TINY, padded_hdf5_params
from weightstream.activation.service import ActivationServer, ActivationServicer
from weightstream.data import DataProcessor, make_data_processor
from weightstream.data.loss_scaling import LossScaling, loss_denominator, loss_scaling
from weightstream.numerics import GPT2Config, build_gpt2, forward_backward, forward_loss, init_params
from weightstream.params import ParamsError, dump_params, load_params
from weightstream.params.schema import FCMLPModelParams
from weightstream.proto import weightstream_pb2 as pb
from weightstream.training.reference import ReferenceTrainer
from weightstream.transport.tensors import read_messages
from weightstream.worker.service import ActivationClient

torch = pytest.importorskip(
    "torch", reason="torch==2.13.0 (CPU) is the test reference: pip install -e .[test]"
)

B, T = 4, 8
CFG = GPT2Config(vocab_size=29, n_positions=T, n_embd=16, n_layer=2, n_head=4, n_inner=32)


class Fixed(DataProcessor):
    """One batch, the same every step: ``batch_size`` and the counted targets are what loss_denominator
    reads."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        super().__init__(batch_size=len(x), seed=0, shuffle=False)
        self.x, self.y = x, y

    @property
    def num_samples(self) -> int:
        return len(self.x)

    def samples(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.x[indices], self.y[indices]

    def global_tokens(self, step: int) -> int:
        return int(np.count_nonzero(self.y >= 0))


def _padded_batch(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """ids [B, T] and targets [B, T] with -1 (padding) after each sample's length 8, 5, 3, 6."""
    ids = rng.integers(0, CFG.vocab_size, (B, T + 1))
    x, y = ids[:, :-1].copy(), ids[:, 1:].copy()
    for i, length in enumerate((8, 5, 3, 6)):
        y[i, length:] = -1
    return x, y


def _modelzoo_loss(logits: Any, y: np.ndarray, kind: str, weight: float) -> Any:
    """GPTLMHeadModelLoss.forward (reduce_batch): CrossEntropyLoss(reduction='none') times the attention
    mask, then the sum / mask.sum() (num_tokens) or the sum / batch size * loss_weight (batch_size). Its
    labels at padding are real ids (here 0) that the mask zeroes, as ModelZoo's data has them."""
    mask = torch.as_tensor(y >= 0, dtype=logits.dtype)
    labels = torch.as_tensor(np.where(y >= 0, y, 0))
    lm_loss = torch.nn.CrossEntropyLoss(reduction="none")(
        logits.view(-1, logits.shape[-1]), labels.view(-1).long()
    )
    lm_loss = lm_loss * mask.view(-1)
    if kind == "num_tokens":
        return torch.sum(lm_loss) / torch.sum(mask)
    return torch.sum(lm_loss) / labels.shape[0] * weight


@pytest.mark.parametrize(
    "scaling", [LossScaling("batch_size", 1 / T), LossScaling("batch_size", 0.3), LossScaling()], ids=str
)
def test_loss_and_gradients_are_modelzoos(scaling: LossScaling, rng: np.random.Generator) -> None:
    """Our loss and every gradient, with loss_denominator's denominator, against ModelZoo's definition
    computed in torch on Hugging Face's GPT2LMHeadModel holding the same float64 weights."""
    transformers = pytest.importorskip("transformers", reason="the reference model: pip install -e .[test]")
    model = build_gpt2(CFG)
    params = {n: v.astype(np.float64) for n, v in init_params(model, seed=5).items()}
    x, y = _padded_batch(rng)
    denom = loss_denominator(Fixed(x, y), 0, scaling)
    loss, grads = forward_backward(model, params, x, y, denom)
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=CFG.vocab_size, n_positions=T, n_embd=CFG.n_embd, n_layer=CFG.n_layer,
            n_head=CFG.n_head, n_inner=CFG.n_inner, activation_function="gelu_new",
        )
    ).double().eval()  # fmt: skip
    state = hf.state_dict()
    with torch.no_grad():
        for n, v in params.items():
            state[n].copy_(torch.from_numpy(v))
    ref = _modelzoo_loss(hf(input_ids=torch.as_tensor(x)).logits, y, scaling.kind, scaling.weight)
    ref.backward()
    assert_allclose(loss, ref.item(), rtol=1e-12)
    hf_grads = {n: t.grad.numpy() for n, t in hf.named_parameters()}
    for name in model.specs:
        assert_allclose(grads[name], hf_grads[name], rtol=1e-8, atol=1e-14, err_msg=name)
    counted = int((y >= 0).sum())
    assert 0 < counted < B * T  # padding, so the two scalings differ
    if scaling.kind == "batch_size":  # the same loss as num_tokens, times counted / B * weight
        mean, _ = forward_backward(model, params, x, y, counted)
        assert_allclose(loss, mean * counted / B * scaling.weight, rtol=1e-12)


def test_num_tokens_is_bitwise_the_integer_count_of_before(rng: np.random.Generator) -> None:
    model = build_gpt2(CFG)
    params = init_params(model, seed=5)  # float32, as workers compute
    x, y = _padded_batch(rng)
    denom = loss_denominator(Fixed(x, y), 0)
    assert isinstance(denom, float) and denom == int((y >= 0).sum())
    before = forward_backward(model, params, x, y, int((y >= 0).sum()))
    now = forward_backward(model, params, x, y, denom)
    assert now[0] == before[0]
    for n in before[1]:
        assert_array_equal(now[1][n], before[1][n], err_msg=n)


def test_batch_size_reads_no_padding_masks(rng: np.random.Generator, monkeypatch) -> None:
    """batch_size / loss_weight needs no count: an HDF5 processor's mask rows are not read for it."""
    x, y = _padded_batch(rng)
    data = Fixed(x, y)
    monkeypatch.setattr(data, "global_tokens", lambda step: pytest.fail("read the counted tokens"))
    assert loss_denominator(data, 3, LossScaling("batch_size", 0.25)) == B / 0.25


def _loaded(tmp: Path, **model: Any) -> Any:
    tmp.mkdir()
    raw = padded_hdf5_params(tmp)
    raw["model"].update(model)
    return load_params(raw, overrides={"eval_steps": 1})


def test_every_worker_gets_the_global_denominator_and_n_workers_equal_one(tmp_path: Path) -> None:
    """The activation server hands every shard batch_size / loss_weight of the *global* batch (eval: the
    eval batch's), so the reference's gradients with 2 shards equal those with 1."""
    params = _loaded(tmp_path / "scaled", loss_scaling="batch_size", loss_weight=0.3)
    params = params.model_copy(update={"eval_input": params.eval_input.model_copy(update={"batch_size": 4})})
    scaling = loss_scaling(params.model)
    assert scaling == LossScaling("batch_size", 0.3)
    train = make_data_processor(params.train_input, params.model, "train")
    evals = make_data_processor(params.eval_input, params.model, "eval")
    server = ActivationServer(train, evals, scaling)
    assert {server.batch("train", 1, w, 2)[2] for w in range(2)} == {8 / 0.3}
    assert {server.batch("eval", 0, w, 4)[2] for w in range(4)} == {4 / 0.3}
    one, two = ReferenceTrainer(params, num_shards=1), ReferenceTrainer(params, num_shards=2)
    (loss1, grads1, tokens1), (loss2, grads2, tokens2) = one.gradients(1), two.gradients(1)
    assert tokens1 == tokens2 == train.global_tokens(1) < 8 * 16  # counted tokens, not the denominator
    # float32 agreement, not bitwise: OpenBLAS's AVX2 kernels (blas_kernel.py) compute a product's last
    # rows with other code than the rows before them, so a row's logits depend on where the shard ends
    assert loss2 == pytest.approx(loss1, rel=1e-6)
    for n, g in grads1.items():
        assert_allclose(grads2[n], g, rtol=1e-5, atol=1e-7, err_msg=n)  # float32 sums in two orders
    # and it is the num_tokens run's loss times counted / (B * T) * T * 0.3
    base, _, counted = ReferenceTrainer(_loaded(tmp_path / "plain"), num_shards=1).gradients(1)
    assert loss1 == pytest.approx(base * counted / 8 * 0.3, rel=1e-6)
    # evaluation divides by the eval batch size / loss_weight: the 4 samples of eval step 0
    xe, ye = evals.global_batch(0)
    mean = forward_loss(one.model, one.weights, xe, ye, int((ye >= 0).sum()))
    assert one.evaluate() == pytest.approx(mean * int((ye >= 0).sum()) / 4 * 0.3, rel=1e-6)


def test_the_denominator_crosses_the_wire_as_float64(rng: np.random.Generator) -> None:
    """The activation servicer's GetBatch stream, read by the worker's ActivationClient (its gRPC call
    replaced by the servicer itself): a denominator that is no integer arrives exactly."""
    x, y = _padded_batch(rng)

    class Host:
        def logic(self, context: object) -> ActivationServer:
            return ActivationServer(Fixed(x, y), None, LossScaling("batch_size", 0.3))

    servicer = ActivationServicer(Host())  # type: ignore[arg-type]
    request = pb.BatchRequest(split="train", step=0, worker=1, num_workers=2)
    tensors = read_messages(list(servicer.GetBatch(request, None)))[1]  # type: ignore[arg-type]
    assert tensors["denom"].dtype == np.float64
    client = ActivationClient("127.0.0.1:1", "activation-0", 5.0, "token", 0)  # never connects
    client._get = lambda req, timeout: servicer.GetBatch(req, None)  # type: ignore[arg-type]
    xs, ys, denom = client.get("train", 0, 1, 2)
    assert denom == B / 0.3 and isinstance(denom, float)  # not rounded to an integer on the way
    assert_array_equal(xs, x[2:])
    assert_array_equal(ys, y[2:])


# ---------------------------------------------------------------------------------------------------------
# The params keys
# ---------------------------------------------------------------------------------------------------------
def _raw(**model: Any) -> dict[str, Any]:
    raw = copy.deepcopy(TINY)
    raw["model"].update(model)
    return raw


def test_params_accept_modelzoos_keys_and_survive_dump_and_load() -> None:
    p = load_params(_raw(loss_scaling="batch_size", loss_weight=0.0625))
    assert loss_scaling(p.model) == LossScaling("batch_size", 0.0625)
    again = load_params(yaml.safe_load(dump_params(p)))  # as the roles load it
    assert again == p
    default = load_params(_raw()).model
    assert not isinstance(default, FCMLPModelParams)
    assert (default.loss_scaling, default.loss_weight) == ("num_tokens", 1.0)
    assert loss_scaling(default) == LossScaling()
    llama = _raw(name="llama", filter_size=64, loss_scaling="batch_size", loss_weight=0.5)
    assert loss_scaling(load_params(llama).model) == LossScaling("batch_size", 0.5)
    digits = FCMLPModelParams(name="fc_mlp", input_size=64, hidden_size=8, depth=1)
    assert loss_scaling(digits) == LossScaling()  # one target per sample: the batch mean, as ModelZoo's


@pytest.mark.parametrize(
    "model,message",
    [
        ({"loss_weight": 0.5}, r"model\.loss_weight: must be 1\.0 with loss_scaling: num_tokens"),
        ({"loss_scaling": "batch_size", "loss_weight": 0.0}, r"model\.loss_weight: .*greater than 0"),
        ({"loss_scaling": "batch_size", "loss_weight": -1.0}, r"model\.loss_weight: .*greater than 0"),
        ({"loss_scaling": "tokens"}, r"model\.loss_scaling: .*'num_tokens' or 'batch_size'"),
    ],
    ids=["weight with num_tokens", "zero weight", "negative weight", "unknown scaling"],
)
def test_params_refuse_what_modelzoo_refuses(model: dict[str, Any], message: str) -> None:
    with pytest.raises(ParamsError, match=message):
        load_params(_raw(**model))
