"""The params file (ModelZoo layout and key names) as pydantic models.

Only structure and per-key ranges live here; checks that relate two sections (batch size vs num_csx,
sequence length vs positions, data processor vs model) are in ``load.py`` so each problem carries the
path of the key a user has to change.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

__all__ = [
    "DATA_PROCESSORS",
    "ExtraAttentionParams",
    "FCMLPModelParams",
    "GPT2ModelParams",
    "InputParams",
    "LanguageModelParams",
    "LlamaModelParams",
    "MixtureParams",
    "OptimizerParams",
    "Params",
    "RunConfig",
    "SchedulePieceParams",
    "SparsityParams",
]


class _Section(BaseModel):
    # allow_inf_nan: a NaN or infinity (``.inf``, "Infinity") anywhere in params is an error, never a value
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


DataProcessor = Literal[
    "TextFileDataProcessor",
    "TokenFileDataProcessor",
    "GptHDF5MapDataProcessor",
    "SyntheticDataProcessor",
    "DigitsDataProcessor",
]
DATA_PROCESSORS: tuple[str, ...] = DataProcessor.__args__  # type: ignore[attr-defined]


def _zero_dropout(v: float) -> float:
    if v != 0.0:
        raise ValueError("weightstream supports only 0.0 (dropout is not implemented)")
    return v


ZeroDropout = Annotated[float, AfterValidator(_zero_dropout)]


class MixtureParams(_Section):
    """One dataset of a mixture: its directory and its share of the samples (weights are normalised)."""

    data_dir: str
    weight: PositiveFloat = 1.0


class InputParams(_Section):
    data_processor: DataProcessor
    data_dir: str | list[str] | None = None
    mixture: list[MixtureParams] | None = Field(default=None, min_length=1)  # instead of data_dir
    batch_size: PositiveInt  # the global batch, divided evenly across num_csx
    max_sequence_length: PositiveInt | None = None
    shuffle: bool = True
    shuffle_seed: NonNegativeInt = 0  # numpy's seed sequences take no negative entropy
    # samples per micro-batch on a worker (gradients accumulate over a shard's micro-batches);
    # None: the whole shard, or the largest that fits runconfig.worker_memory_mb when that is set
    micro_batch_size: PositiveInt | None = None
    # true: each epoch is whole batches, its remainder skipped (reshuffled into the next epoch); false:
    # a batch takes the last samples of one epoch and the first of the next. None: true for
    # GptHDF5MapDataProcessor (ModelZoo's default), false for the others
    drop_last: bool | None = None
    num_workers: NonNegativeInt = 0  # threads an activation server reads HDF5 files with (0: one)

    @field_validator("data_processor", mode="before")
    @classmethod
    def _same_reader(cls, v: Any) -> Any:
        """ModelZoo's GptHDF5DataProcessor reads the same files as its Map variant: one reader here."""
        return "GptHDF5MapDataProcessor" if v == "GptHDF5DataProcessor" else v


class _LanguageModelParams(_Section):
    """What every decoder-only language model shares: sizes, vocabulary, positions, initialisation."""

    name: str
    vocab_size: PositiveInt
    hidden_size: PositiveInt
    num_hidden_layers: PositiveInt
    num_heads: PositiveInt
    filter_size: PositiveInt | None = None  # the MLP's inner size
    max_position_embeddings: PositiveInt
    layer_norm_epsilon: PositiveFloat = 1e-5
    initializer_range: PositiveFloat = 0.02
    attention_dropout_rate: ZeroDropout = 0.0
    attention_type: Literal["scaled_dot_product"] = "scaled_dot_product"
    loss_scaling: Literal["num_tokens"] = "num_tokens"
    fp16_type: Literal["bfloat16"] | None = None  # bf16 on the wire; the master copy stays fp32

    @property
    def inner_size(self) -> int:
        return self.filter_size if self.filter_size is not None else 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


