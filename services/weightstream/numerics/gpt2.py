"""GPT-2 as streamable units: embedding, one unit per transformer block, final LayerNorm + tied head.

Exactly the Hugging Face ``GPT2LMHeadModel`` architecture (learned positions, pre-LayerNorm blocks, causal
multi-head attention, tanh-GELU MLP, biases, head tied to ``wte``) with its parameter names and its
Conv1D layout (weights stored [in, out]), so checkpoints load into ``transformers`` as they are.

Dropout is Hugging Face's ``embd_pdrop`` (``embedding_dropout_rate``: on wte + wpe), ``resid_pdrop``
(``dropout_rate``: on each block's two projections, bias included, before their residual adds) and
``attn_pdrop`` (``attention_dropout_rate``: on the attention probabilities, see attention.py), active only
under a ``dropout.dropout_scope`` (see dropout.py). Each site is named after its Hugging Face module
(``transformer.h.3.attn.resid_dropout``, ``transformer.h.3.attn.attn_dropout``), which seeds its masks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from weightstream.numerics._blocked import matmul, single_threaded_blas, sum_rows
from weightstream.numerics._memory import retain_freed_memory
from weightstream.numerics.attention import attention_backward_t, attention_forward_t
from weightstream.numerics.dropout import (
    dropout_add_bias_residual,
    dropout_backward,
    dropout_forward,
    dropout_mask,
)
from weightstream.numerics.init import Initializer
from weightstream.numerics.layers import (
    add_bias_residual,
    add_layer_norm_forward,
    embedding_backward,
    gelu_backward_sum,
    gelu_forward,
    layer_norm_backward,
    layer_norm_forward,
    linear_backward,
    linear_forward,
)
from weightstream.numerics.model import ModelDef, Params, ParamSpec, Unit, weight_spec
from weightstream.numerics.sparse import matmul_any, weight_grad

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
    dropout_rate: float = 0.0  # Hugging Face's resid_pdrop
    embedding_dropout_rate: float = 0.0  # Hugging Face's embd_pdrop
    attention_dropout_rate: float = 0.0  # Hugging Face's attn_pdrop
    activation: Literal["gelu_new", "gelu"] = "gelu_new"  # Hugging Face's activation_function: tanh or erf
    # ModelZoo's initializer keys (init.py), None where left out: ModelZoo's default, normal(0,
    # initializer_range) cut at 2 std, the two c_proj's (without either key) scaled by 1/sqrt(2 n_layer).
    # initializer: c_attn and c_fc, and the two c_proj unless output_layer_initializer is given (then
    # unscaled, as ModelZoo); embedding_initializer: wte and wpe
    initializer: Initializer | None = None
    embedding_initializer: Initializer | None = None
    output_layer_initializer: Initializer | None = None

    def __post_init__(self) -> None:
        for name in ("dropout_rate", "embedding_dropout_rate", "attention_dropout_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate < 1.0:  # also refuses NaN
                raise ValueError(f"GPT2Config.{name} must be in [0, 1) (got {rate!r})")


class EmbeddingUnit:
    """ids [B, T] -> x [B, T, C] = dropout(wte[ids] + wpe[:T])."""

    name = "embedding"
    param_names = (WTE, WPE)
    dropout_site = "transformer.drop"

    def __init__(self, dropout_rate: float = 0.0) -> None:
        self.dropout_rate = dropout_rate

    def forward(self, params: Params, ids: np.ndarray) -> tuple[np.ndarray, Any]:
        t = ids.shape[1]
        x = params[WTE][ids]  # [B, T, C] (a gather, so already a fresh array)
        x += params[WPE][:t]
        mask = dropout_mask(self.dropout_site, x.shape, self.dropout_rate)  # [B, T, C] bool or None
        if mask is not None:
            dropout_forward(x, mask, self.dropout_rate, out=x)
        return x, (ids, mask)

    def backward(self, params: Params, saved: Any, dx: np.ndarray) -> tuple[None, dict[str, np.ndarray]]:
        ids, mask = saved
        if mask is not None:  # into a fresh array: dx belongs to the caller
            dx = dropout_backward(dx, mask, self.dropout_rate)
        t = ids.shape[1]
        dwpe = np.zeros_like(params[WPE])
        dwpe[:t] = dx.sum(axis=0)  # [T, C]
        return None, {WTE: embedding_backward(ids, dx, params[WTE].shape[0]), WPE: dwpe}


class BlockUnit:
    """One pre-LN transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)). [B, T, C] -> [B, T, C]."""

    def __init__(
        self,
        index: int,
        n_head: int,
        eps: float,
        dropout_rate: float = 0.0,
        exact_gelu: bool = False,
        attention_dropout_rate: float = 0.0,
    ) -> None:
        self.name = f"h.{index}"
        self.prefix = p = f"transformer.h.{index}."
        self.n_head, self.eps, self.dropout_rate, self.exact_gelu = n_head, eps, dropout_rate, exact_gelu
        self.attn_dropout_site, self.mlp_dropout_site = p + "attn.resid_dropout", p + "mlp.dropout"
        self.attention_dropout_rate, self.probs_dropout_site = attention_dropout_rate, p + "attn.attn_dropout"
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
        w = {name[len(self.prefix) :]: params[name] for name in self.param_names}
        b, t, c = x.shape
        n = b * t
        retain_freed_memory()  # once per process: see _memory
        with single_threaded_blas():  # one switch for the whole block (see _blocked)
            h1, ln1 = layer_norm_forward(x, w["ln_1.weight"], w["ln_1.bias"], self.eps)
            # Attention runs feature-major (see attention.py): c_attn writes qkv_t [3C, N] = W^T h1^T
            # directly, bias added by each product part, and c_proj reads y_t [C, N] transposed.
            qkv_t = matmul_any(
                w["attn.c_attn.weight"].T, h1.reshape(n, c).T, bias=w["attn.c_attn.bias"][:, None]
            )
            rate = self.attention_dropout_rate  # on the probabilities: a mask [B, H, keys, queries] or None
            m_probs = dropout_mask(self.probs_dropout_site, (b, self.n_head, t, t), rate)
            a_t, att = attention_forward_t(qkv_t, b, self.n_head, keep=m_probs, rate=rate)  # [C, N]
            # The other three biases are added by the elementwise pass that follows each product.
            x1 = matmul_any(a_t.T, w["attn.c_proj.weight"]).reshape(b, t, c)
            m_attn = dropout_mask(self.attn_dropout_site, x1.shape, self.dropout_rate)  # [B, T, C] or None
            if m_attn is None:
                x1, h2, ln2 = add_layer_norm_forward(  # x1 = attn + bias + x (residual 1), h2 = ln_2(x1)
                    x1, w["attn.c_proj.bias"], x, w["ln_2.weight"], w["ln_2.bias"], self.eps
                )
            else:  # the mask goes between the bias and the residual, so the add cannot ride ln_2's pass
                dropout_add_bias_residual(x1, w["attn.c_proj.bias"], m_attn, self.dropout_rate, x)
                h2, ln2 = layer_norm_forward(x1, w["ln_2.weight"], w["ln_2.bias"], self.eps)
            f = linear_forward(h2, w["mlp.c_fc.weight"], None)  # [B, T, F]
            g, dgdf = gelu_forward(f, w["mlp.c_fc.bias"], out=f, exact=self.exact_gelu)  # g over f; dg/df
            y = linear_forward(g, w["mlp.c_proj.weight"], None)
            m_mlp = dropout_mask(self.mlp_dropout_site, y.shape, self.dropout_rate)  # [B, T, C] or None
            if m_mlp is None:
                add_bias_residual(y, w["mlp.c_proj.bias"], x1)  # residual 2
            else:
                dropout_add_bias_residual(y, w["mlp.c_proj.bias"], m_mlp, self.dropout_rate, x1)
        return y, (ln1, h1, att, a_t, ln2, h2, dgdf, g, m_attn, m_mlp)

    def backward(
        self, params: Params, saved: Any, dy: np.ndarray
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Consumes ``saved``: each gradient is written over a saved activation at its last use, so
        backward faults in no activation-sized buffer of its own (with dropout on, one [B, T, C]: the
        projections' gradients through their masks)."""
        w = {name[len(self.prefix) :]: params[name] for name in self.param_names}
        ln1, h1, att, a_t, ln2, h2, dgdf, g, m_attn, m_mlp = saved
        b, t, c = dy.shape
        n = b * t
        grads: dict[str, np.ndarray] = {}
        with single_threaded_blas():
            # MLP branch. Through dropout the projection sees dy * mask / (1 - p), in a buffer of its own:
            # dy itself still flows around the branch (residual 2).
            dproj = dy if m_mlp is None else dropout_backward(dy, m_mlp, self.dropout_rate)  # [B, T, C]
            dg, grads["mlp.c_proj.weight"], grads["mlp.c_proj.bias"] = linear_backward(
                g, w["mlp.c_proj.weight"], dproj, dx_out=g
            )
            df, dfc_bias = gelu_backward_sum(dgdf, _present(dg), out=dg)  # + c_fc's bias gradient
            dh2, grads["mlp.c_fc.weight"], grads["mlp.c_fc.bias"] = linear_backward(
                h2, w["mlp.c_fc.weight"], df, dx_out=h2, db=dfc_bias
            )
            dx1, grads["ln_2.weight"], grads["ln_2.bias"] = layer_norm_backward(
                ln2,
                w["ln_2.weight"],
                _present(dh2),
                residual=dy,
                out=dh2,  # + dy: residual 2
            )
            # attention branch, feature-major like its forward. Through dropout the projection sees
            # dx1 * mask / (1 - p), written over dproj (dead since the MLP projection's backward; dy is the
            # caller's, never written): dx1 itself still flows around the branch (residual 1).
            if m_attn is not None:
                dx1_spare = None if dproj is dy else dproj
                dproj = dropout_backward(dx1, m_attn, self.dropout_rate, out=dx1_spare)
            else:
                dproj = dx1
            dproj_2 = dproj.reshape(n, c)
            grads["attn.c_proj.weight"] = weight_grad(a_t.T, dproj_2, w["attn.c_proj.weight"])  # [C, C]
            grads["attn.c_proj.bias"] = sum_rows(dproj_2)
            da_t = matmul_any(w["attn.c_proj.weight"], dproj_2.T, out=ln2.xhat.reshape(c, n))  # xhat is dead
            spare = dgdf.reshape(-1)  # dead since gelu_backward: [N, F] holds [3C, N] when F >= 3C
            dqkv_t = attention_backward_t(
                att, da_t, out=spare[: 3 * c * n].reshape(3 * c, n) if spare.size >= 3 * c * n else None
            )
            h1_2 = h1.reshape(n, c)
            grads["attn.c_attn.weight"] = weight_grad(h1_2, dqkv_t.T, w["attn.c_attn.weight"])  # [C, 3C]
            grads["attn.c_attn.bias"] = sum_rows(dqkv_t.T)
            dh1 = matmul_any(dqkv_t.T, w["attn.c_attn.weight"].T, out=h1_2).reshape(b, t, c)  # h1 is dead
            dx, grads["ln_1.weight"], grads["ln_1.bias"] = layer_norm_backward(
                ln1,
                w["ln_1.weight"],
                dh1,
                residual=dx1,
                out=dh1,  # + dx1: residual 1
            )
        return dx, {self.prefix + k: v for k, v in grads.items()}


