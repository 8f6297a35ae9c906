"""ModelZoo's ``initializer``, ``embedding_initializer`` and ``output_layer_initializer`` set exactly the
tensors ModelZoo gives them (each kind's draw: test_initializer_draws.py); left out, ModelZoo's default
applies (pinned here; its distribution is checked in test_default_init.py)."""

from __future__ import annotations

import copy
import hashlib
import math
from typing import Any

import numpy as np
import pytest
import yaml

from tests.params_files import TINY_GPT2 as GPT2
from tests.params_files import TINY_LLAMA as LLAMA
from weightstream.numerics import init_params
from weightstream.numerics.init import Initializer
from weightstream.params import ParamsError, dump_params, load_params, model_def
from weightstream.params.model_schema import GPT2ModelParams

torch = pytest.importorskip("torch", reason="pip install -e .[test]")

# sha256 over (name, bytes) of init_params(seed 7) for these models without the keys: ModelZoo's default
# (truncated normal at 2 std, output projections scaled by 1/sqrt(2L), numerics/model.py). Re-pinned when
# that default replaced Hugging Face's normal(0, initializer_range): exactly the weights changed then (the
# embeddings, q/k/v/c_attn, the MLPs' and the output projections); the untied head, the norms and the
# biases kept their bytes. A change here changes every run's start.
DEFAULT = {
    "gpt2": "833576cf80afea730d1e7fcf7029a388aeb5d772ed23c9a840f61878299c4bdf",
    "gpt2_untied": "14ad0ce4194eb183a30755ac7a33f7ae21baad56631295d48cb83861bed68901",
    "llama": "0665af750be0deaf93f14a84848bee3f07044556c7201ea5fe2bc6776a3c37e2",
    "llama_bias_tied": "ce32ea5b2f4e2ef7c5861ea331ed3f690e3bbe04f1b18dbfe0688d8aad89f4ae",
}


def _params(base: dict[str, Any], **model: Any) -> dict[str, Any]:
    raw = copy.deepcopy(base)
    raw["model"].update(model)
    return raw


def _init(raw: dict[str, Any], seed: int = 7) -> dict[str, np.ndarray]:
    return init_params(model_def(load_params(raw)), seed)