class GPT2ModelParams(_LanguageModelParams):
    name: Literal["gpt2", "gpt3"]  # ModelZoo's GPT-3 is GPT-2's architecture (learned positions, LayerNorm)
    position_embedding_type: Literal["learned"] = "learned"
    share_embedding_weights: bool = True
    # ModelZoo's meaning: gelu is the exact (erf) GELU, gelu_new the tanh form (Hugging Face GPT-2's)
    nonlinearity: Literal["gelu", "gelu_new"] = "gelu"
    # Hugging Face's resid_pdrop (after each projection, before its residual add) and embd_pdrop
    dropout_rate: Annotated[float, Field(ge=0, lt=1)] = 0.0
    embedding_dropout_rate: Annotated[float, Field(ge=0, lt=1)] | None = None  # None: dropout_rate
    norm_type: Literal["layernorm"] = "layernorm"
    use_projection_bias_in_attention: Literal[True] = True
    use_ffn_bias_in_attention: Literal[True] = True
    use_ffn_bias: Literal[True] = True
    use_bias_in_output: Literal[False] = False

    @property
    def embedding_dropout(self) -> float:
        """``embedding_dropout_rate``, or ``dropout_rate`` where it is left out (ModelZoo's default)."""
        return self.dropout_rate if self.embedding_dropout_rate is None else self.embedding_dropout_rate


class ExtraAttentionParams(_Section):
    num_kv_groups: PositiveInt  # key/value heads of grouped-query attention


class LlamaModelParams(_LanguageModelParams):
    """ModelZoo's ``name: llama`` keys, as Hugging Face's ``LlamaForCausalLM`` implements them."""

    name: Literal["llama"]
    filter_size: PositiveInt  # SwiGLU's inner size (intermediate_size); no default, as in ModelZoo
    position_embedding_type: Literal["rotary"] = "rotary"
    rope_theta: PositiveFloat = 10000.0
    rotary_dim: PositiveInt | None = None  # None: the whole head (Hugging Face's LLaMA rotates all of it)
    norm_type: Literal["rmsnorm"] = "rmsnorm"
    nonlinearity: Literal["swiglu"] = "swiglu"
    share_embedding_weights: bool = False
    # Hugging Face's attention_bias puts a bias on q, k, v and o alike: the two keys must agree
    use_projection_bias_in_attention: bool = False  # q, k, v
    use_ffn_bias_in_attention: bool = False  # o
    use_ffn_bias: bool = False  # gate, up, down (mlp_bias)
    use_bias_in_output: Literal[False] = False  # LlamaForCausalLM's head has no bias
    # multiquery_attention with extra_attention_params.num_kv_groups: grouped-query attention
    attention_module: Literal["aiayn_attention", "multiquery_attention"] = "aiayn_attention"
    extra_attention_params: ExtraAttentionParams | None = None
    dropout_rate: ZeroDropout = 0.0
    embedding_dropout_rate: ZeroDropout = 0.0

    @property
    def num_kv_heads(self) -> int:
        if self.attention_module == "aiayn_attention":
            return self.num_heads
        return self.extra_attention_params.num_kv_groups if self.extra_attention_params else 1


LanguageModelParams = GPT2ModelParams | LlamaModelParams


class FCMLPModelParams(_Section):
    name: Literal["fc_mlp"]
    input_size: PositiveInt
    hidden_size: PositiveInt
    depth: PositiveInt  # number of hidden layers
    num_classes: PositiveInt = 10
    activation_fn: Literal["relu"] = "relu"
    dropout: ZeroDropout = 0.0
    fp16_type: Literal["bfloat16"] | None = None


_SCHEDULER_NAMES = {"constant": "Constant", "linear": "Linear", "cosinedecay": "CosineDecay"}


def _renamed(v: Any, renames: dict[str, str]) -> Any:
    """``v`` (a section as parsed) with older key names replaced by the current ones; both given is an
    error naming them."""
    if not isinstance(v, dict):
        return v
    both = [f"{old} and {new}" for old, new in renames.items() if old in v and new in v]
    if both:
        raise ValueError(f"give one of {', '.join(both)} (older and current names of one setting)")
    return {renames.get(k, k): x for k, x in v.items()}


