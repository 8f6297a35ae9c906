"""The CS-2 worker's math and MemoryX's optimizer: pure numpy, no I/O, no distribution code."""

from weightstream.numerics.fc_mlp import FCMLPConfig, build_fc_mlp
from weightstream.numerics.gpt2 import GPT2Config, build_gpt2
from weightstream.numerics.llama import LlamaConfig, build_llama
from weightstream.numerics.model import ModelDef, ParamSpec, Unit, forward_backward, forward_loss, init_params
from weightstream.numerics.optim import OptimizerConfig, SchedulePiece

__all__ = [
    "FCMLPConfig",
    "GPT2Config",
    "LlamaConfig",
    "ModelDef",
    "OptimizerConfig",
    "ParamSpec",
    "SchedulePiece",
    "Unit",
    "build_fc_mlp",
    "build_gpt2",
    "build_llama",
    "forward_backward",
    "forward_loss",
    "init_params",
]
