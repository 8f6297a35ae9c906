"""The parts of the params page that come from the validator's tables rather than its models: the
``trainer:`` layout's keys and where each lands, the keys of each initializer and scheduler, and the
ModelZoo keys weightstream knows but does not use (the key report's "not applicable" and the refused)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import TypeVar

from reference_pages._markdown import code, paragraphs, table, text
from weightstream.params.initializer_schema import kind_parameters
from weightstream.params.load import READ_FIRST
from weightstream.params.modelzoo import UNSUPPORTED
from weightstream.params.not_applicable import NOT_APPLICABLE, Rule
from weightstream.params.optimizer_schema import SCHEDULER_KEYS
from weightstream.params.trainer_keys import HOMES, PLAIN

__all__ = [
    "initializer_table",
    "known_keys_section",
    "not_applicable_rows",
    "read_first_rows",
    "refused_rows",
    "scheduler_table",
    "trainer_rows",
    "trainer_section",
]

# PLAIN's tables sit under trainer.init, cluster_config under trainer.init.backend
_PLAIN_AT = {"cluster_config": "trainer.init.backend.cluster_config"}


def initializer_table() -> str:
    """Every initializer kind with the parameters it takes and their defaults."""
    rows = [
        [
            code(name),
            ", ".join(f"{code(k)} = {text(v, cell=True)}" for k, v in params.items()) or "none",
        ]
        for name, params in kind_parameters().items()
    ]
    return table(["name", "Its parameters (default)"], rows)


def scheduler_table() -> str:
    """The keys each scheduler takes (a key of another is refused, naming the schedulers that take it)."""
    rows = [[code(name), ", ".join(code(k) for k in sorted(keys))] for name, keys in SCHEDULER_KEYS.items()]
    return table(["scheduler", "Takes"], rows)


def trainer_rows() -> list[tuple[str, str]]:
    """(trainer key path, where it lands in the legacy layout) of every key the layout places."""
    rows = [
        (f"{_PLAIN_AT.get(section, f'trainer.init.{section}')}.{key}", legacy)
        for section, keys in PLAIN.items()
        for key, legacy in keys.items()
    ]
    return rows + list(HOMES.items())


def trainer_section() -> str:
    intro = (
        "ModelZoo 2.3 and later write `trainer:` (`trainer.init`, `trainer.fit`); weightstream translates "
        "it into the legacy layout above, key by key, and names every problem and every line of the key "
        "report at the path you wrote. `trainer` may also be a list of one trainer.\n"
    )
    rows = [[code(key), _home(home)] for key, home in sorted(trainer_rows())]
    return "\n".join(["## The `trainer:` layout\n", intro, table(["Key", "Lands at"], rows)])


def _home(home: str) -> str:
    """A legacy key path as code; a sentence as text."""
    return code(home) if re.fullmatch(r"[\w.]+", home) else text(home, cell=True)


def _rule_values(rule: Rule) -> str:
    default = next(f.default for f in dataclasses.fields(Rule) if f.name == "harmless")
    return "any" if rule.harmless is default else "those that change nothing (see why); others are refused"


def read_first_rows() -> list[tuple[str, str]]:
    """(key path, what is done with it) of the keys read before validation, from their readers' docs."""
    return [(path, " ".join((read.__doc__ or "").split())) for path, read in READ_FIRST.items()]


V = TypeVar("V")


def _by_key(per_section: Mapping[str, Mapping[str, V]]) -> list[tuple[list[str], V]]:
    """(the key's paths, its value) of a per-section table; sections that share one table (train_input
    and eval_input) give each key once, with both paths. Section "" is the top level."""
    shared: list[tuple[list[str], Mapping[str, V]]] = []
    for section, keys in per_section.items():
        same = next((names for names, k in shared if k is keys), None)
        if same is None:
            shared.append(([section], keys))
        else:
            same.append(section)
    return [
        ([f"{s}.{key}" if s else key for s in sections], value)
        for sections, keys in shared
        for key, value in keys.items()
    ]


def not_applicable_rows() -> list[tuple[list[str], str, str]]:
    """(key paths, values accepted, why it changes nothing) of every not-applicable ModelZoo key."""
    return [(paths, _rule_values(rule), rule.reason) for paths, rule in _by_key(NOT_APPLICABLE)]


def refused_rows() -> list[tuple[list[str], str]]:
    """(key paths, why) of every ModelZoo key weightstream refuses whatever its value."""
    return _by_key(UNSUPPORTED)


def _paths(paths: list[str]) -> str:
    return "<br>".join(code(p) for p in paths)


def known_keys_section() -> str:
    intro = (
        "`weightstream validate` and the start of `weightstream run` print the key report: every key of "
        "the file, its value and what weightstream does with it. A key of the tables above is *used*. "
        "These ModelZoo keys are known too: a *not applicable* one is accepted and changes nothing here "
        "(reported with the reason); a refused one would change what trains if it were ignored, so the "
        "file is refused, naming it.\n"
    )
    first = [[code(p), text(what, cell=True)] for p, what in read_first_rows()]
    na = [[_paths(p), values, text(why, cell=True)] for p, values, why in not_applicable_rows()]
    refused = [[_paths(p), text(why, cell=True)] for p, why in refused_rows()]
    return "\n".join(
        [
            "## Known ModelZoo keys\n",
            intro,
            "### Read before validation\n",
            paragraphs("These switches are applied to the file before the tables above validate it."),
            "",
            table(["Key", "What it does"], first),
            "### Not applicable\n",
            table(["Key", "Values accepted", "Why it changes nothing"], na),
            "### Refused\n",
            table(["Key", "Why"], refused),
        ]
    )
