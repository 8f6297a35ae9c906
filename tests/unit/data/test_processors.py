"""Data processors: deterministic global batches, shards that are exact slices, clear data errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from weightstream.data import DataError, make_data_processor
from weightstream.params.schema import FCMLPModelParams, GPT2ModelParams, InputParams

GPT2 = GPT2ModelParams(
    name="gpt2", vocab_size=256, hidden_size=8, num_hidden_layers=1, num_heads=2, max_position_embeddings=16
)
MLP = FCMLPModelParams(name="fc_mlp", input_size=64, hidden_size=8, depth=1)


def _inp(**kw) -> InputParams:
    return InputParams(**{"batch_size": 8, "max_sequence_length": 6, **kw})


def _text_dir(tmp_path: Path) -> Path:
    (tmp_path / "a.txt").write_text("hello weightstream " * 20)
    (tmp_path / "b.txt").write_text("ünïcödé bytes " * 10)
    return tmp_path


@pytest.fixture(params=["text", "tokens", "synthetic", "digits"])
def processor(request, tmp_path: Path):
    kind = request.param
    if kind == "text":
        return make_data_processor(
            _inp(data_processor="TextFileDataProcessor", data_dir=str(_text_dir(tmp_path))), GPT2, "train"
        )
    if kind == "tokens":
        (np.arange(300, dtype=np.uint16) % 256).tofile(tmp_path / "part0.bin")
        (np.arange(100, dtype=np.uint16) % 50).tofile(tmp_path / "part1.bin")
        return make_data_processor(
            _inp(data_processor="TokenFileDataProcessor", data_dir=str(tmp_path)), GPT2, "train"
        )
    if kind == "synthetic":
        return make_data_processor(_inp(data_processor="SyntheticDataProcessor"), GPT2, "train")
    return make_data_processor(
        _inp(data_processor="DigitsDataProcessor", max_sequence_length=None), MLP, "train"
    )


def test_batches_are_deterministic_and_shards_are_slices(processor) -> None:
    for step in (0, 1, 7, 250):  # 250 crosses several epochs of the file-backed sets
        x, y = processor.global_batch(step)
        x2, y2 = processor.global_batch(step)
        assert np.array_equal(x, x2) and np.array_equal(y, y2)
        assert len(x) == 8
        for n in (1, 2, 4, 8):
            shards = [processor.shard(step, w, n) for w in range(n)]
            assert np.array_equal(np.concatenate([s[0] for s in shards]), x)
            assert np.array_equal(np.concatenate([s[1] for s in shards]), y)
    assert not np.array_equal(processor.global_batch(0)[1], processor.global_batch(1)[1])


def test_token_windows_shift_targets_by_one(tmp_path: Path) -> None:
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "t.bin")
    model = GPT2.model_copy(update={"vocab_size": 1000})
    dp = make_data_processor(
        _inp(data_processor="TokenFileDataProcessor", data_dir=str(tmp_path), shuffle=False), model, "train"
    )
    x, y = dp.global_batch(0)
    assert x.shape == y.shape == (8, 6) and x.dtype == np.int64
    assert np.array_equal(x[0], np.arange(6)) and np.array_equal(y[0], np.arange(1, 7))
    assert np.array_equal(x[1], np.arange(6, 12))  # non-overlapping windows of T tokens


def test_shuffle_visits_every_sample_once_per_epoch(tmp_path: Path) -> None:
    np.arange(6 * 16 + 1, dtype=np.uint16).tofile(tmp_path / "t.bin")  # exactly 16 samples
    dp = make_data_processor(
        _inp(data_processor="TokenFileDataProcessor", data_dir=str(tmp_path)), GPT2, "train"
    )
    epoch = np.concatenate([dp.sample_indices(s) for s in (0, 1)])
    assert sorted(epoch) == list(range(16)) and list(epoch) != list(range(16))


def test_synthetic_train_and_eval_differ_and_are_learnable() -> None:
    train = make_data_processor(_inp(data_processor="SyntheticDataProcessor"), GPT2, "train")
    ev = make_data_processor(_inp(data_processor="SyntheticDataProcessor"), GPT2, "eval")
    x, y = train.global_batch(0)
    assert not np.array_equal(x, ev.global_batch(0)[0])
    stride = (y - x) % 256
    assert (stride == stride[:, :1]).all() and ((stride >= 1) & (stride <= 8)).all()


def test_data_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="is not a directory"):
        make_data_processor(
            _inp(data_processor="TextFileDataProcessor", data_dir=str(tmp_path / "nope")), GPT2, "train"
        )
    with pytest.raises(DataError, match=r"no \*\.bin files"):
        make_data_processor(
            _inp(data_processor="TokenFileDataProcessor", data_dir=str(tmp_path)), GPT2, "train"
        )
    np.array([1, 2, 999], dtype=np.uint16).tofile(tmp_path / "t.bin")
    with pytest.raises(DataError, match=r"token id 999 .*model\.vocab_size=256"):
        make_data_processor(
            _inp(data_processor="TokenFileDataProcessor", data_dir=str(tmp_path)), GPT2, "train"
        )
    (tmp_path / "short.txt").write_text("abc")
    with pytest.raises(DataError, match="fewer than one sample"):
        make_data_processor(
            _inp(data_processor="TextFileDataProcessor", data_dir=str(tmp_path)), GPT2, "train"
        )
