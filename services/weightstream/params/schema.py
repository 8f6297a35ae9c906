"""The params file (ModelZoo layout and key names) as pydantic models.

Only structure and per-key ranges live here; checks that relate two sections (batch size vs num_csx,
sequence length vs positions, data processor vs model) are in ``load.py`` so each problem carries the
path of the key a user has to change.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import (
    ByteSize,
    Field,
    NonNegativeFloat,
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
DATA_PROCESSORS: tuple[str, ...] = get_args(DataProcessor)  # the Literal's values, in order


class MixtureParams(Section):
    """One dataset of a mixture: its directory and its share of the samples (weights are normalised)."""

    data_dir: str = Field(description="the dataset's directory")
    weight: PositiveFloat = Field(1.0, description="its share of the samples, relative to the others'")


class InputParams(Section):
    """The data a run trains on (``train_input``) or evaluates on (``eval_input``)."""

    data_processor: DataProcessor = Field(
        description="the reader of the data (ModelZoo's GptHDF5DataProcessor is read as "
        "GptHDF5MapDataProcessor)"
    )
    data_dir: str | list[str] | None = Field(None, description="the directory (or directories) of the data")
    mixture: list[MixtureParams] | None = Field(
        default=None, min_length=1, description="several datasets sampled by weight, instead of data_dir"
    )
    batch_size: PositiveInt = Field(description="the global batch, divided evenly across runconfig.num_csx")
    max_sequence_length: PositiveInt | None = Field(
        None, description="tokens per sample; left out: read from the HDF5 files"
    )
    shuffle: bool = Field(True, description="shuffle the samples every epoch")
    # numpy's seed sequences take no negative entropy
    shuffle_seed: NonNegativeInt = Field(0, description="the seed of the shuffle")
    micro_batch_size: PositiveInt | None = Field(
        None,
        description="samples per micro-batch on a worker (gradients accumulate over a shard's "
        "micro-batches); null: the whole shard, or the largest that fits runconfig.worker_memory_mb "
        "when that is set",
    )
    drop_last: bool | None = Field(
        None,
        description="true: each epoch is whole batches, its remainder skipped (reshuffled into the next "
        "epoch); false: a batch takes the last samples of one epoch and the first of the next. null: true "
        "for GptHDF5MapDataProcessor (ModelZoo's default), false for the others",
    )
    num_workers: NonNegativeInt = Field(
        0, description="threads an activation server reads HDF5 files with (0: one)"
    )

    @field_validator("data_processor", mode="before")
    @classmethod
    def _same_reader(cls, v: Any) -> Any:
        """ModelZoo's GptHDF5DataProcessor reads the same files as its Map variant: one reader here."""
        return "GptHDF5MapDataProcessor" if v == "GptHDF5DataProcessor" else v


