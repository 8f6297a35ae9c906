"""GptHDF5MapDataProcessor: ModelZoo's GPT HDF5 files read back, padding masked, epochs, mixtures, errors,
reads that touch only a step's rows; and drop_last and the global token count on the base class."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from weightstream.activation.service import ActivationServer
from weightstream.data import DataError, make_data_processor
from weightstream.params.schema import FCMLPModelParams, GPT2ModelParams, InputParams, LlamaModelParams

h5py = pytest.importorskip("h5py", reason="GptHDF5MapDataProcessor reads HDF5 with h5py")
from weightstream.data.hdf5 import GptHDF5MapDataProcessor, apportion  # noqa: E402 (needs h5py)

T = 8  # max_sequence_length
V = 1024
GPT2 = GPT2ModelParams(
    name="gpt2", vocab_size=V, hidden_size=8, num_hidden_layers=1, num_heads=2, max_position_embeddings=T
)


def make_samples(n: int, tag: int) -> np.ndarray:
    """[n, 3, T] in ModelZoo's layout. Sample i: input_ids[0] = 100 * tag + i (so a read-back sample names
    its file and row), real tokens first, then i % 3 positions of padding (ids 0, mask 0, labels 0)."""
    data = np.zeros((n, 3, T), dtype=np.int32)
    for i in range(n):
        length = T - i % 3
        ids = (7 * i + np.arange(length) + 1) % V
        ids[0] = 100 * tag + i
        data[i, 0, :length] = ids
        data[i, 1, :length] = 1
        data[i, 2, :length] = (ids + 1) % V  # "the next token": any id will do here
    return data


def write_h5(path: Path, data: np.ndarray, chunked: bool = False, **attrs: Any) -> Path:
    """``chunked``: as ModelZoo and ``data-preprocess`` write them, one gzip chunk per sample."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        if chunked:
            f.create_dataset("data", data=data, chunks=(1, 3, T), compression="gzip")
        else:
            f.create_dataset("data", data=data)
        f.attrs["n_examples"] = attrs.get("n_examples", len(data))
    return path


def inp(data_dir: Any = None, **kw: Any) -> InputParams:
    return InputParams(
        data_processor="GptHDF5MapDataProcessor",
        data_dir=data_dir,
        **{"batch_size": 4, "max_sequence_length": T, **kw},
    )


def processor(data_dir: Any = None, **kw: Any) -> GptHDF5MapDataProcessor:
    p = make_data_processor(inp(data_dir, **kw), GPT2, "train")
    assert isinstance(p, GptHDF5MapDataProcessor)
    return p


@pytest.fixture(params=[False, True], ids=["contiguous", "chunked-gzip"])
def corpus(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, np.ndarray]:
    """Two files, 5 + 7 samples; returns (directory, every sample in file order)."""
    a, b = make_samples(5, tag=1), make_samples(7, tag=2)
    write_h5(tmp_path / "c" / "part-b.h5", b, chunked=request.param)
    write_h5(tmp_path / "c" / "part-a.h5", a, chunked=request.param)  # sorted by name, not by creation
    return tmp_path / "c", np.concatenate([a, b])


def test_samples_read_back_with_targets_minus_one_exactly_on_padding(corpus) -> None:
    d, want = corpus
    p = processor(str(d), batch_size=12, shuffle=False)
    assert p.num_samples == 12
    x, y = p.global_batch(0)
    assert x.shape == y.shape == (12, T) and x.dtype == y.dtype == np.int64
    np.testing.assert_array_equal(x, want[:, 0])
    padding = want[:, 1] == 0
    assert padding.sum() == 4 + 6  # rows i % 3 == 1 pad one position, i % 3 == 2 two
    np.testing.assert_array_equal(y == -1, padding)
    np.testing.assert_array_equal(y[~padding], want[:, 2][~padding])
    # any order, repeats included, comes back in the order asked for
    ids = np.array([11, 0, 5, 0, 4])
    np.testing.assert_array_equal(p.samples(ids)[0], want[ids, 0])