def _digest(weights: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name, w in weights.items():
        h.update(name.encode())
        h.update(w.tobytes())
    return h.hexdigest()


# --- which tensors each key initialises ---------------------------------------------------------------
def _constant(v: float) -> dict[str, Any]:
    return {"name": "constant", "val": v}


GPT2_INPUT = ("attn.c_attn.weight", "mlp.c_fc.weight")
GPT2_OUTPUT = ("attn.c_proj.weight", "mlp.c_proj.weight")


def _changed(raw: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """{tensor: its constant} for every tensor that differs from ``base``'s init (all must be constant)."""
    before, after = _init(base), _init(raw)
    assert before.keys() == after.keys()
    out = {}
    for name, w in after.items():
        if not np.array_equal(w, before[name]):
            assert (w == w.flat[0]).all(), name
            out[name] = float(w.flat[0])
    return out


def _layers(n: int, suffixes: tuple[str, ...], prefix: str, value: float) -> dict[str, float]:
    return {f"{prefix}{i}.{s}": value for i in range(n) for s in suffixes}


def test_gpt2_output_layer_initializer_sets_both_projections_only() -> None:
    raw = _params(GPT2, output_layer_initializer=_constant(0.5))
    assert _changed(raw, GPT2) == _layers(2, GPT2_OUTPUT, "transformer.h.", 0.5)


def test_gpt2_initializer_alone_sets_the_projections_too_unscaled() -> None:
    """ModelZoo: without output_layer_initializer, the projections take `initializer` (no 1/sqrt(2L))."""
    raw = _params(GPT2, initializer=_constant(0.25))
    assert _changed(raw, GPT2) == _layers(2, GPT2_INPUT + GPT2_OUTPUT, "transformer.h.", 0.25)
    both = _params(GPT2, initializer=_constant(0.25), output_layer_initializer=_constant(0.5))
    want = _layers(2, GPT2_INPUT, "transformer.h.", 0.25) | _layers(2, GPT2_OUTPUT, "transformer.h.", 0.5)
    assert _changed(both, GPT2) == want


@pytest.mark.parametrize("tied", [True, False])
def test_gpt2_embedding_initializer_sets_token_and_position_embeddings(tied: bool) -> None:
    """Never the untied LM head: ModelZoo draws it normal(initializer_range) whatever the keys say."""
    base = _params(GPT2, share_embedding_weights=tied)
    raw = _params(base, embedding_initializer=_constant(0.75))
    assert _changed(raw, base) == {"transformer.wte.weight": 0.75, "transformer.wpe.weight": 0.75}


LLAMA_INPUT: tuple[str, ...] = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
)
LLAMA_INPUT += ("mlp.gate_proj.weight", "mlp.up_proj.weight")
LLAMA_OUTPUT = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


@pytest.mark.parametrize("tied", [True, False])
def test_llama_keys_set_their_tensors(tied: bool) -> None:
    """With biases on: they stay 0, the norms 1, the untied head normal(initializer_range)."""
    base = _params(
        LLAMA,
        share_embedding_weights=tied,
        use_projection_bias_in_attention=True,
        use_ffn_bias_in_attention=True,
        use_ffn_bias=True,
    )
    raw = _params(
        base,
        initializer=_constant(0.25),
        output_layer_initializer=_constant(0.5),
        embedding_initializer=_constant(0.75),
    )
    p = "model.layers."
    want = _layers(2, LLAMA_INPUT, p, 0.25) | _layers(2, LLAMA_OUTPUT, p, 0.5)
    assert _changed(raw, base) == want | {"model.embed_tokens.weight": 0.75}
    alone = _params(base, initializer=_constant(0.25))
    assert _changed(alone, base) == _layers(2, LLAMA_INPUT + LLAMA_OUTPUT, p, 0.25)


# ModelZoo's torch module for each of our tensors (gpt2: C 32, F 64, V 64, P 16; llama: F 48, kv 2 x 8)
TORCH_LAYERS = {
    "transformer.wte.weight": lambda: torch.nn.Embedding(64, 32),
    "transformer.wpe.weight": lambda: torch.nn.Embedding(16, 32),
    "transformer.h.1.attn.c_attn.weight": lambda: torch.nn.Linear(32, 32),  # q, k and v: each C -> C
    "transformer.h.1.attn.c_proj.weight": lambda: torch.nn.Linear(32, 32),
    "transformer.h.1.mlp.c_fc.weight": lambda: torch.nn.Linear(32, 64),
    "transformer.h.1.mlp.c_proj.weight": lambda: torch.nn.Linear(64, 32),
    "model.embed_tokens.weight": lambda: torch.nn.Embedding(64, 32),
    "model.layers.1.self_attn.q_proj.weight": lambda: torch.nn.Linear(32, 32),
    "model.layers.1.self_attn.k_proj.weight": lambda: torch.nn.Linear(32, 16),
    "model.layers.1.self_attn.o_proj.weight": lambda: torch.nn.Linear(32, 32),
    "model.layers.1.mlp.up_proj.weight": lambda: torch.nn.Linear(32, 48),
    "model.layers.1.mlp.down_proj.weight": lambda: torch.nn.Linear(48, 32),
}


@pytest.mark.parametrize("mode", ["fan_in", "fan_out"])
def test_fans_are_those_of_modelzoos_torch_layers(mode: str) -> None:
    """kaiming_uniform's bound sqrt(6 / fan) per tensor equals torch's for ModelZoo's layer: GPT-2's
    Conv1D weights are stored [in, out] and its c_attn fuses three C -> C projections, so torch's rule on
    our stored shape would be wrong for every GPT-2 weight (and right for LLaMA's nn.Linear layout)."""
    spec = {"name": "kaiming_uniform", "mode": mode}
    keys = {"initializer": spec, "output_layer_initializer": spec, "embedding_initializer": spec}
    weights = _init(_params(GPT2, **keys)) | _init(_params(LLAMA, **keys))
    for name, layer in TORCH_LAYERS.items():
        t = layer().weight.detach()
        fan = torch.nn.init._calculate_correct_fan(t, mode)
        bound = math.sqrt(3.0) * torch.nn.init.calculate_gain("leaky_relu", 0) / math.sqrt(fan)
        top = np.abs(weights[name]).max()
        assert 0.97 * bound < top <= bound, (name, top, bound)


# --- defaults, round trip, errors ----------------------------------------------------------------------
def _default_cases() -> dict[str, dict[str, Any]]:
    return {
        "gpt2": GPT2,
        "gpt2_untied": _params(GPT2, share_embedding_weights=False),
        "llama": LLAMA,
        "llama_bias_tied": _params(
            LLAMA,
            share_embedding_weights=True,
            use_projection_bias_in_attention=True,
            use_ffn_bias_in_attention=True,
            use_ffn_bias=True,
        ),
    }


@pytest.mark.parametrize("case", list(DEFAULT))
def test_without_the_keys_the_initialisation_is_pinned(case: str) -> None:
    assert _digest(_init(_default_cases()[case])) == DEFAULT[case]


def test_truncated_normal_at_initializer_range_is_the_default_draw() -> None:
    """`{name: truncated_normal, std: initializer_range}` (bounds 2 std by default) draws the default's
    very numbers: as `initializer` on c_attn and c_fc, as `embedding_initializer` on wte and wpe."""
    before = _init(GPT2)
    spec = {"name": "truncated_normal", "std": 0.02}
    after = _init(_params(GPT2, initializer=spec, embedding_initializer=spec))
    names = [f"transformer.h.{i}.{s}" for i in range(2) for s in GPT2_INPUT]
    for name in [*names, "transformer.wte.weight", "transformer.wpe.weight"]:
        assert after[name].tobytes() == before[name].tobytes(), name


def test_specs_survive_dump_and_load_with_defaults_filled_in() -> None:
    """Roles rebuild the model from the resolved params: the specs and the draws must come back equal."""
    raw = _params(
        LLAMA,
        initializer={"name": "truncated_normal", "std": 0.02, "a": -0.03, "b": None},
        embedding_initializer="lecun_uniform",
        output_layer_initializer={"name": "kaiming_normal", "mode": "fan_out"},
    )
    p = load_params(raw)
    dumped = yaml.safe_load(dump_params(p))["model"]
    assert dumped["initializer"] == {
        "name": "truncated_normal",
        "mean": 0.0,
        "std": 0.02,
        "a": -0.03,
        "b": 0.04,
    }
    assert dumped["embedding_initializer"] == {
        "name": "lecun_uniform",
        "scale": 1.0,
        "mode": "fan_in",
        "distribution": "uniform",
    }
    again = load_params({**raw, "model": dumped})
    assert again == p
    assert _digest(init_params(model_def(again), 7)) == _digest(init_params(model_def(p), 7))


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("glorot_normal", Initializer("xavier_normal", gain=1.0)),
        ("glorot_uniform", Initializer("xavier_uniform", gain=1.0)),
        ("lecun_normal", Initializer("variance_scaling", scale=1.0, mode="fan_in")),
        ("lecun_uniform", Initializer("variance_scaling", scale=1.0, mode="fan_in", distribution="uniform")),
        ("truncated_normal", Initializer("truncated_normal", mean=0.0, std=0.05, a=-0.1, b=0.1)),
        ("uniform", Initializer("uniform", a=-0.05, b=0.05)),
        ("kaiming_uniform", Initializer("kaiming_uniform", a=0.0, mode="fan_in", nonlinearity="leaky_relu")),
    ],
)
def test_modelzoo_names_and_defaults(name: str, kind: Initializer) -> None:
    """A name alone takes ModelZoo's defaults (layers/init.py); its aliases are the kinds they name."""
    model = load_params(_params(GPT2, initializer=name)).model
    assert isinstance(model, GPT2ModelParams) and model.initializer is not None
    assert model.initializer.numerics() == kind