class RunConfig(Section):
    """How the run is laid out and driven: workers and servers, steps, checkpoints, faults."""

    num_csx: PositiveInt = Field(1, description="CS-2 workers; the batch is divided evenly across them")
    min_num_csx: PositiveInt | None = Field(
        None,
        description="the fewest CS-2 workers the job may go on with when a lost worker cannot be started "
        "again for want of capacity (elastic_wait_s), the global batch then divided across fewer; it "
        "grows back to num_csx once capacity returns. null: num_csx (a lost worker is always replaced)",
    )
    elastic_wait_s: NonNegativeFloat = Field(
        30.0,
        description="how long, in seconds, the replacement of a lost role may wait for capacity before "
        "the job goes on with fewer workers (down to min_num_csx) or fails",
    )
    num_wgt_servers: PositiveInt = Field(1, description="MemoryX weight server shards")
    num_act_servers: PositiveInt = Field(1, description="activation servers feeding the workers data")
    max_steps: PositiveInt = Field(description="optimizer steps the run trains for")
    log_steps: PositiveInt = Field(
        10, description="log loss, gradient norm and throughput every this many steps"
    )
    checkpoint_steps: NonNegativeInt = Field(
        0, description="save a checkpoint every this many steps; 0: a checkpoint only at the end"
    )
    eval_frequency: NonNegativeInt = Field(
        0, description="evaluate every this many steps; 0: only at the end (when eval_input is given)"
    )
    eval_steps: PositiveInt = Field(1, description="batches of eval_input each evaluation reads")
    # numpy's seed sequences take no negative entropy
    seed: NonNegativeInt = Field(0, description="the seed of the initial weights, dropout and random masks")
    model_dir: str = Field("./model_dir", description="where checkpoints, logs and metrics.jsonl go")
    autoload_last_checkpoint: bool = Field(
        True, description="resume from the newest complete checkpoint in model_dir, if there is one"
    )
    keep_checkpoint_max: PositiveInt | None = Field(
        None, description="keep the newest N complete checkpoints; null: all (older name: max_checkpoints)"
    )
    # weightstream's own keys (not in ModelZoo)
    swarmx_fanout: Annotated[int, Field(ge=2)] = Field(
        4, description="children per SwarmX node; the tree's depth is log_fanout(num_csx)"
    )
    worker_memory_mb: PositiveInt | None = Field(
        None, description="a worker's memory budget for weights and activations, in MiB; null: no budget"
    )
    execution_mode: Literal["weight_streaming", "pipelined", "auto"] = Field(
        "weight_streaming",
        description="weight_streaming: each unit streams in for forward and again for backward; pipelined: "
        "the weights stay on the worker through the step (one transfer per unit per step); auto: "
        "pipelined when the model fits worker_memory_mb",
    )
    memoryx_storage: Literal["memory", "disk"] = Field(
        "memory",
        description="disk: each MemoryX shard keeps weights, optimizer state and the step's gradients in "
        "files under memoryx_dir, so the shards together can hold more than RAM",
    )
    data_plane: Literal["auto", "grpc", "shared_memory"] = Field(
        "auto",
        description="how tensor bytes travel between roles: auto: each pair of roles in shared memory "
        "(memfds; only the header over gRPC) where both are on one host and can map each other's memfds, "
        "over the network otherwise (headers over gRPC, tensor bytes as bulk TCP transfers); grpc: every "
        "pair over the network; shared_memory: as auto, and refused on a backend "
        "that never places roles on one host",
    )
    memoryx_dir: str | None = Field(
        None, description="where memoryx_storage: disk keeps its files; null: model_dir/.memoryx"
    )
    checkpoint_optimizer_state: bool = Field(
        True,
        description="false: checkpoints hold the weights only (loadable by Hugging Face, not resumable); "
        "halves their size and more for Adam",
    )
    checkpoint_max_shard_size: ByteSize = Field(
        ByteSize(5 * 10**9),
        description="the largest checkpoint file, as save_pretrained's max_shard_size (5GB, 500MB, or bytes)",
    )
    rpc_timeout_s: PositiveFloat = Field(
        120.0, description="deadline of every call and every wait between roles, in seconds"
    )
    heartbeat_timeout_s: PositiveFloat = Field(
        2.0,
        description="a role that has not answered the coordinator's heartbeats (one every 0.5 s) for this "
        "many seconds is hung (SIGSTOPped, partitioned): the step fails, and the role is killed and replaced",
    )
    # a lost shard rolls the job back to the newest snapshot or checkpoint and replays the steps since
    max_role_restarts: NonNegativeInt = Field(
        50, description="role replacements (fault recovery) a job may need in all before it fails"
    )
    memoryx_replicas: Annotated[int, Field(ge=0, le=1)] = Field(
        0,
        description="1: each MemoryX shard has a replica, a second process (on another host where the "
        "backend has hosts) that receives the same summed gradients and applies the same updates, so a "
        "lost shard fails over to it with no step replayed, at the cost of the shards' memory and "
        "optimizer work twice over; 0: a lost shard rolls back to the newest recovery point",
    )
    standby_roles: NonNegativeInt = Field(
        1,
        description="started, unconfigured processes kept per role kind for fault recovery to hand a lost "
        "role to, so that no process start is on its way (local backend only; 0: none)",
    )
    recovery_snapshot_steps: NonNegativeInt = Field(
        10,
        description="the MemoryX shards save a recovery snapshot every this many steps; a lost shard rolls "
        "back to the newest snapshot or checkpoint (0: checkpoints only)",
    )
    checkpoint_path: str | None = Field(
        None,
        description="a Hugging Face save_pretrained directory whose weights start the run (optimizer state "
        "and step start fresh; a checkpoint of the run's own model_dir, when there is one, wins)",
    )
    save_initial_checkpoint: bool = Field(
        False, description="save a checkpoint of the weights before the first step"
    )

    @property
    def worker_counts(self) -> range:
        """Every number of workers the job may train with: ``min_num_csx`` (``num_csx`` when unset) to
        ``num_csx``; empty when ``min_num_csx`` exceeds ``num_csx`` (a problem ``validate`` reports)."""
        return range(self.min_num_csx or self.num_csx, self.num_csx + 1)

    @model_validator(mode="before")
    @classmethod
    def _older_spelling(cls, v: Any) -> Any:
        """ModelZoo's older ``max_checkpoints`` is ``keep_checkpoint_max``."""
        return renamed(v, {"max_checkpoints": "keep_checkpoint_max"})


class Params(Section):
    """A params file in ModelZoo's legacy layout (a ``trainer:`` file is translated into it first)."""

    train_input: InputParams = Field(description="the training data")
    eval_input: InputParams | None = Field(None, description="the evaluation data; left out: no evaluation")
    model: Annotated[
        GPT2ModelParams | LlamaModelParams | FCMLPModelParams,
        Field(discriminator="name", description="the model; name picks the family"),
    ]
    optimizer: OptimizerParams = Field(description="the optimizer and its learning-rate schedule")
    runconfig: RunConfig = Field(description="how the run is laid out and driven")
    sparsity: SparsityParams | None = Field(None, description="weight sparsity; left out: dense")
