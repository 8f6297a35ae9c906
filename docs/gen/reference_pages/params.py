"""The params keys page: every key of the legacy layout from the pydantic models that validate it, the
``trainer:`` layout's keys and where each lands, and the ModelZoo keys weightstream knows but does not use.

Types, defaults and meanings are the models' own (``Field(description=...)``, class docstrings); the
tables of the ``trainer:`` layout and of known ModelZoo keys are the ones the validator reads.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from reference_pages._markdown import code, paragraphs, table, text
from reference_pages._types import type_text, yaml_value

__all__ = ["SectionDoc", "key_rows", "params_page", "params_sections", "section_page"]


@dataclass
class SectionDoc:
    """One params model as the page shows it: the key paths it sits at (the first names its keys), and
    which value of its union's tag picks it (``name: llama``)."""

    model: type[BaseModel]
    paths: list[str]
    which: str = ""
    depth: int = 0
    children: list[SectionDoc] = field(default_factory=list)


def _members(t: Any, path: str) -> Iterator[tuple[type[BaseModel], str, list[type[BaseModel]]]]:
    """(model, its path, the models of its union) of every params model inside annotation ``t``."""
    origin, args = get_origin(t), get_args(t)
    if origin is Annotated:
        yield from _members(args[0], path)
    elif origin in (Union, types.UnionType):
        union = [_bare(a) for a in args if isinstance(_bare(a), type) and issubclass(_bare(a), BaseModel)]
        for a in args:
            for model, at, siblings in _members(a, path):
                yield model, at, siblings if siblings else union
    elif origin is list:
        yield from _members(args[0], f"{path}[n]")
    elif origin is dict:
        yield from _members(args[1], f"{path}[glob]")
    elif isinstance(t, type) and issubclass(t, BaseModel) and not t.__name__.startswith("_"):
        yield t, path, []


def _bare(t: Any) -> Any:
    """``t`` without its ``Annotated`` metadata (a union member's ``Tag``)."""
    return get_args(t)[0] if get_origin(t) is Annotated else t


def _tag(model: type[BaseModel], union: list[type[BaseModel]]) -> str:
    """``name: gpt2, gpt3``: the literal field that tells ``model`` from the rest of its union."""
    if len(union) < 2:
        return ""
    for key in ("name", "type"):
        f = model.model_fields.get(key)
        if f is not None and get_origin(f.annotation) is Literal:
            return f"{key}: {', '.join(str(v) for v in get_args(f.annotation))}"
    return ""


def params_sections(root: type[BaseModel], prefix: str = "") -> list[SectionDoc]:
    """The params models under ``root`` (not ``root`` itself), depth first, each once, at the first path
    it is found at and with every other path it also sits at."""
    seen: dict[type[BaseModel], SectionDoc] = {}

    def walk(model: type[BaseModel], path: str, depth: int, into: list[SectionDoc]) -> None:
        for key, f in model.model_fields.items():
            here = f"{path}.{key}" if path else key
            for member, at, union in _members(f.annotation, here):
                if member in seen:
                    if at not in seen[member].paths:
                        seen[member].paths.append(at)
                    continue
                doc = seen[member] = SectionDoc(member, [at], _tag(member, union), depth)
                into.append(doc)
                walk(member, at, depth + 1, doc.children)

    top: list[SectionDoc] = []
    walk(root, prefix, 0, top)
    return top


def _default(f: FieldInfo) -> str:
    if f.is_required():
        return "required"
    value = f.get_default(call_default_factory=True)
    return code(yaml_value(value))


def _doc(model: type[BaseModel]) -> str:
    """The model's own docstring (not one it inherits)."""
    return (model.__dict__.get("__doc__") or "").strip()


def key_rows(doc: SectionDoc) -> list[list[str]]:
    """Key, type, default, meaning of each key of the section, keys named by their full path."""
    return [
        [code(f"{doc.paths[0]}.{key}"), type_text(f.annotation, f.metadata), _default(f), _meaning(f)]
        for key, f in doc.model.model_fields.items()
    ]


def _meaning(f: FieldInfo) -> str:
    out = text(f.description or "", cell=True)
    nested = [m for m, _, _ in _members(f.annotation, "")]
    if nested:
        out += ("; " if out else "") + "its keys are below"
    return out


def section_page(
    docs: list[SectionDoc], level: int = 2, extras: Mapping[type[BaseModel], str] | None = None
) -> str:
    """The sections ``docs`` (and their children) as headings, introductions and key tables; ``extras``:
    markdown to add after a model's table."""
    extras = extras or {}
    out = []
    for doc in docs:
        heading = ", ".join(code(p) for p in doc.paths)
        if doc.which:
            heading += f" ({doc.which})"
        out.append(f"{'#' * min(level + doc.depth, 4)} {heading}\n")
        if _doc(doc.model):
            out.append(paragraphs(_doc(doc.model)) + "\n")
        if len(doc.paths) > 1:
            out.append(
                f"The same keys at each of these paths; the table names them at {code(doc.paths[0])}.\n"
            )
        out.append(table(["Key", "Type", "Default", "Meaning"], key_rows(doc)))
        out.append(extras.get(doc.model, ""))
        out.append(section_page(doc.children, level, extras))
    return "\n".join(part for part in out if part)


def params_page() -> str:
    """The page of params keys: the legacy layout's sections, the ``trainer:`` layout, the known ModelZoo
    keys."""
    from reference_pages.layouts import (
        initializer_table,
        known_keys_section,
        scheduler_table,
        trainer_section,
    )
    from weightstream.params.initializer_schema import InitializerParams
    from weightstream.params.optimizer_schema import SchedulePieceParams
    from weightstream.params.schema import Params

    intro = (
        "A params file is ModelZoo's: the legacy layout's sections below, or the `trainer:` layout, which "
        "is translated into them key by key. An unknown key is an error (with the nearest known one), "
        "never ignored; `weightstream validate` checks a file and prints its key report.\n"
    )
    extras: dict[type[BaseModel], str] = {
        InitializerParams: "Each kind takes its own parameters; validation fills in the defaults:\n\n"
        + initializer_table(),
        SchedulePieceParams: "The keys each scheduler takes (any other is refused):\n\n" + scheduler_table(),
    }
    return "\n".join(
        [
            "# Params keys\n",
            intro,
            section_page(params_sections(Params), extras=extras),
            trainer_section(),
            known_keys_section(),
        ]
    )