@pytest.mark.parametrize(
    ("key", "spec", "words"),
    [
        ("initializer", {"name": "truncated_normal", "stddev": 0.1}, "did you mean 'std'"),
        ("initializer", "xavier", "did you mean 'xavier_normal'"),
        ("embedding_initializer", {"name": "normal", "std": -1}, "std must be at least 0"),
        ("output_layer_initializer", {"name": "constant"}, "needs `val`"),
        ("output_layer_initializer", {"std": 0.02}, "needs a `name`"),
        ("initializer", {"name": "truncated_normal", "std": 0.02, "a": 0.1}, "a must be below b"),
        ("initializer", {"name": "kaiming_normal", "mode": "fan_avg"}, "fan_in or fan_out"),
        ("initializer", {"name": "eye"}, "not implemented"),
        ("initializer", 0.02, "must be an initializer name or a mapping"),
    ],
)
def test_a_bad_spec_names_the_key(key: str, spec: Any, words: str) -> None:
    with pytest.raises(ParamsError) as e:
        load_params(_params(GPT2, **{key: spec}))
    (problem,) = e.value.problems
    assert problem.path == f"model.{key}" and words in problem.message, str(problem)


def test_a_wrongly_typed_parameter_names_its_own_path() -> None:
    with pytest.raises(ParamsError) as e:
        load_params(_params(LLAMA, initializer={"name": "normal", "std": "wide"}))
    assert [q.path for q in e.value.problems] == ["model.initializer.std"]
