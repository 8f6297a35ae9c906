"""The params file: ModelZoo layout, validated before anything is scheduled."""

from weightstream.params.errors import ParamsError, Problem
from weightstream.params.layout import KeyUse
from weightstream.params.load import (
    Loaded,
    dump_params,
    load_params,
    model_def,
    optimizer_config,
    parse_params,
    read_params,
    read_params_text,
)
from weightstream.params.schema import Params

__all__ = [
    "KeyUse",
    "Loaded",
    "Params",
    "ParamsError",
    "Problem",
    "dump_params",
    "load_params",
    "model_def",
    "optimizer_config",
    "parse_params",
    "read_params",
    "read_params_text",
]
