"""The params file: ModelZoo layout, validated before anything is scheduled."""

from weightstream.params.errors import ParamsError, Problem
from weightstream.params.load import dump_params, load_params, model_def, optimizer_config, parse_params
from weightstream.params.schema import Params

__all__ = [
    "Params",
    "ParamsError",
    "Problem",
    "dump_params",
    "load_params",
    "model_def",
    "optimizer_config",
    "parse_params",
]
