"""Independent PyTorch references for the numerics tests (torch is a test-only dependency).

Written with ``torch.nn.functional`` from the same Hugging Face-named tensors, sharing no code with
weightstream's numpy implementation.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F


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


def loss_and_grads(
    p: Mapping[str, torch.Tensor], logits: torch.Tensor, targets: np.ndarray
) -> tuple[float, dict[str, np.ndarray]]:
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.as_tensor(targets).reshape(-1).long())
    loss.backward()
    return loss.item(), {n: t.grad.numpy() for n, t in p.items()}


def fc_mlp_logits(p: Mapping[str, torch.Tensor], x: torch.Tensor, depth: int) -> torch.Tensor:
    for i in range(depth):
        x = F.relu(F.linear(x, p[f"fc.{i}.weight"].T, p[f"fc.{i}.bias"]))
    return F.linear(x, p["head.weight"].T, p["head.bias"])
