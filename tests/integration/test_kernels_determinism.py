"""The fast kernels (numerics/_blocked.py, attention.py, the fused layers): bitwise the same whatever the
thread count and block size, their fused/blocked paths equal to the plain formulas, and freed activation
buffers reused without page faults."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from functools import partial

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

import weightstream.numerics._blocked as blocked
from tests.model_checks import digest_with_threads, step_digest
from weightstream.backends.environment import role_env
from weightstream.numerics import (
    GPT2Config,
    LlamaConfig,
    build_gpt2,
    build_llama,
    init_params,
)
from weightstream.numerics import attention as A
from weightstream.numerics import layers as L

# Big enough that every parallel path runs (row blocks over 2^18 elements, two product parts, several
# head groups) and the attention has several product blocks and softmax slabs (T = 272 > 256 > 128).
CFG = GPT2Config(vocab_size=512, n_positions=272, n_embd=256, n_layer=2, n_head=8, n_inner=1024)
B, T = 4, 272


def _digest() -> str:
    """One GPT-2 forward+backward (float32), digested."""
    ids = np.random.default_rng(5).integers(0, CFG.vocab_size, (B, T + 1))
    model = build_gpt2(CFG)
    return step_digest(model, init_params(model, seed=3), ids)


def _llama_digest() -> str:
    """One LLaMA step at sizes where its own parallel paths run too (grouped K/V over several row blocks,
    both biases)."""
    cfg = LlamaConfig(
        vocab_size=512,
        max_position_embeddings=T,
        hidden_size=256,
        num_layers=1,
        num_heads=8,
        num_kv_heads=2,
        intermediate_size=688,
        attention_bias=True,
        mlp_bias=True,
    )
    ids = np.random.default_rng(5).integers(0, cfg.vocab_size, (B, T + 1))
    model = build_llama(cfg)
    return step_digest(model, init_params(model, seed=3), ids)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_step_is_bitwise_the_same_whatever_the_thread_count(family: str) -> None:
    """WEIGHTSTREAM_NUM_THREADS (and BLAS's own pool, set alike as role_env does) change which thread
    computes what, never the bits: every partition is a function of the shapes only."""
    function = "_digest" if family == "gpt2" else "_llama_digest"
    digest = f"tests.integration.test_kernels_determinism:{function}"
    digests = {n: digest_with_threads(digest, n) for n in (1, 2, 3)}
    assert len(set(digests.values())) == 1, digests
    assert digest_with_threads(digest, 2) == digests[2]  # and a rerun


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_step_is_bitwise_the_same_whatever_the_block_size(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row blocks are whole rows and no reduction spans two, so the block size changes no bit."""
    digests = set()
    for elems in (1 << 12, 1 << 17, 1 << 22):
        monkeypatch.setattr(blocked, "_BLOCK_ELEMS", elems)
        digests.add(_digest() if family == "gpt2" else _llama_digest())
    assert len(digests) == 1


@pytest.mark.parametrize("t", [1, 5, 128, 129, 300])
def test_blocked_causal_attention_matches_torch(
    t: int, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sequence lengths around the product block (128) and the softmax slab (256), in float64, with the
    score buffers handed out full of inf: the blocks the products skip must be filled, not assumed 0
    (the test suite turns numpy's 'invalid value' warnings into errors)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(A, "_uninitialized", lambda shape, dtype: np.full(shape, np.inf, dtype=dtype))
    b, c, h = 2, 32, 4
    qkv = rng.standard_normal((b, t, 3 * c))
    dy = rng.standard_normal((b, t, c))
    ref = torch.tensor(qkv, requires_grad=True)
    q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in ref.split(c, dim=-1))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = out.transpose(1, 2).reshape(b, t, c)
    out.backward(torch.tensor(dy))
    y, saved = A.attention_forward(qkv.copy(), h)
    assert_allclose(y, out.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert_allclose(A.attention_backward(saved, dy), ref.grad.numpy(), rtol=1e-10, atol=1e-12)
    above = np.triu(np.ones((t, t), dtype=bool), k=1).T  # key-major: key after query
    assert (saved.p[:, :, above] == 0).all()


def test_fused_layer_norm_residual_gelu_match_plain_formulas(rng: np.random.Generator) -> None:
    n, c, f = 600, 96, 200
    h, res = rng.standard_normal((n, c)), rng.standard_normal((n, c))
    bias, gamma, beta = rng.standard_normal(c), 1 + 0.1 * rng.standard_normal(c), rng.standard_normal(c)
    eps = 1e-5

    def plain_ln(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        xhat = (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + eps)
        return xhat * gamma + beta, xhat

    x1, y, saved = L.add_layer_norm_forward(h.copy(), bias, res, gamma, beta, eps)
    assert_allclose(x1, h + bias + res, rtol=1e-14)
    assert_allclose(y, plain_ln(h + bias + res)[0], rtol=1e-12, atol=1e-12)

    dy = rng.standard_normal((n, c))
    xhat = plain_ln(h + bias + res)[1]
    dxhat = dy * gamma
    plain_dx = (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True)) * (
        1 / np.sqrt((h + bias + res).var(-1, keepdims=True) + eps)
    )
    dx, dgamma, dbeta = L.layer_norm_backward(saved, gamma, dy.copy(), residual=res)
    assert_allclose(dx, plain_dx + res, rtol=1e-10, atol=1e-12)
    assert_allclose(dgamma, (dy * xhat).sum(0), rtol=1e-10)
    assert_allclose(dbeta, dy.sum(0), rtol=1e-12)
    in_place = dy.copy()
    dx2, _, _ = L.layer_norm_backward(saved, gamma, in_place, residual=res, out=in_place)
    assert dx2 is in_place or np.shares_memory(dx2, in_place)
    assert_array_equal(dx2, dx)

    yy = rng.standard_normal((n, c))
    assert_allclose(L.add_bias_residual(yy.copy(), bias, res), yy + bias + res, rtol=1e-14)

    pre = rng.standard_normal((n, f)) * 2
    fb = rng.standard_normal(f)
    z = pre + fb
    th = np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3))
    plain_y = 0.5 * z * (1 + th)
    plain_d = 0.5 * (1 + th) + 0.5 * z * (1 - th**2) * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * z**2)
    buf = pre.copy()
    g, dgdz = L.gelu_forward(buf, fb, out=buf)
    assert np.shares_memory(g, buf)
    assert_allclose(g, plain_y, rtol=1e-12, atol=1e-14)
    assert_allclose(dgdz, plain_d, rtol=1e-10, atol=1e-14)
    dg = rng.standard_normal((n, f))
    assert_allclose(L.gelu_backward(None, dgdz, dg), dg * plain_d, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("m,k,n", [(300, 40, 700), (700, 40, 300), (50, 30, 20)])
def test_matmul_parts_bias_and_column_sums(
    m: int, k: int, n: int, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, bt = rng.standard_normal((k, m)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
    row_bias, col_bias = (
        rng.standard_normal((m, 1)).astype(np.float32),
        rng.standard_normal(n).astype(np.float32),
    )
    ref = a.T.astype(np.float64) @ bt.T.astype(np.float64)
    assert_allclose(blocked.matmul(a.T, bt.T), ref, rtol=1e-4, atol=1e-4)
    assert_allclose(blocked.matmul(a.T, bt.T, bias=row_bias), ref + row_bias, rtol=1e-4, atol=1e-4)
    assert_allclose(blocked.matmul(a.T, bt.T, bias=col_bias), ref + col_bias, rtol=1e-4, atol=1e-4)
    out = np.empty((m, n), dtype=np.float32)
    assert blocked.matmul(a.T, bt.T, out=out) is out
    c = rng.standard_normal((m, n)).astype(np.float32)
    sums = blocked.sum_rows(c)
    assert_allclose(sums, c.astype(np.float64).sum(axis=0), rtol=1e-4, atol=1e-4)
    assert_allclose(blocked.sum_rows(np.asfortranarray(c)), sums, rtol=1e-4, atol=1e-4)
    product = blocked.matmul(a.T, bt.T, bias=row_bias)
    monkeypatch.setattr(blocked, "THREADS", 1)  # the same parts, in turn on this thread: the same bits
    assert_array_equal(blocked.sum_rows(c), sums)
    assert_array_equal(blocked.matmul(a.T, bt.T, bias=row_bias), product)


_FAULTS_CHILD = textwrap.dedent(
    """
    import resource, sys, threading
    import numpy as np
    from weightstream.numerics._memory import retain_freed_memory
    retain_freed_memory()
    sizes = [25 << 20, 19 << 20, 6 << 20, 25 << 20, 6 << 20, 6 << 20, 25 << 20, 12 << 20]  # a block's worth
    def step():
        arrays = [np.ones(s // 4, dtype=np.float32) for s in sizes]  # touches every page
        del arrays
    def two_steps():
        step()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step()
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    if sys.argv[1] == "thread":  # as a worker computes: on a thread of its own, not the main one
        t = threading.Thread(target=two_steps)
        t.start()
        t.join()
    else:
        two_steps()
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_freed_activations_are_reused_without_page_faults() -> None:
    """A second step's activations come from the memory the first one freed: no fresh (zeroed) pages.
    Without retain_freed_memory glibc trims or unmaps them and the second step faults ~30k pages in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS_CHILD, "main"], env=env, capture_output=True, text=True, check=True
    )
    assert int(out.stdout) < 500


_TEMPORARIES_CHILD = textwrap.dedent(
    """
    import resource
    import numpy as np
    def step():  # MemoryX's optimizer: cache-sized temporaries, each freed before the next (no mallopt)
        for _ in range(100):
            a = np.ones(40_000, dtype=np.float32)
            b = a * 2.0
            del a, b
    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
@pytest.mark.parametrize(
    "child,args",
    [(_FAULTS_CHILD, ["thread"]), (_TEMPORARIES_CHILD, [])],
    ids=["worker-thread-activations", "memoryx-temporaries"],
)
def test_roles_reuse_freed_memory_under_the_role_environment(child: str, args: list[str]) -> None:
    """In a role's environment (backends/environment.py) freed memory is reused without page faults:
    - a block's activations on a thread other than the main one, as a worker computes: with more than one
      malloc arena the thread gets one of its own, whose heaps glibc unmaps once wholly free, and the
      second step faults them in again (~800 faults of mostly 2 MiB pages here);
    - 160 KB temporaries freed one after another, as MemoryX's optimizer makes them: with glibc's 128 KiB
      trim threshold each free gives the heap's top back and the next allocation faults it in (~4,600)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update({k: v for k, v in role_env("worker", 2).items() if k.startswith("MALLOC_")})
    out = subprocess.run(
        [sys.executable, "-c", child, *args], env=env, capture_output=True, text=True, check=True
    )
    assert int(out.stdout) < 100


def test_a_stalled_thread_does_not_hold_back_the_other_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_tasks`` hands out tasks one at a time: while one thread is stuck in a task (preempted, on a
    busy machine) the other takes every task left, instead of a fixed share of them waiting behind it.
    Every task runs exactly once."""
    import threading

    monkeypatch.setattr(blocked, "THREADS", 2)
    monkeypatch.setattr(blocked, "_pool", None)  # a pool of THREADS - 1 threads, whatever this machine has
    ran: list[tuple[int, int]] = []
    lock = threading.Lock()
    others_done = threading.Event()

    def task(i: int) -> None:
        if i == 0:  # the stalled one: until every other task has run (for good, were any behind it)
            others_done.wait(timeout=10)
        with lock:
            ran.append((i, threading.get_ident()))
            if sum(1 for j, _ in ran if j != 0) == 9:
                others_done.set()

    blocked.run_tasks([partial(task, i) for i in range(10)])
    assert sorted(i for i, _ in ran) == list(range(10))
    stalled = dict(ran)[0]
    assert all(t != stalled for i, t in ran if i != 0), "tasks waited behind the stalled thread"
    assert ran[-1][0] == 0  # everything else was done while it was stuck