def test_a_list_of_directories_is_one_dataset(tmp_path: Path) -> None:
    write_h5(tmp_path / "x" / "0.h5", make_samples(3, tag=1))
    write_h5(tmp_path / "y" / "0.h5", make_samples(2, tag=2))
    p = processor([str(tmp_path / "y"), str(tmp_path / "x")], batch_size=5, shuffle=False)
    assert list(p.global_batch(0)[0][:, 0]) == [200, 201, 100, 101, 102]  # in the order given


def test_shuffled_epochs_are_deterministic_by_seed_and_cover_every_sample(corpus) -> None:
    d, _ = corpus
    first = [processor(str(d), shuffle_seed=5).global_batch(s)[0][:, 0] for s in range(6)]
    again = [processor(str(d), shuffle_seed=5).global_batch(s)[0][:, 0] for s in range(6)]
    other = [processor(str(d), shuffle_seed=6).global_batch(s)[0][:, 0] for s in range(6)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))
    # 12 samples, batches of 4: each epoch is 3 whole batches with every sample once, in a new order
    epochs = [np.concatenate(first[e * 3 : e * 3 + 3]) for e in (0, 1)]
    assert all(sorted(e) == sorted([100 + i for i in range(5)] + [200 + i for i in range(7)]) for e in epochs)
    assert not np.array_equal(epochs[0], epochs[1])


def test_drop_last_skips_each_epochs_remainder(tmp_path: Path) -> None:
    write_h5(tmp_path / "d" / "a.h5", make_samples(10, tag=0))
    on = processor(str(tmp_path / "d"), drop_last=True, shuffle_seed=3)
    assert on.drop_last and processor(str(tmp_path / "d")).drop_last  # the default for HDF5
    off = processor(str(tmp_path / "d"), drop_last=False, shuffle_seed=3)
    perm = [np.random.default_rng([3, e]).permutation(10) for e in (0, 1)]  # the epochs' orders
    # on: 2 whole batches per epoch; the last 2 of epoch 0's order are never used, step 2 starts epoch 1
    got = [on.global_batch(s)[0][:, 0] for s in range(4)]
    np.testing.assert_array_equal(np.concatenate(got[:2]), perm[0][:8])
    np.testing.assert_array_equal(np.concatenate(got[2:]), perm[1][:8])
    # off: step 2 takes the end of epoch 0 and the start of epoch 1
    np.testing.assert_array_equal(off.global_batch(2)[0][:, 0], np.r_[perm[0][8:], perm[1][:2]])


def test_drop_last_on_the_other_processors_and_their_unchanged_default(tmp_path: Path) -> None:
    (np.arange(61, dtype=np.uint16) % 256).tofile(tmp_path / "t.bin")  # 10 windows of 6 + 1 tokens
    kw: dict[str, Any] = {"data_processor": "TokenFileDataProcessor", "data_dir": str(tmp_path)}
    default = make_data_processor(InputParams(batch_size=4, max_sequence_length=6, **kw), GPT2, "train")
    dropping = make_data_processor(
        InputParams(batch_size=4, max_sequence_length=6, drop_last=True, **kw), GPT2, "train"
    )
    assert not default.drop_last
    for step in range(5):  # the formula the processors have always used
        ids = np.arange(step * 4, step * 4 + 4)
        epochs, within = np.divmod(ids, 10)
        want = [
            np.random.default_rng([0, int(e)]).permutation(10)[w] for e, w in zip(epochs, within, strict=True)
        ]
        np.testing.assert_array_equal(default.sample_indices(step), want)
    np.testing.assert_array_equal(
        dropping.sample_indices(2), np.random.default_rng([0, 1]).permutation(10)[:4]
    )