def _present(a: np.ndarray | None) -> np.ndarray:
    if a is None:
        raise AssertionError("linear_backward returns dx when need_dx")
    return a


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
        e = params[self.emb]  # [V, C]
        logits = matmul(h.reshape(-1, e.shape[1]), e.T).reshape(*h.shape[:-1], e.shape[0])  # [B, T, V]
        return logits, (ln, h)

    def backward(
        self, params: Params, saved: Any, dlogits: np.ndarray
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        ln, h = saved
        e = params[self.emb]  # [V, C]
        v, c = e.shape
        dl2 = dlogits.reshape(-1, v)
        demb = matmul(dl2.T, h.reshape(-1, c))  # [V, C]
        dh = matmul(dl2, e).reshape(*dlogits.shape[:-1], c)  # [B, T, C]
        dx, dgamma, dbeta = layer_norm_backward(ln, params["transformer.ln_f.weight"], dh)
        return dx, {"transformer.ln_f.weight": dgamma, "transformer.ln_f.bias": dbeta, self.emb: demb}


def build_gpt2(cfg: GPT2Config) -> ModelDef:
    """The model's units and its tensors, in ``GPT2LMHeadModel.state_dict()``'s order (a tied head has no
    ``lm_head.weight`` of its own). Initialisation is ModelZoo's (``gpt2_model.py``): a weight whose key is
    left out is normal(0, initializer_range) truncated at 2 std either side (``default_initializer``), the
    attention and MLP output projections with std and bounds scaled by (2 n_layer)^-0.5 unless
    ``initializer`` or ``output_layer_initializer`` is given; an untied head normal(0, initializer_range)
    whatever the keys say; biases 0, LayerNorm weights 1."""
    c, f, std = cfg.n_embd, cfg.n_inner, cfg.initializer_range
    proj_std = std / math.sqrt(2 * cfg.n_layer)  # ModelZoo's depth scaling of the residual projections
    emb, body, out = cfg.embedding_initializer, cfg.initializer, cfg.output_layer_initializer
    out = out if out is not None else body  # ModelZoo: without its own key a projection takes `initializer`
    specs = [
        weight_spec(WTE, (cfg.vocab_size, c), emb, std),
        weight_spec(WPE, (cfg.n_positions, c), emb, std),
    ]
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}."
        specs += [
            ParamSpec(p + "ln_1.weight", (c,), "ones"),
            ParamSpec(p + "ln_1.bias", (c,), "zeros"),
            # Conv1D weights are [in, out]; fans are those of ModelZoo's nn.Linear (c_attn: each of q, k, v)
            weight_spec(p + "attn.c_attn.weight", (c, 3 * c), body, std, fans=(c, c)),
            ParamSpec(p + "attn.c_attn.bias", (3 * c,), "zeros"),
            weight_spec(p + "attn.c_proj.weight", (c, c), out, proj_std, fans=(c, c)),
            ParamSpec(p + "attn.c_proj.bias", (c,), "zeros"),
            ParamSpec(p + "ln_2.weight", (c,), "ones"),
            ParamSpec(p + "ln_2.bias", (c,), "zeros"),
            weight_spec(p + "mlp.c_fc.weight", (c, f), body, std, fans=(c, f)),
            ParamSpec(p + "mlp.c_fc.bias", (f,), "zeros"),
            weight_spec(p + "mlp.c_proj.weight", (f, c), out, proj_std, fans=(f, c)),
            ParamSpec(p + "mlp.c_proj.bias", (c,), "zeros"),
        ]
    specs += [
        ParamSpec("transformer.ln_f.weight", (c,), "ones"),
        ParamSpec("transformer.ln_f.bias", (c,), "zeros"),
    ]
    if not cfg.tie_word_embeddings:
        specs.append(ParamSpec(LM_HEAD, (cfg.vocab_size, c), "normal", std))
    units: tuple[Unit, ...] = (
        EmbeddingUnit(cfg.embedding_dropout_rate),
        *(
            BlockUnit(
                i,
                cfg.n_head,
                cfg.layer_norm_epsilon,
                cfg.dropout_rate,
                cfg.activation == "gelu",
                cfg.attention_dropout_rate,
            )
            for i in range(cfg.n_layer)
        ),
        HeadUnit(cfg.layer_norm_epsilon, cfg.tie_word_embeddings),
    )
    return ModelDef("gpt2", units, {s.name: s for s in specs}, dense_only=frozenset({WTE, WPE, LM_HEAD}))
