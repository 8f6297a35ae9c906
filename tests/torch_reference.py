"""Independent PyTorch references for the numerics tests (torch is a test-only dependency).

Written with ``torch.nn.functional`` from the same Hugging Face-named tensors, sharing no code with
weightstream's numpy implementation; where transformers has the function itself (RoPE's frequencies), its
own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from numpy.testing import assert_allclose


def to_torch(params: Mapping[str, np.ndarray], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {n: torch.tensor(np.asarray(v), dtype=dtype, requires_grad=True) for n, v in params.items()}


def gpt2_logits(
    p: Mapping[str, torch.Tensor], ids: torch.Tensor, n_layer: int, n_head: int, eps: float, tied: bool = True
) -> torch.Tensor:
    b, t = ids.shape
    x = p["transformer.wte.weight"][ids] + p["transformer.wpe.weight"][:t]
    c = x.shape[-1]
    for i in range(n_layer):
        q = f"transformer.h.{i}."
        h = F.layer_norm(x, (c,), p[q + "ln_1.weight"], p[q + "ln_1.bias"], eps)
        qkv = h @ p[q + "attn.c_attn.weight"] + p[q + "attn.c_attn.bias"]
        qq, kk, vv = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in qkv.split(c, dim=-1))
        a = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
        a = a.transpose(1, 2).reshape(b, t, c)
        x = x + a @ p[q + "attn.c_proj.weight"] + p[q + "attn.c_proj.bias"]
        h = F.layer_norm(x, (c,), p[q + "ln_2.weight"], p[q + "ln_2.bias"], eps)
        h = F.gelu(h @ p[q + "mlp.c_fc.weight"] + p[q + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ p[q + "mlp.c_proj.weight"] + p[q + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (c,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps)
    head = p["transformer.wte.weight"] if tied else p["lm_head.weight"]
    return x @ head.T


def _grad(t: torch.Tensor) -> np.ndarray:
    assert t.grad is not None, "backward reached no gradient to it"
    return t.grad.numpy()


def loss_and_grads(
    p: Mapping[str, torch.Tensor], logits: torch.Tensor, targets: np.ndarray
) -> tuple[float, dict[str, np.ndarray]]:
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.as_tensor(targets).reshape(-1).long())
    loss.backward()
    return loss.item(), {n: _grad(t) for n, t in p.items()}


def fc_mlp_logits(p: Mapping[str, torch.Tensor], x: torch.Tensor, depth: int) -> torch.Tensor:
    for i in range(depth):
        x = F.relu(F.linear(x, p[f"fc.{i}.weight"].T, p[f"fc.{i}.bias"]))
    return F.linear(x, p["head.weight"].T, p["head.bias"])


def assert_layer_matches_torch(
    make: Callable[[np.random.Generator, type], Sequence[np.ndarray]],
    np_fn: Callable[..., tuple[np.ndarray, Sequence[np.ndarray]]],
    torch_fn: Callable[..., torch.Tensor],
    dtype: type,
    rtol: float,
    atol: float,
    rng: np.random.Generator,
) -> None:
    """A layer's numpy forward/backward against torch autograd: ``make(rng, dtype)`` gives the inputs,
    ``np_fn(*inputs, dy)`` returns ``(y, grads of every input)``, ``torch_fn(*inputs)`` the output."""
    inputs = make(rng, dtype)
    ref_inputs = [torch.tensor(a.copy(), requires_grad=True) for a in inputs]
    ref_y = torch_fn(*ref_inputs)
    dy: np.ndarray = rng.standard_normal(ref_y.shape).astype(dtype)
    ref_y.backward(torch.tensor(dy))
    y, grads = np_fn(*[a.copy() for a in inputs], dy.copy())
    assert y.dtype == dtype and all(g.dtype == dtype for g in grads)
    assert_allclose(y, ref_y.detach().numpy(), rtol=rtol, atol=atol)
    for k, (g, ref) in enumerate(zip(grads, ref_inputs, strict=True)):
        assert_allclose(g, _grad(ref), rtol=rtol, atol=atol, err_msg=f"input {k}")


def hf_inv_freq(config: Any) -> np.ndarray:
    """transformers' own RoPE inverse frequencies for a ``LlamaConfig`` (float32, its dtype), from its
    ``ROPE_INIT_FUNCTIONS``: the reference for weightstream's RoPE scaling."""
    from transformers import modeling_rope_utils

    kind = config.rope_parameters["rope_type"]
    inv_freq, attention_factor = modeling_rope_utils.ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    assert attention_factor == 1.0  # linear and llama3 scale no cos/sin
    return inv_freq.numpy()
