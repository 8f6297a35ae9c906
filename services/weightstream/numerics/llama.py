"""LLaMA as streamable units: embedding, one unit per decoder layer, final RMSNorm + head.

Exactly the Hugging Face ``LlamaForCausalLM`` architecture (pre-RMSNorm decoder layers, rotary positions,
causal grouped-query attention, SwiGLU MLP, optional biases as ``attention_bias``/``mlp_bias``, head
optionally tied to the embedding) with its parameter names and its ``nn.Linear`` layout (weights stored
[out, in]), so safetensors of these parameters load with ``LlamaForCausalLM.from_pretrained`` as they are.

The [out, in] layout suits the feature-major attention (``attention.py``): q_t = Wq @ h^T is a plain
product that writes [C, N] directly, and o_proj reads the [C, N] result transposed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from weightstream.numerics._blocked import matmul, single_threaded_blas, sum_rows
from weightstream.numerics._memory import retain_freed_memory
from weightstream.numerics.attention import attention_backward_t, attention_forward_t
from weightstream.numerics.init import Initializer
from weightstream.numerics.layers import embedding_backward
from weightstream.numerics.llama_layers import (
    add_residual,
    add_rms_norm_forward,
    reduce_kv_t,
    repeat_kv_t,
    rms_norm_backward,
    rms_norm_forward,
    rope_backward_t,
    rope_forward_t,
    swiglu_backward,
    swiglu_forward,
)
from weightstream.numerics.model import ModelDef, Params, ParamSpec, Unit, weight_spec
from weightstream.numerics.rope_scaling import RopeScaling
from weightstream.numerics.sparse import SparseWeight, matmul_any, weight_grad

__all__ = ["LlamaConfig", "build_llama"]

EMBED = "model.embed_tokens.weight"
NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LlamaConfig:
    """Hugging Face ``LlamaConfig``'s fields (``num_layers`` is its ``num_hidden_layers``, ``num_heads`` its
    ``num_attention_heads``, ``num_kv_heads`` its ``num_key_value_heads``)."""

    vocab_size: int
    max_position_embeddings: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    initializer_range: float = 0.02
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    rope_scaling: RopeScaling | None = None  # linear or llama3 (rope_scaling.py); None: plain RoPE
    # ModelZoo's initializer keys (init.py), None where left out: ModelZoo's default, normal(0,
    # initializer_range) cut at 2 std, o and down (without either key) scaled by 1/sqrt(2 num_layers).
    # initializer: q, k, v, gate, up, and o, down unless output_layer_initializer is given (then unscaled,
    # as ModelZoo); embedding_initializer: embed
    initializer: Initializer | None = None
    embedding_initializer: Initializer | None = None
    output_layer_initializer: Initializer | None = None

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "max_position_embeddings",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"LlamaConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"LlamaConfig.hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"LlamaConfig.num_heads {self.num_heads} is not a multiple of "
                f"num_kv_heads {self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"LlamaConfig: head_dim = hidden_size / num_heads = {self.head_dim} must be even "
                "(rotary embeddings rotate pairs of features)"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


class EmbeddingUnit:
    """ids [B, T] -> x [B, T, C] = embed_tokens[ids] (positions enter as rotations inside attention)."""

    name = "embedding"
    param_names = (EMBED,)

    def __init__(self, max_positions: int) -> None:
        self.max_positions = max_positions

    def forward(self, params: Params, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if ids.shape[1] > self.max_positions:
            raise ValueError(
                f"sequence length {ids.shape[1]} exceeds max_position_embeddings {self.max_positions}"
            )
        return params[EMBED][ids], ids  # a gather: already a fresh array

    def backward(self, params: Params, ids: np.ndarray, dx: np.ndarray) -> tuple[None, dict[str, np.ndarray]]:
        return None, {EMBED: embedding_backward(ids, dx, params[EMBED].shape[0])}


class DecoderLayerUnit:
    """One pre-RMSNorm decoder layer. [B, T, C] -> [B, T, C]:
    x1 = x + o_proj(attn(rope(q), rope(k), v)) on input_layernorm(x), then y = x1 + down(silu(gate) * up)
    on post_attention_layernorm(x1)."""

    def __init__(self, index: int, cfg: LlamaConfig) -> None:
        self.name = f"layers.{index}"
        self.prefix = p = f"model.layers.{index}."
        self.n_head, self.head_dim = cfg.num_heads, cfg.head_dim
        self.eps, self.theta, self.scaling = cfg.rms_norm_eps, cfg.rope_theta, cfg.rope_scaling
        self.n_rep = cfg.num_heads // cfg.num_kv_heads  # query heads per key/value head
        self.kv_dim = cfg.num_kv_heads * cfg.head_dim
        self.attn_bias, self.mlp_bias = cfg.attention_bias, cfg.mlp_bias
        self.param_names = tuple(p + s for s in _layer_suffixes(cfg))

    def forward(self, params: Params, x: np.ndarray) -> tuple[np.ndarray, Any]:
        w = {name[len(self.prefix) :]: params[name] for name in self.param_names}
        b, t, c = x.shape
        n, kvd, hd = b * t, self.kv_dim, self.head_dim
        retain_freed_memory()  # once per process: see _memory
        with single_threaded_blas():  # one switch for the whole layer (see _blocked)
            h1, rms1 = rms_norm_forward(x, w["input_layernorm.weight"], self.eps)
            h1_t = h1.reshape(n, c).T  # [C, N] view
            # q|k|v feature-major [3C, N], as attention_forward_t takes them. K and V are made with their
            # own KV heads (rotating k before the repeat rotates n_rep times fewer rows), then repeated.
            qkv_t = np.empty((3 * c, n), dtype=x.dtype)
            kv_t = qkv_t[c:] if self.n_rep == 1 else np.empty((2 * kvd, n), dtype=x.dtype)  # [2 KV D, N]
            for rows, proj in ((qkv_t[:c], "q_proj"), (kv_t[:kvd], "k_proj"), (kv_t[kvd:], "v_proj")):
                matmul_any(
                    w[f"self_attn.{proj}.weight"],
                    h1_t,
                    out=rows,
                    bias=self._bias(w, f"self_attn.{proj}", True),
                )
            rope_forward_t(qkv_t[:c], b, hd, self.theta, out=qkv_t[:c], scaling=self.scaling)
            rope_forward_t(kv_t[:kvd], b, hd, self.theta, out=kv_t[:kvd], scaling=self.scaling)
            if self.n_rep > 1:
                repeat_kv_t(kv_t[:kvd], self.n_rep, hd, out=qkv_t[c : 2 * c])
                repeat_kv_t(kv_t[kvd:], self.n_rep, hd, out=qkv_t[2 * c :])
            a_t, att = attention_forward_t(qkv_t, b, self.n_head)  # [C, N]
            x1 = matmul_any(a_t.T, w["self_attn.o_proj.weight"].T).reshape(b, t, c)
            x1, h2, rms2 = add_rms_norm_forward(  # x1 = attn (+ o bias) + x (residual 1), h2 = norm(x1)
                x1, self._bias(w, "self_attn.o_proj"), x, w["post_attention_layernorm.weight"], self.eps
            )
            h2_2 = h2.reshape(n, c)
            gate = matmul_any(
                h2_2, w["mlp.gate_proj.weight"].T, bias=self._bias(w, "mlp.gate_proj")
            )  # [N, F]
            up = matmul_any(h2_2, w["mlp.up_proj.weight"].T, bias=self._bias(w, "mlp.up_proj"))  # [N, F]
            m = swiglu_forward(gate, up)  # [N, F]
            y = matmul_any(m, w["mlp.down_proj.weight"].T).reshape(b, t, c)
            add_residual(y, x1, self._bias(w, "mlp.down_proj"))  # residual 2
        return y, (rms1, h1, att, a_t, rms2, h2, gate, up, m)

    def backward(
        self, params: Params, saved: Any, dy: np.ndarray
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Consumes ``saved``: most gradients are written over a saved activation at its last use."""
        w = {name[len(self.prefix) :]: params[name] for name in self.param_names}
        rms1, h1, att, a_t, rms2, h2, gate, up, m = saved
        b, t, c = dy.shape
        n, kvd, hd = b * t, self.kv_dim, self.head_dim
        dy2, h1_2, h2_2 = dy.reshape(n, c), h1.reshape(n, c), h2.reshape(n, c)
        grads: dict[str, np.ndarray] = {}
        with single_threaded_blas():
            # MLP branch. HF's [out, in] layout: dW = dout^T @ in.
            # A sparse weight's gradient is its kept entries only (``weight_grad``).
            grads["mlp.down_proj.weight"] = weight_grad(dy2, m, w["mlp.down_proj.weight"])  # [C, F]
            dm = matmul_any(dy2, w["mlp.down_proj.weight"], out=m)  # [N, F]; m is dead
            dgate, dup = swiglu_backward(gate, up, dm, out=(gate, up))
            grads["mlp.gate_proj.weight"] = weight_grad(dgate, h2_2, w["mlp.gate_proj.weight"])  # [F, C]
            grads["mlp.up_proj.weight"] = weight_grad(dup, h2_2, w["mlp.up_proj.weight"])
            if self.mlp_bias:
                grads["mlp.down_proj.bias"] = sum_rows(dy2)
                grads["mlp.gate_proj.bias"] = sum_rows(dgate)
                grads["mlp.up_proj.bias"] = sum_rows(dup)
            dh2 = matmul_any(dgate, w["mlp.gate_proj.weight"], out=h2_2)  # [N, C]; h2 is dead
            add_residual(dh2, matmul_any(dup, w["mlp.up_proj.weight"]))
            dx1, grads["post_attention_layernorm.weight"] = rms_norm_backward(
                rms2,
                w["post_attention_layernorm.weight"],
                dh2,
                residual=dy,
                out=dh2,  # + dy: residual 2
            )
            # attention branch, feature-major like its forward
            dx1_2 = dx1.reshape(n, c)
            grads["self_attn.o_proj.weight"] = weight_grad(
                dx1_2, a_t.T, w["self_attn.o_proj.weight"]
            )  # [C, C]
            if self.attn_bias:
                grads["self_attn.o_proj.bias"] = sum_rows(dx1_2)
            da_t = matmul_any(w["self_attn.o_proj.weight"].T, dx1_2.T, out=a_t)  # [C, N]; a_t is dead
            dqkv_t = attention_backward_t(att, da_t)  # [3C, N]
            # Back through the repeat and the rotations into d_t [C + 2 KV D, N] (q|k|v, KV heads). The
            # attention's saved input is dead now: with n_rep > 1 its first rows hold d_t.
            d_t = dqkv_t if self.n_rep == 1 else att.qkv_t[: c + 2 * kvd]
            if self.n_rep > 1:
                reduce_kv_t(dqkv_t[c : 2 * c], self.n_rep, hd, out=d_t[c : c + kvd])
                reduce_kv_t(dqkv_t[2 * c :], self.n_rep, hd, out=d_t[c + kvd :])
            rope_backward_t(dqkv_t[:c], b, hd, self.theta, out=d_t[:c], scaling=self.scaling)
            rope_backward_t(d_t[c : c + kvd], b, hd, self.theta, out=d_t[c : c + kvd], scaling=self.scaling)
            parts = (("q_proj", slice(0, c)), ("k_proj", slice(c, c + kvd)), ("v_proj", slice(c + kvd, None)))
            for proj, rows in parts:
                grads[f"self_attn.{proj}.weight"] = weight_grad(
                    d_t[rows].T, h1_2, w[f"self_attn.{proj}.weight"]
                )
                if self.attn_bias:
                    grads[f"self_attn.{proj}.bias"] = sum_rows(d_t[rows].T)
            # dh1 = d_t^T @ [Wq; Wk; Wv]: one product over the stacked weights (a copy of C + 2 KV D rows)
            # instead of three products and two passes to add them; sparse weights do not stack: three
            # products over their kept entries, added
            qkv = [w[f"self_attn.{proj}.weight"] for proj, _ in parts]
            if any(isinstance(wp, SparseWeight) for wp in qkv):
                dh1 = matmul_any(d_t[parts[0][1]].T, qkv[0], out=h1_2)
                for (_, rows), wp in zip(parts[1:], qkv[1:], strict=True):
                    dh1 += matmul_any(d_t[rows].T, wp)
                dh1 = dh1.reshape(b, t, c)
            else:
                dh1 = matmul(d_t.T, np.concatenate(qkv), out=h1_2).reshape(b, t, c)  # h1 is dead
            dx, grads["input_layernorm.weight"] = rms_norm_backward(
                rms1,
                w["input_layernorm.weight"],
                dh1,
                residual=dx1,
                out=dh1,  # + dx1: residual 1
            )
        return dx, {self.prefix + k: v for k, v in grads.items()}

    def _bias(self, w: dict[str, np.ndarray], module: str, per_row: bool = False) -> np.ndarray | None:
        """The module's bias if the config has one: [out] per column, or [out, 1] per row (feature-major)."""
        if not (self.attn_bias if module.startswith("self_attn") else self.mlp_bias):
            return None
        bias = w[module + ".bias"]
        return bias[:, None] if per_row else bias


