"""The params file (ModelZoo layout and key names) as pydantic models.

Only structure and per-key ranges live here; checks that relate two sections (batch size vs num_csx,
sequence length vs positions, data processor vs model) are in ``load.py`` so each problem carries the
path of the key a user has to change.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    ByteSize,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from weightstream.params.model_schema import (
    ExtraAttentionParams,
    FCMLPModelParams,
    GPT2ModelParams,
    LanguageModelParams,
    LlamaModelParams,
)
from weightstream.params.optimizer_schema import OptimizerParams, SchedulePieceParams
from weightstream.params.section import Section, renamed
from weightstream.params.sparsity_schema import SparsityParams

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


DataProcessor = Literal[
    "TextFileDataProcessor",
    "TokenFileDataProcessor",
    "GptHDF5MapDataProcessor",
    "SyntheticDataProcessor",
    "DigitsDataProcessor",
]
DATA_PROCESSORS: tuple[str, ...] = DataProcessor.__args__  # type: ignore[attr-defined]


class MixtureParams(Section):
    """One dataset of a mixture: its directory and its share of the samples (weights are normalised)."""

    data_dir: str
    weight: PositiveFloat = 1.0


class InputParams(Section):
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


class RunConfig(Section):
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

    @model_validator(mode="before")
    @classmethod
    def _older_spelling(cls, v: Any) -> Any:
        """ModelZoo's older ``max_checkpoints`` is ``keep_checkpoint_max``."""
        return renamed(v, {"max_checkpoints": "keep_checkpoint_max"})


class Params(Section):
    train_input: InputParams
    eval_input: InputParams | None = None
    model: Annotated[GPT2ModelParams | LlamaModelParams | FCMLPModelParams, Field(discriminator="name")]
    optimizer: OptimizerParams
    runconfig: RunConfig
    sparsity: SparsityParams | None = None
