"""GPT-2 as streamable units: embedding, one unit per transformer block, final LayerNorm + tied head.

Exactly the Hugging Face ``GPT2LMHeadModel`` architecture (learned positions, pre-LayerNorm blocks, causal
multi-head attention, tanh-GELU MLP, biases, head tied to ``wte``) with its parameter names and its
Conv1D layout (weights stored [in, out]), so checkpoints load into ``transformers`` as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from weightstream.numerics.layers import (
    attention_backward,
    attention_forward,
    embedding_backward,
    gelu_backward,
    gelu_forward,
    layer_norm_backward,
    layer_norm_forward,
    linear_backward,
    linear_forward,
)
from weightstream.numerics.model import ModelDef, Params, ParamSpec

__all__ = ["GPT2Config", "build_gpt2"]

WTE = "transformer.wte.weight"
WPE = "transformer.wpe.weight"
LM_HEAD = "lm_head.weight"


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int  # MLP filter size, usually 4 * n_embd
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    tie_word_embeddings: bool = True


class EmbeddingUnit:
    """ids [B, T] -> x [B, T, C] = wte[ids] + wpe[:T]."""

    name = "embedding"
    param_names = (WTE, WPE)

    def forward(self, params: Params, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = ids.shape[1]
        x = params[WTE][ids]  # [B, T, C] (a gather, so already a fresh array)
        x += params[WPE][:t]
        return x, ids

    def backward(self, params: Params, ids: np.ndarray, dx: np.ndarray) -> tuple[None, dict[str, np.ndarray]]:
        t = ids.shape[1]
        dwpe = np.zeros_like(params[WPE])
        dwpe[:t] = dx.sum(axis=0)  # [T, C]
        return None, {WTE: embedding_backward(ids, dx, params[WTE].shape[0]), WPE: dwpe}


class BlockUnit:
    """One pre-LN transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)). [B, T, C] -> [B, T, C]."""

    def __init__(self, index: int, n_head: int, eps: float) -> None:
        self.name = f"h.{index}"
        self.prefix = p = f"transformer.h.{index}."
        self.n_head, self.eps = n_head, eps
        self.param_names = tuple(
            p + s
            for s in (
                "ln_1.weight",
                "ln_1.bias",
                "attn.c_attn.weight",
                "attn.c_attn.bias",
                "attn.c_proj.weight",
                "attn.c_proj.bias",
                "ln_2.weight",
                "ln_2.bias",
                "mlp.c_fc.weight",
                "mlp.c_fc.bias",
                "mlp.c_proj.weight",
                "mlp.c_proj.bias",
            )
        )

    def forward(self, params: Params, x: np.ndarray) -> tuple[np.ndarray, Any]:
        p = self.prefix
        h1, ln1 = layer_norm_forward(x, params[p + "ln_1.weight"], params[p + "ln_1.bias"], self.eps)
        qkv = linear_forward(h1, params[p + "attn.c_attn.weight"], params[p + "attn.c_attn.bias"])  # [B,T,3C]
        a, att = attention_forward(qkv, self.n_head)  # [B, T, C]
        del qkv  # attention kept q, k, v in head-major layout
        x1 = linear_forward(a, params[p + "attn.c_proj.weight"], params[p + "attn.c_proj.bias"])
        x1 += x  # residual 1
        h2, ln2 = layer_norm_forward(x1, params[p + "ln_2.weight"], params[p + "ln_2.bias"], self.eps)
        f = linear_forward(h2, params[p + "mlp.c_fc.weight"], params[p + "mlp.c_fc.bias"])  # [B, T, F]
        g, th = gelu_forward(f)
        y = linear_forward(g, params[p + "mlp.c_proj.weight"], params[p + "mlp.c_proj.bias"])
        y += x1  # residual 2
        return y, (ln1, h1, att, a, ln2, h2, f, th, g)

    def backward(
        self, params: Params, saved: Any, dy: np.ndarray
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        p = self.prefix
        ln1, h1, att, a, ln2, h2, f, th, g = saved
        grads: dict[str, np.ndarray] = {}
        # MLP branch
        dg, grads[p + "mlp.c_proj.weight"], grads[p + "mlp.c_proj.bias"] = linear_backward(
            g, params[p + "mlp.c_proj.weight"], dy
        )
        df = gelu_backward(f, th, dg)
        dh2, grads[p + "mlp.c_fc.weight"], grads[p + "mlp.c_fc.bias"] = linear_backward(
            h2, params[p + "mlp.c_fc.weight"], df
        )
        dx1, grads[p + "ln_2.weight"], grads[p + "ln_2.bias"] = layer_norm_backward(
            ln2, params[p + "ln_2.weight"], dh2
        )
        dx1 += dy  # residual 2
        # attention branch
        da, grads[p + "attn.c_proj.weight"], grads[p + "attn.c_proj.bias"] = linear_backward(
            a, params[p + "attn.c_proj.weight"], dx1
        )
        dqkv = attention_backward(att, da)
        dh1, grads[p + "attn.c_attn.weight"], grads[p + "attn.c_attn.bias"] = linear_backward(
            h1, params[p + "attn.c_attn.weight"], dqkv
        )
        dx, grads[p + "ln_1.weight"], grads[p + "ln_1.bias"] = layer_norm_backward(
            ln1, params[p + "ln_1.weight"], dh1
        )
        dx += dx1  # residual 1
        return dx, grads


class HeadUnit:
    """Final LayerNorm and the LM head: x [B, T, C] -> logits [B, T, V] = ln_f(x) @ E^T.

    E is ``wte`` when tied (its gradient here adds to the embedding unit's), else ``lm_head.weight``;
    both are [V, C] as in Hugging Face.
    """

    name = "head"

    def __init__(self, eps: float, tied: bool) -> None:
        self.eps = eps
        self.emb = WTE if tied else LM_HEAD
        self.param_names = ("transformer.ln_f.weight", "transformer.ln_f.bias", self.emb)

    def forward(self, params: Params, x: np.ndarray) -> tuple[np.ndarray, Any]:
        h, ln = layer_norm_forward(
            x, params["transformer.ln_f.weight"], params["transformer.ln_f.bias"], self.eps
        )
        logits = h @ params[self.emb].T  # [B, T, V]
        return logits, (ln, h)

    def backward(
        self, params: Params, saved: Any, dlogits: np.ndarray
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        ln, h = saved
        e = params[self.emb]  # [V, C]
        v, c = e.shape
        demb = dlogits.reshape(-1, v).T @ h.reshape(-1, c)  # [V, C]
        dh = dlogits @ e  # [B, T, C]
        dx, dgamma, dbeta = layer_norm_backward(ln, params["transformer.ln_f.weight"], dh)
        return dx, {"transformer.ln_f.weight": dgamma, "transformer.ln_f.bias": dbeta, self.emb: demb}


def build_gpt2(cfg: GPT2Config) -> ModelDef:
    c, f, std = cfg.n_embd, cfg.n_inner, cfg.initializer_range
    proj_std = std / math.sqrt(2 * cfg.n_layer)  # GPT-2's scaling of the residual projections
    specs = [
        ParamSpec(WTE, (cfg.vocab_size, c), "normal", std),
        ParamSpec(WPE, (cfg.n_positions, c), "normal", std),
    ]
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}."
        specs += [
            ParamSpec(p + "ln_1.weight", (c,), "ones"),
            ParamSpec(p + "ln_1.bias", (c,), "zeros"),
            ParamSpec(p + "attn.c_attn.weight", (c, 3 * c), "normal", std),
            ParamSpec(p + "attn.c_attn.bias", (3 * c,), "zeros"),
            ParamSpec(p + "attn.c_proj.weight", (c, c), "normal", proj_std),
            ParamSpec(p + "attn.c_proj.bias", (c,), "zeros"),
            ParamSpec(p + "ln_2.weight", (c,), "ones"),
            ParamSpec(p + "ln_2.bias", (c,), "zeros"),
            ParamSpec(p + "mlp.c_fc.weight", (c, f), "normal", std),
            ParamSpec(p + "mlp.c_fc.bias", (f,), "zeros"),
            ParamSpec(p + "mlp.c_proj.weight", (f, c), "normal", proj_std),
            ParamSpec(p + "mlp.c_proj.bias", (c,), "zeros"),
        ]
    specs += [
        ParamSpec("transformer.ln_f.weight", (c,), "ones"),
        ParamSpec("transformer.ln_f.bias", (c,), "zeros"),
    ]
    if not cfg.tie_word_embeddings:
        specs.append(ParamSpec(LM_HEAD, (cfg.vocab_size, c), "normal", std))
    units = (
        EmbeddingUnit(),
        *(BlockUnit(i, cfg.n_head, cfg.layer_norm_epsilon) for i in range(cfg.n_layer)),
        HeadUnit(cfg.layer_norm_epsilon, cfg.tie_word_embeddings),
    )
    return ModelDef("gpt2", units, {s.name: s for s in specs})