def test_drop_last_with_fewer_samples_than_a_batch_is_an_error(tmp_path: Path) -> None:
    write_h5(tmp_path / "d" / "a.h5", make_samples(3, tag=0))
    with pytest.raises(DataError, match=r"batch_size 4 .*3 samples"):
        processor(str(tmp_path / "d"))
    assert processor(str(tmp_path / "d"), drop_last=False).global_batch(0)[0].shape == (4, T)


def test_mixture_shares_follow_the_weights_and_are_deterministic(tmp_path: Path) -> None:
    """Sizes 10 and 30, weights 3:1: each epoch of 40 has 30 of the small set (every row three times)
    and 10 of the large one, which moves on through its rows: all 30 once in three epochs."""
    write_h5(tmp_path / "small" / "a.h5", make_samples(10, tag=1))
    write_h5(tmp_path / "large" / "a.h5", make_samples(30, tag=5))
    mixture = [
        {"data_dir": str(tmp_path / "small"), "weight": 3.0},
        {"data_dir": str(tmp_path / "large"), "weight": 1.0},
    ]
    p = processor(mixture=mixture, batch_size=8, shuffle_seed=1)
    assert p.num_samples == 40 and list(p.per_epoch) == [30, 10]
    firsts = np.concatenate([p.global_batch(s)[0][:, 0] for s in range(15)])  # three epochs of 5 batches
    again = np.concatenate(
        [processor(mixture=mixture, batch_size=8, shuffle_seed=1).global_batch(s)[0][:, 0] for s in range(15)]
    )
    np.testing.assert_array_equal(firsts, again)
    for e in range(3):
        epoch = firsts[e * 40 : (e + 1) * 40]
        small, large = epoch[epoch < 500], epoch[epoch >= 500]
        assert sorted(small) == sorted(list(range(100, 110)) * 3)
        assert len(large) == 10 and len(set(large)) == 10
    large = firsts[firsts >= 500]
    assert sorted(large) == list(range(500, 530))
    # three sets, weights that do not divide N = 10 + 30 + 21 = 61: each epoch's shares are the weights'
    # to one sample in 61, and a part of an epoch (here the first half) is near them too
    write_h5(tmp_path / "third" / "a.h5", make_samples(21, tag=3))
    three = [*mixture, {"data_dir": str(tmp_path / "third"), "weight": 2.0}]
    q = processor(mixture=three, batch_size=5, shuffle_seed=2, drop_last=False)
    seen = np.concatenate([q.global_batch(s)[0][:, 0] // 100 for s in range(61)])  # five epochs exactly
    for part, tol in ((seen, 1 / 61), (seen[:30], 0.15)):
        shares = np.array([np.mean(part == tag) for tag in (1, 5, 3)])
        np.testing.assert_allclose(shares, np.array([3, 1, 2]) / 6, atol=tol)


def test_apportion_is_exact_to_one_sample() -> None:
    counts = apportion([0.5, 0.3, 0.2], 41)
    assert counts.sum() == 41 and list(counts) == [21, 12, 8]  # 20.5, 12.3, 8.2: the largest remainder
    assert list(apportion([1, 1, 1], 4)) == [2, 1, 1]


def test_errors_name_the_file_and_what_is_wrong(tmp_path: Path) -> None:
    write_h5(tmp_path / "len" / "a.h5", make_samples(4, tag=0)[:, :, : T - 2])
    with pytest.raises(
        DataError, match=rf"len/a.h5: samples are {T - 2} tokens long.*max_sequence_length is {T}"
    ):
        processor(str(tmp_path / "len"))
    (tmp_path / "nodata").mkdir()
    with h5py.File(tmp_path / "nodata" / "a.h5", "w") as f:
        f.create_dataset("input_ids", data=np.zeros((4, T), np.int32))
    with pytest.raises(DataError, match=r"nodata/a.h5: has no dataset 'data'"):
        processor(str(tmp_path / "nodata"))
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.h5").write_text("not HDF5 at all")
    with pytest.raises(DataError, match=r"text/a.h5: not a readable HDF5 file"):
        processor(str(tmp_path / "text"))
    write_h5(tmp_path / "count" / "a.h5", make_samples(4, tag=0), n_examples=5)
    with pytest.raises(DataError, match=r"count/a.h5: attribute n_examples=5 but 'data' holds 4"):
        processor(str(tmp_path / "count"))
    write_h5(tmp_path / "shape" / "a.h5", make_samples(4, tag=0)[:, :2])
    with pytest.raises(DataError, match=r"shape/a.h5: 'data' is int32 of shape \[4, 2, 8\]"):
        processor(str(tmp_path / "shape"))
    write_h5(tmp_path / "zero" / "a.h5", make_samples(0, tag=0))
    with pytest.raises(DataError, match=r"data_dir '.*zero': its .h5 files hold no samples"):
        processor(str(tmp_path / "zero"))
    write_h5(tmp_path / "zero" / "b.h5", make_samples(4, tag=1))  # an empty file beside others is fine
    assert list(processor(str(tmp_path / "zero"), shuffle=False).global_batch(0)[0][:, 0]) == [
        100,
        101,
        102,
        103,
    ]
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no h5 here")
    with pytest.raises(DataError, match=r"no \*\.h5 files in data_dir .*empty"):
        processor(str(tmp_path / "empty"))


def test_an_out_of_range_id_is_found_while_reading_and_named(tmp_path: Path) -> None:
    data = make_samples(6, tag=0)
    data[4, 0, 2] = V  # an input id
    data[2, 2, 1] = V + 7  # a label that counts
    data[1, 2, T - 1] = V + 9  # a label under padding: never used, so never an error
    write_h5(tmp_path / "d" / "a.h5", data)
    p = processor(str(tmp_path / "d"), shuffle=False, batch_size=1, drop_last=False)  # opening reads no ids
    p.samples(np.array([0, 1, 3, 5]))
    with pytest.raises(DataError, match=rf"d/a.h5: sample 4, position 2: input id {V} is out of range .*{V}"):
        p.samples(np.array([4]))
    with pytest.raises(DataError, match=rf"d/a.h5: sample 2, position 1: label {V + 7} is out of range"):
        p.samples(np.array([2]))


class RecordingDataset:
    """Stands in for an h5py dataset and records every selection read from it."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds
        self.reads: list[Any] = []

    def __getitem__(self, key: Any) -> np.ndarray:
        self.reads.append(key)
        return self.ds[key]


def test_a_step_reads_only_its_own_rows(corpus) -> None:
    """A shard reads whole samples of exactly its rows, file by file; the global count reads only the
    attention masks of the global batch's rows."""
    d, _ = corpus
    p = processor(str(d), shuffle_seed=4)
    spies = [RecordingDataset(a) for a in p.datasets[0].arrays]
    p.datasets[0].arrays = spies

    def by_file(ids: np.ndarray) -> list[list[int]]:  # files of 5 and 7 samples
        return [sorted({int(i) - lo for i in ids if lo <= i < hi}) for lo, hi in ((0, 5), (5, 12))]

    p.shard(1, 1, 2)  # worker 1 of 2 at step 1
    want = by_file(p.sample_indices(1)[2:4])
    assert [[list(k) for k in s.reads] for s in spies] == [[r] if r else [] for r in want]
    for s in spies:
        s.reads.clear()
    p.global_tokens(1)
    want = by_file(p.sample_indices(1))
    got = [[(list(k[0]), k[1]) for k in s.reads] for s in spies]
    assert got == [[(r, 1)] if r else [] for r in want]


def test_shards_concatenate_to_the_global_batch_and_the_count_is_the_same_for_any_n(corpus) -> None:
    d, _ = corpus
    p = processor(str(d), shuffle_seed=9)
    for step in (0, 1, 5):
        x, y = p.global_batch(step)
        assert p.global_tokens(step) == np.count_nonzero(y >= 0) < y.size
        for n in (1, 2, 4):
            server = ActivationServer(p, None)
            parts = [server.batch("train", step, w, n) for w in range(n)]
            np.testing.assert_array_equal(np.concatenate([s[0] for s in parts]), x)
            np.testing.assert_array_equal(np.concatenate([s[1] for s in parts]), y)
            assert {s[2] for s in parts} == {p.global_tokens(step)}  # each shard carries the global count
            assert sum(np.count_nonzero(s[1] >= 0) for s in parts) == p.global_tokens(step)


def test_the_global_count_is_read_once_for_all_workers(corpus) -> None:
    d, _ = corpus
    p = processor(str(d))
    spies = [RecordingDataset(a) for a in p.datasets[0].arrays]
    p.datasets[0].arrays = spies
    first = p.global_tokens(2)
    reads = sum(len(s.reads) for s in spies)
    assert reads > 0
    assert [p.global_tokens(2) for _ in range(4)] == [first] * 4
    assert sum(len(s.reads) for s in spies) == reads


def test_a_batch_of_nothing_but_padding_counts_one_token(tmp_path: Path) -> None:
    data = make_samples(4, tag=0)
    data[:, 1] = 0
    write_h5(tmp_path / "d" / "a.h5", data)
    p = processor(str(tmp_path / "d"))
    assert (p.global_batch(0)[1] == -1).all() and p.global_tokens(0) == 1


def test_processors_without_masks_count_every_target(tmp_path: Path) -> None:
    """batch_size * T for language models, batch_size for fc_mlp: what the workers divided by before."""
    synthetic = InputParams(data_processor="SyntheticDataProcessor", batch_size=4, max_sequence_length=T)
    assert make_data_processor(synthetic, GPT2, "train").global_tokens(3) == 4 * T
    (tmp_path / "a.txt").write_text("byte-level text " * 20)
    text = InputParams(
        data_processor="TextFileDataProcessor", data_dir=str(tmp_path), batch_size=4, max_sequence_length=T
    )
    assert make_data_processor(text, GPT2, "train").global_tokens(3) == 4 * T
    mlp = FCMLPModelParams(name="fc_mlp", input_size=64, hidden_size=8, depth=1)
    for name in ("DigitsDataProcessor", "SyntheticDataProcessor"):
        assert (
            make_data_processor(InputParams(data_processor=name, batch_size=4), mlp, "train").global_tokens(3)
            == 4
        )


def test_the_count_cache_keeps_a_few_steps(corpus) -> None:
    d, _ = corpus
    p = processor(str(d))
    counts = [p.global_tokens(s) for s in range(40)]
    assert 0 < len(p._counts) <= 8  # not one entry per step of the run
    assert [p.global_tokens(s) for s in range(40)] == counts  # recounted when asked again


def test_llama_is_a_language_model_to_the_processors(tmp_path: Path) -> None:
    llama = LlamaModelParams(
        name="llama",
        vocab_size=50,
        hidden_size=8,
        num_hidden_layers=1,
        num_heads=2,
        filter_size=16,
        max_position_embeddings=T,
    )
    synthetic = InputParams(data_processor="SyntheticDataProcessor", batch_size=4, max_sequence_length=T)
    x, y = make_data_processor(synthetic, llama, "train").global_batch(0)
    assert x.shape == y.shape == (4, T) and x.max() < 50
    write_h5(tmp_path / "d" / "a.h5", make_samples(4, tag=1))  # first ids 100..103
    p = make_data_processor(inp(str(tmp_path / "d")), llama, "train")
    with pytest.raises(
        DataError, match=r"input id 10\d is out of range for model\.vocab_size=50"
    ):  # ids checked against llama's vocabulary
        p.global_batch(0)