class SchedulePieceParams(_Section):
    scheduler: Literal["Constant", "Linear", "CosineDecay"]
    initial_learning_rate: Annotated[float, Field(ge=0)] | None = None
    end_learning_rate: Annotated[float, Field(ge=0)] | None = None
    learning_rate: Annotated[float, Field(ge=0)] | None = None  # Constant's value
    total_iters: PositiveInt | None = None  # may be left out only by a last, Constant piece

    @model_validator(mode="before")
    @classmethod
    def _older_spelling(cls, v: Any) -> Any:
        """ModelZoo's older ``steps`` is ``total_iters``."""
        return _renamed(v, {"steps": "total_iters"})

    @field_validator("scheduler", mode="before")
    @classmethod
    def _canonical_name(cls, v: Any) -> Any:
        return _SCHEDULER_NAMES.get(v.lower().replace("_", ""), v) if isinstance(v, str) else v


class OptimizerParams(_Section):
    optimizer_type: Literal["adamw", "adam", "sgd"]
    learning_rate: list[SchedulePieceParams] = Field(min_length=1)
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.999)
    eps: PositiveFloat = 1e-8
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.0
    nesterov: bool = False
    max_gradient_norm: PositiveFloat | None = None
    # ModelZoo's rule: biases and normalisation weights get no weight decay; false decays every tensor
    exclude_bias_and_norm_from_weight_decay: bool = True
    # what weightstream always does, so accepted as long as they say so (the other value is refused)
    correct_bias: bool = True  # Adam's bias correction (also spelled use_bias_correction)
    amsgrad: bool = False

    @field_validator("correct_bias")
    @classmethod
    def _bias_corrected(cls, v: bool) -> bool:
        if not v:
            raise ValueError(
                "weightstream always applies Adam's bias correction (as torch's Adam/AdamW): only true"
            )
        return v

    @field_validator("amsgrad")
    @classmethod
    def _no_amsgrad(cls, v: bool) -> bool:
        if v:
            raise ValueError("AMSGrad is not implemented: only false")
        return v

    @model_validator(mode="before")
    @classmethod
    def _older_spellings(cls, v: Any) -> Any:
        """ModelZoo's older spellings: beta1/beta2 (betas), epsilon (eps), weight_decay_rate (weight_decay),
        use_bias_correction (correct_bias)."""
        if isinstance(v, dict) and ("beta1" in v or "beta2" in v):
            if "betas" in v:
                raise ValueError("give either betas or beta1/beta2, not both")
            v = {k: x for k, x in v.items() if k not in ("beta1", "beta2")} | {
                "betas": [v.get("beta1", 0.9), v.get("beta2", 0.999)]
            }
        renames = {
            "epsilon": "eps",
            "weight_decay_rate": "weight_decay",
            "use_bias_correction": "correct_bias",
        }
        return _renamed(v, renames)

    @field_validator("optimizer_type", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v

    @field_validator("learning_rate", mode="before")
    @classmethod
    def _constant_from_number(cls, v: Any) -> Any:
        """A bare number means one Constant piece, so both forms validate through one model."""
        if isinstance(v, int | float) and not isinstance(v, bool):
            if v < 0:  # checked here so the message names the key the user wrote
                raise ValueError("Input should be greater than or equal to 0")
            return [{"scheduler": "Constant", "learning_rate": v}]
        return v


class RunConfig(_Section):
    num_csx: PositiveInt = 1
    num_wgt_servers: PositiveInt = 1
    num_act_servers: PositiveInt = 1
    max_steps: PositiveInt
    log_steps: PositiveInt = 10
    checkpoint_steps: NonNegativeInt = 0  # 0: a checkpoint only at the end
    eval_frequency: NonNegativeInt = 0  # 0: evaluate only at the end (when eval_input is given)
    eval_steps: PositiveInt = 1
    seed: NonNegativeInt = 0  # numpy's seed sequences take no negative entropy
    model_dir: str = "./model_dir"
    autoload_last_checkpoint: bool = True
    keep_checkpoint_max: PositiveInt | None = None  # keep the newest N complete checkpoints; None: all
    # weightstream's own keys (not in ModelZoo)
    swarmx_fanout: Annotated[int, Field(ge=2)] = (
        4  # children per SwarmX node; the tree's depth is log_fanout(N)
    )
    worker_memory_mb: PositiveInt | None = None  # a worker's memory budget for weights and activations
    # weight_streaming: each unit streams in for forward and again for backward; pipelined: the weights
    # stay on the worker through the step (one transfer per unit per step); auto: pipelined when the
    # model fits worker_memory_mb
    execution_mode: Literal["weight_streaming", "pipelined", "auto"] = "weight_streaming"
    # disk: each MemoryX shard keeps weights, optimizer state and the step's gradients in files under
    # memoryx_dir (default model_dir/.memoryx), so the shards together can hold more than RAM
    memoryx_storage: Literal["memory", "disk"] = "memory"
    # how tensor bytes travel between roles: shared_memory (memfds; only the header over gRPC) needs every
    # role on one host; auto: shared_memory with the local backend, grpc on Kubernetes
    data_plane: Literal["auto", "grpc", "shared_memory"] = "auto"
    memoryx_dir: str | None = None
    # false: checkpoints hold the weights only (loadable by Hugging Face, not resumable); halves their size
    # and more for Adam
    checkpoint_optimizer_state: bool = True
    # the largest checkpoint file, as save_pretrained's max_shard_size ("5GB", "500MB", or bytes)
    checkpoint_max_shard_size: ByteSize = ByteSize(5 * 10**9)
    rpc_timeout_s: PositiveFloat = 120.0  # deadline of every call and every wait between roles
    # fault recovery: how many role replacements a job may need in all before it fails, and how often the
    # MemoryX shards save a recovery snapshot (a lost shard rolls the job back to the newest snapshot or
    # checkpoint and replays the steps since; 0: checkpoints only)
    max_role_restarts: NonNegativeInt = 50
    recovery_snapshot_steps: NonNegativeInt = 10
    # ModelZoo's keys: a Hugging Face save_pretrained directory whose weights start the run (optimizer
    # state and step start fresh; a checkpoint of the run's own model_dir, when there is one, wins), and a
    # checkpoint of the weights before the first step
    checkpoint_path: str | None = None
    save_initial_checkpoint: bool = False


class SparsityParams(_Section):
    """ModelZoo's ``sparsity:`` block: unstructured weight sparsity, fixed masks (``algorithm: static``)."""

    # the fraction of zeros: one for every tensor param_filter selects, or per glob of tensor names
    # (each tensor takes the first glob, in the file's order, that matches it; others stay dense)
    sparsity: float | dict[str, float]
    init_method: Literal["random", "topk", "balanced-topk", "checkerboard"] = "random"
    # globs over the Hugging Face tensor names; default: every 2-D weight of a linear layer (not the
    # embeddings or the LM head; norms and biases are 1-D)
    param_filter: str | list[str] | None = None
    algorithm: str = "static"
    seed: NonNegativeInt | None = None  # of the random masks; default: runconfig.seed

    @field_validator("sparsity")
    @classmethod
    def _fractions(cls, v: float | dict[str, float]) -> float | dict[str, float]:
        for level in v.values() if isinstance(v, dict) else [v]:
            if not 0.0 <= level < 1.0:
                raise ValueError(f"must be a fraction of zeros in [0, 1) (got {level!r})")
        return v

    @field_validator("algorithm")
    @classmethod
    def _static_only(cls, v: str) -> str:
        if v != "static":
            raise ValueError(
                "only 'static' (masks fixed for the whole run) is implemented; dynamic sparsity "
                "(gmp, set, rigl) is not"
            )
        return v


class Params(_Section):
    train_input: InputParams
    eval_input: InputParams | None = None
    model: Annotated[GPT2ModelParams | LlamaModelParams | FCMLPModelParams, Field(discriminator="name")]
    optimizer: OptimizerParams
    runconfig: RunConfig
    sparsity: SparsityParams | None = None
