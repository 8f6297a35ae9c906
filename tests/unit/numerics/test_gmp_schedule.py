"""gmp's schedules (numerics/sparsity_schedule.py) step for step against cerebras.pytorch 2.10's own.

The references transcribe ``cerebras/pytorch/sparse/utils.py`` op for op with torch: the level classes
(``Linear``, ``Exp``, ``Power``, ``Cosine``) on float32 0-dim tensors with an int64 step, clamped as
``DynamicSparsityAlgorithm.update`` clamps them; ``FreqSchedule``/``ListSchedule`` on int64 steps; the
count of ``make_mask_topk_sparsity``. numpy's exp/pow/cos may round differently from torch's, so a level
must lie within what the formula gives with torch's transcendental moved by one float32 ulp either way
(near a level of 0, ``1 - exp`` cancels and one ulp of exp is many of the level), and most levels must be
bitwise equal.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from weightstream.numerics.sparse_masks import SparsitySpec, kept_count, kept_entries
from weightstream.numerics.sparsity_schedule import LevelSchedule, UpdateSchedule, gmp_kept, largest_positions

torch = pytest.importorskip(
    "torch", reason="torch==2.13.0 (CPU) is the test reference: pip install -e .[test]"
)

# steps: every one of a run's first 1500 updates, and a few far ones (2**24 + 1 is not a float32)
STEPS = [*range(1500), 4096, 10_007, 65_537, 1_000_003, 2**24 + 1, 30_000_000]
EXACT_SHARE = 0.9  # levels bitwise equal to torch's, at least


def _cerebras_level(kind: str, k: dict[str, float], step: int) -> Any:
    """The clamped level at ``step``, as a 3-vector: the formula with torch's transcendental moved one
    float32 ulp down, as is, and one ulp up (every later op is monotone in it, and so is rounding)."""
    s = torch.tensor(step, dtype=torch.int64)  # DynamicSparsityAlgorithm.step
    if kind == "linear":
        return torch.clamp(torch.tensor(k["init"]) + s * torch.tensor(k["slope"]), min=0.0, max=1.0).expand(3)
    if kind == "exp":
        final = torch.tensor(k.get("final", 1.0))
        scale = final - torch.tensor(k["init"])
        t = torch.exp(s * torch.tensor(k["gamma"]))
    elif kind == "power":
        t = torch.pow(torch.tensor(k["beta"]), s)
    else:
        o = (k.get("minimum", 0.0) + k["init"]) / 2  # Python floats, as Cosine.__init__ computes them
        amp, offset = torch.tensor(k["init"] - o), torch.tensor(o)
        t = torch.cos(s * torch.tensor(torch.pi / k["half_period"]))
    ts = torch.stack(
        [torch.nextafter(t, torch.tensor(-math.inf)), t, torch.nextafter(t, torch.tensor(math.inf))]
    )
    if kind == "exp":
        v = final - scale * ts
    elif kind == "power":
        v = torch.tensor(k["init"]) * ts
    else:
        v = amp * ts + offset
    return torch.clamp(v, min=0.0, max=1.0)


def _check_level(kind: str, k: dict[str, float]) -> None:
    ref = np.stack([_cerebras_level(kind, k, s).numpy() for s in STEPS])  # [S, 3]: down, as is, up
    ours = np.array([LevelSchedule(kind, **k).at(s) for s in STEPS])  # type: ignore[arg-type]
    assert ours.dtype == np.float32
    outside = [(s, o, r[1]) for s, o, r in zip(STEPS, ours, ref, strict=True) if not r.min() <= o <= r.max()]
    assert not outside, (
        f"{kind} {k}: more than 1 ulp of the transcendental off (step, ours, torch's): {outside[:5]}"
    )
    share = float(np.mean(ours == ref[:, 1]))
    assert share >= EXACT_SHARE, f"{kind} {k}: only {share:.1%} of levels equal torch's bitwise"


def test_linear_levels_are_cerebras_bitwise() -> None:
    for k in ({"init": 0.0, "slope": 1e-3}, {"init": 0.3, "slope": 7e-4}, {"init": 0.9, "slope": -1e-3}):
        ref = np.stack([_cerebras_level("linear", k, s).numpy()[1] for s in STEPS])
        ours = np.array([LevelSchedule("linear", **k).at(s) for s in STEPS])
        np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize(
    "kind,k",
    [
        ("exp", {"init": 0.0, "gamma": -0.0013}),  # numpy's float32 exp fails this one: 76% bitwise
        ("exp", {"init": 0.2, "gamma": -0.01, "final": 0.9}),
        ("exp", {"init": 0.5, "gamma": -0.5, "final": 0.95}),
        ("power", {"init": 0.9, "beta": 0.999}),  # and numpy's float32 pow these two
        ("power", {"init": 1.0, "beta": 0.9993}),
        ("power", {"init": 0.3, "beta": 1.002}),
        ("cosine", {"init": 0.9, "half_period": 300.0}),
        ("cosine", {"init": 0.8, "half_period": 77.0, "minimum": 0.3}),
        ("cosine", {"init": 0.5, "half_period": 12.5, "minimum": 0.1}),
    ],
    ids=lambda x: x if isinstance(x, str) else "-".join(f"{a}={b}" for a, b in x.items()),
)
def test_levels_are_cerebras_within_one_ulp_of_the_transcendental(kind: str, k: dict[str, float]) -> None:
    _check_level(kind, k)


def test_infinite_levels_clamp_and_nan_levels_are_refused() -> None:
    """float32 overflow gives +-inf, which torch.clamp takes to 1 or 0; 0 * inf gives NaN, which would
    count no entries (int(NaN)), so it is refused naming the step."""
    clamped = [
        ("linear", {"init": 0.5, "slope": 1e38}, 10, 1.0),
        ("linear", {"init": 0.5, "slope": -1e38}, 10, 0.0),
        ("exp", {"init": 0.0, "gamma": 100.0}, 1, 0.0),  # 1 - exp(100): -inf
        ("power", {"init": 0.5, "beta": 1e30}, 2, 1.0),  # 1e60: inf in float32
    ]
    for kind, k, step, want in clamped:
        assert _cerebras_level(kind, k, step)[1].item() == want
        assert LevelSchedule(kind, **k).at(step) == np.float32(want)  # type: ignore[arg-type]
    nan = [
        ("power", {"init": 0.0, "beta": 1e30}, 2),  # 0 * inf
        ("exp", {"init": 1.0, "gamma": 100.0, "final": 1.0}, 1),  # 1 - 0 * inf
    ]
    for kind, k, step in nan:
        assert torch.isnan(_cerebras_level(kind, k, step)[1])
        schedule = LevelSchedule(kind, **k)  # type: ignore[arg-type]
        assert schedule.at(0) == np.float32(k["init"])  # finite before it overflows
        with pytest.raises(ValueError, match=f"NaN at step {step}"):
            schedule.at(step)


def test_schedules_refuse_what_they_cannot_compute() -> None:
    with pytest.raises(ValueError, match="half_period other than 0"):
        LevelSchedule("cosine", 0.5, half_period=0.0)  # pi / 0
    with pytest.raises(ValueError, match="must be one of"):
        LevelSchedule("cycling", 0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 1"):
        UpdateSchedule(freq=0)  # step % 0


def test_kept_counts_are_make_mask_topk_sparsitys() -> None:
    numels = [1, 7, 1000, 49_152, 2**24 - 1, 2**24 + 1, 2**24 + 3, 3 * 2**24 + 5, 2**30 + 12_345]
    rng = np.random.default_rng(0)
    levels = np.concatenate(
        [
            np.array([0.0, 1.0, 0.5, 0.1, 0.6, 0.9, 0.99, 1 / 3], dtype=np.float32),
            np.nextafter(np.array([0.0, 1.0], np.float32), 0.5),  # the smallest level, the largest below 1
            rng.random(40, dtype=np.float32),
        ]
    )
    for numel in numels:
        ref = ((1 - torch.from_numpy(levels)) * torch.tensor(numel, dtype=torch.float)).int()  # int32
        ours = [gmp_kept(numel, lv) for lv in levels]
        assert ours == ref.tolist(), numel
        assert (
            gmp_kept(numel, np.float32(0.0)) == int(np.float32(numel))
            and gmp_kept(numel, np.float32(1.0)) == 0
        )


UPDATES = [
    UpdateSchedule(freq, start, stop)
    for freq in (1, 2, 3, 7)
    for start in (0, 1, 5)
    for stop in (None, 1, 4, 10, 50)
] + [UpdateSchedule(steps=s) for s in ((0,), (3,), (0, 3, 6), (10, 5, 100, 7), (4, 4), (250,))]


def _cerebras_is_update(u: UpdateSchedule, step: Any) -> Any:
    """FreqSchedule / ListSchedule.is_update_step on an int64 tensor of steps."""
    if u.steps is not None:
        is_update = torch.zeros_like(step, dtype=torch.bool)
        for s in u.steps:
            is_update |= step == s
        return is_update
    check = step - u.start if u.start else step
    is_update = check % u.freq == 0
    if u.start:
        is_update &= step >= u.start
    if u.stop is not None:
        is_update &= step < u.stop
    return is_update


@pytest.mark.parametrize("u", UPDATES, ids=str)
def test_update_steps_are_freq_and_list_schedules(u: UpdateSchedule) -> None:
    steps = torch.arange(201, dtype=torch.int64)
    ours = [u.is_update(s) for s in range(201)]
    assert ours == _cerebras_is_update(u, steps).tolist()
    for max_steps in range(201):
        due = [s for s in range(max_steps + 1) if ours[s]]
        assert u.last_update(max_steps) == (due[-1] if due else None), max_steps
        assert u.update_steps(max_steps).tolist() == due, max_steps  # what validation checks the levels at
        for first in (1, 7, 50):  # in chunks, as validation goes through a long run
            assert u.update_steps(max_steps, first).tolist() == [s for s in due if s >= first], (
                max_steps,
                first,
            )


def _brute_largest(w: np.ndarray, kept: int) -> list[int]:
    flat = w.reshape(-1).tolist()
    return sorted(sorted(range(len(flat)), key=lambda i: (-abs(flat[i]), i))[:kept])


def test_largest_positions_rank_magnitudes_ties_low_zeros_last() -> None:
    rng = np.random.default_rng(1)
    for shape, zeros in (((4, 6), 0.0), ((8, 16), 0.5), ((3, 40), 0.9)):
        # few distinct magnitudes of both signs: ties everywhere; pruned entries are exact zeros
        w = rng.integers(-3, 4, size=shape).astype(np.float32)
        w[rng.random(shape) < zeros] = 0.0
        for kept in range(w.size + 1):
            got = largest_positions(w, kept)
            assert got.dtype == np.int64 and np.all(np.diff(got) > 0)
            assert got.tolist() == _brute_largest(w, kept), (shape, kept)
    w = np.array([[0.0, -5.0, 0.0, 2.0], [-2.0, 0.0, 1.0, 0.0]], np.float32)
    assert largest_positions(w, 3).tolist() == [1, 3, 4]  # |-5|, then 2 and -2: the tie to position 3
    assert largest_positions(w, 5).tolist() == [0, 1, 3, 4, 6]  # every non-zero, then the first zero


def test_a_dynamic_spec_counts_and_updates_by_its_schedules() -> None:
    level = LevelSchedule("linear", 0.0, 0.1)
    update = UpdateSchedule(freq=3, start=1, stop=8)
    spec = SparsitySpec(0.6, "random", 0, level, update)
    assert spec.dynamic and not SparsitySpec(0.6).dynamic
    assert [spec.due(s) for s in range(10)] == [update.is_update(s) for s in range(10)]
    assert [s for s in range(10) if spec.due(s)] == [1, 4, 7]
    assert not SparsitySpec(0.6).due(1)
    assert spec.kept_at(1000, 4) == gmp_kept(1000, level.at(4)) == 600
    # a dynamic spec's first mask counts in float32, as its later ones: 0.6 of 1000 keeps 399, not 400
    assert kept_entries((10, 100), spec) == 399 and kept_count(1000, 0.6) == 400
    balanced = SparsitySpec(0.6, "balanced-topk", 0, level, update)
    assert kept_entries((10, 100), balanced) == 10 * gmp_kept(100, np.float32(0.6)) == 390
    assert kept_entries((10, 100), SparsitySpec(1.0, "topk", 0, level, update)) == 0  # a level may reach 1
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        SparsitySpec(1.0)
    with pytest.raises(ValueError, match="both a level schedule and an update schedule"):
        SparsitySpec(0.5, "random", 0, level, None)
    with pytest.raises(ValueError, match="both a level schedule and an update schedule"):
        SparsitySpec(0.5, "random", 0, None, update)
