"""Python type annotations of params fields as short markdown a YAML writer reads: ``int`` (> 0),
``"memory"`` or ``"disk"``, list of ..., mapping (a section below)."""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel, ByteSize
from pydantic.fields import FieldInfo

from reference_pages._markdown import code

__all__ = ["type_text", "yaml_value"]

_BOUNDS: tuple[tuple[type, str, str], ...] = (
    (at.Gt, "gt", "> {}"),
    (at.Ge, "ge", "≥ {}"),
    (at.Lt, "lt", "< {}"),
    (at.Le, "le", "≤ {}"),
    (at.MinLen, "min_length", "≥ {} entries"),
    (at.MaxLen, "max_length", "≤ {} entries"),
)


def yaml_value(v: Any) -> str:
    """``v`` as it is written in a params file (``true``, ``null``, ``[0.9, 0.999]``)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(yaml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def _bounds(metadata: Any) -> list[str]:
    out = []
    for item in metadata:
        if isinstance(item, FieldInfo):
            out += _bounds(item.metadata)
            continue
        for kind, attr, form in _BOUNDS:
            if isinstance(item, kind):
                out.append(form.format(getattr(item, attr)))
    return out


def type_text(annotation: Any, metadata: Any = ()) -> str:
    """A field's annotation (and the constraints pydantic moved into ``metadata``) as markdown."""
    bounds = _bounds(metadata)
    base = _text(annotation)
    return f"{base} ({', '.join(bounds)})" if bounds else base


def _text(t: Any) -> str:
    origin, args = get_origin(t), get_args(t)
    if origin is Annotated:
        return type_text(args[0], args[1:])
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        texts = list(dict.fromkeys(_text(a) for a in options))
        out = " or ".join(texts)
        return f"{out} or {code('null')}" if len(options) < len(args) else out
    if origin is Literal:
        return " or ".join(code(yaml_value(a)) for a in args)
    if origin is list:
        return f"list of {_text(args[0])}"
    if origin is tuple:
        return "[" + ", ".join(_text(a) for a in args) + "]"
    if origin is dict:
        return f"mapping of {_text(args[0])} to {_text(args[1])}"
    if isinstance(t, type) and issubclass(t, BaseModel):
        return "mapping"
    if t is ByteSize:
        return f"size ({code('5GB')}, {code('500MB')} or bytes)"
    if t is Any:
        return "any"
    return code(getattr(t, "__name__", str(t)))