class HeadUnit:
    """Final RMSNorm and the LM head: x [B, T, C] -> logits [B, T, V] = norm(x) @ E^T.

    E is ``lm_head.weight`` [V, C], or ``embed_tokens`` when tied (its gradient here adds to the
    embedding unit's; the embedding unit owns it)."""

    name = "head"

    def __init__(self, eps: float, tied: bool) -> None:
        self.eps = eps
        self.emb = EMBED if tied else LM_HEAD
        self.param_names = (NORM, self.emb)

    def forward(self, params: Params, x: np.ndarray) -> tuple[np.ndarray, Any]:
        with single_threaded_blas():
            h, rms = rms_norm_forward(x, params[NORM], self.eps)
            e = params[self.emb]  # [V, C]
            logits = matmul(h.reshape(-1, e.shape[1]), e.T).reshape(*h.shape[:-1], e.shape[0])  # [B, T, V]
        return logits, (rms, h)

    def backward(
        self, params: Params, saved: Any, dlogits: np.ndarray
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        rms, h = saved
        e = params[self.emb]  # [V, C]
        v, c = e.shape
        dl2 = dlogits.reshape(-1, v)
        with single_threaded_blas():
            demb = matmul(dl2.T, h.reshape(-1, c))  # [V, C]
            dh = matmul(dl2, e).reshape(*dlogits.shape[:-1], c)  # [B, T, C]
            dx, dnorm = rms_norm_backward(rms, params[NORM], dh, out=dh)
        return dx, {NORM: dnorm, self.emb: demb}


def _layer_suffixes(cfg: LlamaConfig) -> list[str]:
    """A decoder layer's tensors in ``LlamaForCausalLM.state_dict()``'s order."""
    names = []
    for proj in _ATTN:
        names += [f"self_attn.{proj}.weight"] + ([f"self_attn.{proj}.bias"] if cfg.attention_bias else [])
    for proj in _MLP:
        names += [f"mlp.{proj}.weight"] + ([f"mlp.{proj}.bias"] if cfg.mlp_bias else [])
    return [*names, "input_layernorm.weight", "post_attention_layernorm.weight"]


def build_llama(cfg: LlamaConfig) -> ModelDef:
    """The model's units and its tensors, in ``LlamaForCausalLM.state_dict()``'s order (a tied head has
    no ``lm_head.weight`` of its own). Initialisation is ModelZoo's (its LLaMA is its GPT-2 model,
    ``gpt2_model.py``), not Hugging Face's ``_init_weights``: a weight whose key is left out is normal(0,
    initializer_range) truncated at 2 std either side (``default_initializer``), o_proj and down_proj with
    std and bounds scaled by (2 num_layers)^-0.5 unless ``initializer`` or ``output_layer_initializer`` is
    given (see LlamaConfig); an untied head normal(0, initializer_range) whatever the keys say; biases 0,
    norm weights 1."""
    c, f, kvd, std = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.initializer_range,
    )
    shapes = {"q_proj": (c, c), "k_proj": (kvd, c), "v_proj": (kvd, c), "o_proj": (c, c)}
    shapes |= {"gate_proj": (f, c), "up_proj": (f, c), "down_proj": (c, f)}
    proj_std = std / math.sqrt(2 * cfg.num_layers)  # ModelZoo's depth scaling, as GPT-2's
    body, out = cfg.initializer, cfg.output_layer_initializer
    out = out if out is not None else body  # ModelZoo: without its own key a projection takes `initializer`
    specs = [weight_spec(EMBED, (cfg.vocab_size, c), cfg.embedding_initializer, std)]
    for i in range(cfg.num_layers):
        for suffix in _layer_suffixes(cfg):
            name = f"model.layers.{i}.{suffix}"
            module, kind = suffix.split(".")[-2:]
            if module.endswith("layernorm"):
                specs.append(ParamSpec(name, (c,), "ones"))
            elif kind == "bias":
                specs.append(ParamSpec(name, (shapes[module][0],), "zeros"))
            else:  # nn.Linear's own [out, in] layout: torch's fans
                if module in ("o_proj", "down_proj"):
                    specs.append(weight_spec(name, shapes[module], out, proj_std))
                else:
                    specs.append(weight_spec(name, shapes[module], body, std))
    specs.append(ParamSpec(NORM, (c,), "ones"))
    if not cfg.tie_word_embeddings:
        specs.append(ParamSpec(LM_HEAD, (cfg.vocab_size, c), "normal", std))
    units: tuple[Unit, ...] = (
        EmbeddingUnit(cfg.max_position_embeddings),
        *(DecoderLayerUnit(i, cfg) for i in range(cfg.num_layers)),
        HeadUnit(cfg.rms_norm_eps, cfg.tie_word_embeddings),
    )
    return ModelDef("llama", units, {s.name: s for s in specs}, dense_only=frozenset({EMBED, LM_HEAD}))
