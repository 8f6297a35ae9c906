"""Each initializer kind draws torch.nn.init's distribution (ModelZoo's truncation and fans), and draws it
deterministically from (seed, name), pinned so that no release silently changes a run's start. Which
tensors each params key initialises is test_initializers.py."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from weightstream.numerics import ParamSpec
from weightstream.numerics.init import Initializer, sample
from weightstream.numerics.model import init_tensor

torch = pytest.importorskip("torch", reason="pip install -e .[test]")


def _draw(init: Initializer, shape: tuple[int, ...], fans: tuple[int, int] | None = None) -> np.ndarray:
    return sample(init, shape, np.random.default_rng(0), fans)


def _torch_draw(fill: Any, shape: tuple[int, ...]) -> np.ndarray:
    """torch.nn.init's own draw on a tensor of ``shape`` in torch's layout: the reference."""
    torch.manual_seed(0)
    t = torch.empty(shape, dtype=torch.float64)
    fill(t)
    return t.numpy()


# --- each kind's distribution -----------------------------------------------------------------------------
BIG = (1000, 1000)


def test_normal_uniform_constant_statistics() -> None:
    w = _draw(Initializer("normal", mean=0.3, std=0.2), BIG)
    assert w.dtype == np.float32 and w.shape == BIG
    assert abs(w.mean() - 0.3) < 0.001 and abs(w.std() / 0.2 - 1) < 0.005
    u = _draw(Initializer("uniform", a=-0.1, b=0.3), BIG)
    assert u.min() >= np.float32(-0.1) and u.max() <= np.float32(0.3)
    assert abs(u.mean() - 0.1) < 0.001 and abs(u.std() / (0.4 / math.sqrt(12)) - 1) < 0.005
    assert (_draw(Initializer("constant", val=0.5), (3, 4)) == 0.5).all()
    assert (_draw(Initializer("ones"), (3,)) == 1).all() and (_draw(Initializer("zeros"), (3,)) == 0).all()


@pytest.mark.parametrize(
    ("mean", "std", "a", "b"),
    [
        (0.0, 0.02, -0.04, 0.04),  # Cerebras-GPT's: 2 std either side
        (0.01, 0.02, -0.03, 0.05),  # asymmetric, off-centre mean
        (0.0, 1.0, 1.5, 4.0),  # both bounds above the mean (drawn mirrored)
        (0.0, 1.0, -4.0, -1.5),  # both below
        (0.0, 1.0, 8.0, 9.0),  # far in the tail, where a CDF near 1 would have no precision left
    ],
)
def test_truncated_normal_stays_in_bounds_with_the_truncated_moments(
    mean: float, std: float, a: float, b: float
) -> None:
    """Bounds are absolute, as torch.nn.init.trunc_normal_'s; the moments are those of the normal
    truncated there (scipy's closed form)."""
    w = _draw(Initializer("truncated_normal", mean=mean, std=std, a=a, b=b), BIG).astype(np.float64)
    assert w.min() >= np.float32(a) and w.max() <= np.float32(b)
    ref = stats.truncnorm((a - mean) / std, (b - mean) / std, loc=mean, scale=std)
    assert abs(w.mean() - ref.mean()) < 5 * ref.std() / 1000
    assert abs(w.std() / ref.std() - 1) < 0.005
    if a < mean < b:  # torch's own draw too (in the tails its erfinv crawls, and it warns of imprecision)
        t = _torch_draw(lambda x: torch.nn.init.trunc_normal_(x, mean=mean, std=std, a=a, b=b), BIG)
        assert abs(w.std() / t.std() - 1) < 0.01


SHAPE = (300, 700)  # torch layout [out, in]: fan_in 700, fan_out 300
FAN_KINDS = [
    (Initializer("xavier_normal", gain=1.5), lambda t: torch.nn.init.xavier_normal_(t, gain=1.5)),
    (Initializer("xavier_uniform", gain=2.0), lambda t: torch.nn.init.xavier_uniform_(t, gain=2.0)),
    (
        Initializer("kaiming_normal", a=0.2, mode="fan_out"),
        lambda t: torch.nn.init.kaiming_normal_(t, a=0.2, mode="fan_out"),
    ),
    (
        Initializer("kaiming_uniform", a=0.5, mode="fan_in", nonlinearity="relu"),  # relu ignores a
        lambda t: torch.nn.init.kaiming_uniform_(t, a=0.5, mode="fan_in", nonlinearity="relu"),
    ),
    (
        Initializer("kaiming_uniform", a=0.5, mode="fan_out"),
        lambda t: torch.nn.init.kaiming_uniform_(t, a=0.5, mode="fan_out"),
    ),
    # ModelZoo's variance_scaling_ recipe, written with torch: fan_avg = 500, variance = 2 / 500
    (
        Initializer("variance_scaling", scale=2.0, mode="fan_avg", distribution="normal"),
        lambda t: t.normal_(std=math.sqrt(2.0 / 500)),
    ),
    (
        Initializer("variance_scaling", scale=3.0, mode="fan_out", distribution="uniform"),
        lambda t: t.uniform_(-math.sqrt(3 * 3.0 / 300), math.sqrt(3 * 3.0 / 300)),
    ),
    (  # lecun_normal: fan_in, truncated normal with torch's default bounds -2, 2
        Initializer("variance_scaling"),
        lambda t: torch.nn.init.trunc_normal_(t, std=math.sqrt(1.0 / 700) / 0.87962566103423978),
    ),
]


@pytest.mark.parametrize(("init", "fill"), FAN_KINDS, ids=lambda v: getattr(v, "kind", ""))
def test_fan_based_kinds_match_torch_for_the_same_shape(init: Initializer, fill: Any) -> None:
    """Same spread as torch.nn.init on a [out, in] tensor of the same shape: fan_in is the second dim."""
    ours, theirs = _draw(init, SHAPE).astype(np.float64), _torch_draw(fill, SHAPE)
    assert abs(ours.mean()) < 5 * theirs.std() / math.sqrt(ours.size)
    assert abs(ours.std() / theirs.std() - 1) < 0.01
    if init.kind.endswith("uniform") or init.distribution == "uniform":  # the bound itself
        assert abs(np.abs(ours).max() / np.abs(theirs).max() - 1) < 0.002


def test_variance_scaling_truncates_at_two_absolute_as_modelzoo() -> None:
    """ModelZoo's truncated variance_scaling keeps trunc_normal_'s default bounds, -2 and 2 absolute: at a
    large std that cuts (a std of 2 std-units would cut at 1)."""
    shape = (250_000, 4)  # fan_in 4: variance = scale / 4
    init = Initializer("variance_scaling", scale=8.0)  # std sqrt(2) / 0.88 = 1.61 before the cut
    ours = _draw(init, shape).astype(np.float64)
    std = math.sqrt(2.0) / 0.87962566103423978
    theirs = _torch_draw(lambda t: torch.nn.init.trunc_normal_(t, std=std), shape)
    assert ours.min() >= -2 and ours.max() <= 2 and ours.max() > 1.99
    assert abs(ours.std() / theirs.std() - 1) < 0.005


# --- determinism ------------------------------------------------------------------------------------------
KINDS = [
    Initializer("normal", mean=0.1, std=0.02),
    Initializer("truncated_normal", std=0.02, a=-0.04, b=0.04),
    Initializer("uniform", a=-1, b=1),
    Initializer("xavier_uniform"),
    Initializer("kaiming_normal"),
    Initializer("variance_scaling"),
]


@pytest.mark.parametrize("init", KINDS, ids=lambda i: i.kind)
def test_each_kind_is_deterministic_in_seed_and_name(init: Initializer) -> None:
    """(1 << 20) + 5 elements: the truncated normal's chunked pass crosses a chunk boundary."""
    spec = ParamSpec("h.0.w", (1025, 1023), init)
    a, b = init_tensor(spec, seed=3), init_tensor(spec, seed=3)
    assert a.tobytes() == b.tobytes()
    assert not np.array_equal(a, init_tensor(spec, seed=4))
    assert not np.array_equal(a, init_tensor(ParamSpec("h.1.w", spec.shape, init), seed=3))


def test_draws_are_pinned() -> None:
    """The same numbers on every machine and every release: a change of algorithm would silently change
    every run's start."""
    got: dict[str, str] = {
        init.kind: hashlib.sha256(init_tensor(ParamSpec("w", (64, 48), init), seed=1).tobytes()).hexdigest()
        for init in KINDS[:3]
    }
    # more than one chunk of the truncated normal's float64 pass
    big = init_tensor(ParamSpec("w", (1025, 1023), KINDS[1]), seed=1)
    got["truncated_normal, 2 chunks"] = hashlib.sha256(big.tobytes()).hexdigest()
    assert got == PINNED


PINNED = {
    "normal": "d4dc0c04dcea781f14582fbce4eb0f70e4a16857ab5ce951a148691a222f0e22",
    "truncated_normal": "cf2da43a6bacd9ce1773a29c9e44b85e910fa45db4b8c3eacf5f8bfd1352d022",
    "uniform": "7b68c702c3a8ac6c7edebdfc8e8edd77b6755ef46352afbe29ab1303b88fad03",
    "truncated_normal, 2 chunks": "f174172899ef0bf9fd12fe5afe90aeefecdfadb5b86da5457b1fd2aa758cc472",
}
