"""The generated reference pages list exactly what the code has: every command and option of both CLIs,
every params key, every REST operation and every Prometheus metric, each gathered here from the code
itself (click trees, pydantic models, app.routes, a scrape) rather than through the renderers."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "gen"))  # the renderers live beside docs/gen/reference.py

from reference_pages import pages  # noqa: E402
from reference_pages._markdown import code, text  # noqa: E402
from reference_pages.metrics import metrics_page, sample_service  # noqa: E402
from reference_pages.params import params_page  # noqa: E402

from weightstream.jobs.metrics import register_metrics  # noqa: E402
from weightstream.params.initializer_schema import INITIALIZER_NAMES  # noqa: E402
from weightstream.params.load import READ_FIRST  # noqa: E402
from weightstream.params.modelzoo import UNSUPPORTED  # noqa: E402
from weightstream.params.not_applicable import NOT_APPLICABLE  # noqa: E402
from weightstream.params.optimizer_schema import SCHEDULERS  # noqa: E402
from weightstream.params.schema import Params  # noqa: E402
from weightstream.params.trainer_keys import HOMES, INIT_KEYS, PLAIN  # noqa: E402


def _sections(page: str, level: str = "## ") -> dict[str, str]:
    """{heading text: the text up to the next heading of that level}."""
    parts = re.split(rf"^{level}(.+)$", page, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _first_cells(body: str) -> list[str]:
    """The first cell of every table row of ``body`` (header and rule rows left out)."""
    lines = body.splitlines()
    rows = [
        line
        for line, after in zip(lines, [*lines[1:], ""], strict=True)
        if line.startswith("| ") and not after.startswith("|---")  # a header is followed by its rule
    ]
    return [row[2:].split(" | ", 1)[0] for row in rows]


# --- the CLIs ---------------------------------------------------------------------------------------


def _click_truth(root: Any, name: str) -> dict[str, set[str]]:
    """{command path: the names of its arguments and options} of every visible command under ``root``."""
    out: dict[str, set[str]] = {}

    def walk(command: Any, ctx: Any) -> None:
        out[ctx.command_path] = {
            o
            for p in command.params
            if not p.hidden
            for o in ([p.name] if p.param_type_name == "argument" else [*p.opts, *p.secondary_opts])
        }
        for sub_name in command.list_commands(ctx) if hasattr(command, "list_commands") else []:
            sub = command.get_command(ctx, sub_name)
            if not sub.hidden:
                walk(sub, sub.context_class(sub, info_name=sub_name, parent=ctx))

    walk(root, root.context_class(root, info_name=name))
    return out


CLIS = [
    pytest.param(pages.service_cli, "weightstream", "reference/cli.md", id="weightstream"),
    pytest.param(pages.wsctl_cli, "wsctl", "reference/wsctl.md", id="wsctl"),
]


@pytest.mark.parametrize(("tree", "name", "page"), CLIS)
def test_cli_page_has_every_command_and_no_other(tree: Any, name: str, page: str) -> None:
    truth = _click_truth(tree(), name)
    assert len(truth) > 5
    assert set(_sections(pages.PAGES[page]())) == set(truth)


@pytest.mark.parametrize(("tree", "name", "page"), CLIS)
def test_cli_page_lists_exactly_each_commands_arguments_and_options(tree: Any, name: str, page: str) -> None:
    sections = _sections(pages.PAGES[page]())
    for path, names in _click_truth(tree(), name).items():
        listed = _first_cells(sections[path].split("| Argument or option |", 1)[-1])
        if "| Argument or option |" not in sections[path]:
            listed = []
        shown = {n for cell in listed for n in re.findall(r"`([^`]+)`", cell)}
        assert shown == names, path


def test_cli_page_shows_types_defaults_help_and_usage() -> None:
    page = pages.PAGES["reference/wsctl.md"]()
    submit = _sections(page)["wsctl submit"]
    assert "wsctl submit [OPTIONS]" in submit
    assert "| `--priority` | `int` (1 ≤ x ≤ 3) | `2` | 1 runs first |" in submit
    assert "| `--follow`, `-f` | flag | off |" in submit
    assert "| `params` | `file` | required |" in submit


# --- params -----------------------------------------------------------------------------------------


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in get_args(annotation):
        yield from _models_in(arg)


def _params_models() -> list[type[BaseModel]]:
    """Every params model a file can reach from ``Params``; a private one (the refused level schedule
    types) holds no key a user can write."""
    seen: list[type[BaseModel]] = []
    todo: list[type[BaseModel]] = [Params]
    while todo:
        for f in todo.pop().model_fields.values():
            for m in _models_in(f.annotation):
                if m not in seen and not m.__name__.startswith("_"):
                    seen.append(m)
                    todo.append(m)
    return seen


def _legacy_tables(page: str) -> list[set[str]]:
    """The keys of each key table of the legacy layout's sections (each key by its last name)."""
    legacy = page.split("## The `trainer:` layout")[0]
    tables = re.findall(r"^\| Key \| Type \| Default \| Meaning \|\n\|[-|]+\|\n((?:\|.*\n)+)", legacy, re.M)
    return [{re.split(r"[.\]]", c.strip("`"))[-1] for c in _first_cells(t)} for t in tables]


def test_params_page_has_one_table_per_params_model_with_exactly_its_keys() -> None:
    truth = sorted(sorted(m.model_fields) for m in _params_models())
    assert len(truth) >= 12
    assert sorted(sorted(t) for t in _legacy_tables(params_page())) == truth


def test_params_page_names_keys_by_their_full_path() -> None:
    page = params_page()
    for path in (
        "train_input.batch_size",
        "train_input.mixture[n].weight",
        "model.extra_attention_params.num_kv_groups",
        "model.initializer.std",
        "optimizer.learning_rate[n].total_iters",
        "runconfig.max_steps",
        "sparsity.sparsity.slope",
        "sparsity.update.freq",
    ):
        assert f"| `{path}` |" in page, path


def test_every_params_key_is_described_in_the_code() -> None:
    """The page's meanings come from the models: a key without a description would show none."""
    missing = [
        f"{m.__name__}.{k}" for m in _params_models() for k, f in m.model_fields.items() if not f.description
    ]
    assert not missing


def test_params_page_lists_initializer_kinds_and_scheduler_keys() -> None:
    page = params_page()
    for name in (*INITIALIZER_NAMES, *SCHEDULERS):
        assert f"| `{name}` |" in page, name


def test_params_page_lists_the_trainer_layout() -> None:
    page = params_page()
    trainer = page.split("## The `trainer:` layout")[1].split("## Known ModelZoo keys")[0]
    keys = {c.strip("`") for c in _first_cells(trainer)}
    plain = {
        f"trainer.init.{'backend.' if s == 'cluster_config' else ''}{s}.{k}"
        for s, t in PLAIN.items()
        for k in t
    }
    assert keys == plain | set(HOMES)
    # every trainer.init key the translation knows is on the page, under its own or PLAIN's table
    placed = {k.removeprefix("trainer.init.") for k in HOMES if k.startswith("trainer.init.")}
    assert set(INIT_KEYS) == placed | (set(PLAIN) - {"cluster_config"})


def test_params_page_lists_every_known_modelzoo_key() -> None:
    known = params_page().split("## Known ModelZoo keys")[1]
    read_first, rest = known.split("### Not applicable")
    for key in READ_FIRST:
        assert f"| {code(key)} |" in read_first, key
    not_applicable, refused = rest.split("### Refused")
    for table, keys in ((not_applicable, NOT_APPLICABLE), (refused, UNSUPPORTED)):
        for section, names in keys.items():
            for key in names:
                assert code(f"{section}.{key}" if section else key) in table, (section, key)


# --- REST API ---------------------------------------------------------------------------------------


def _routes(routes: list[Any]) -> Iterator[tuple[str, str]]:
    """(METHOD, path) of every documented route, into included routers."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _routes(inner.routes)
        elif getattr(route, "include_in_schema", False):
            yield from ((m, route.path) for m in route.methods - {"HEAD", "OPTIONS"})


def test_rest_page_has_every_route_and_no_other() -> None:
    app = pages.rest_app()
    truth = {f"{m} {p}" for m, p in _routes(app.routes)}  # type: ignore[attr-defined]
    sections = _sections(pages.PAGES["reference/rest-api.md"]())
    assert len(truth) >= 10
    assert set(sections) - {"Schemas"} == truth


def test_rest_page_shows_each_operations_parameters_responses_and_auth() -> None:
    doc = pages.rest_app().openapi()  # type: ignore[attr-defined]
    sections = _sections(pages.PAGES["reference/rest-api.md"]())
    for path, item in doc["paths"].items():
        for method, op in item.items():
            body = sections[f"{method.upper()} {path}"]
            for p in op.get("parameters", []):
                assert f"| `{p['name']}` | {p['in']} |" in body, (path, p["name"])
            for status in op["responses"]:
                assert f"| `{status}` |" in body, (path, status)
            bearer = "Bearer" in body.split("\n\n")[1]
            assert bearer == path.startswith("/v1/"), path


def test_rest_page_lists_every_schema_field() -> None:
    doc = pages.rest_app().openapi()  # type: ignore[attr-defined]
    schemas = _sections(pages.PAGES["reference/rest-api.md"](), "### ")
    for name, schema in doc["components"]["schemas"].items():
        assert set(_first_cells(schemas[name])) == {f"`{k}`" for k in schema.get("properties", {})}, name


# --- metrics ----------------------------------------------------------------------------------------


def test_metrics_page_lists_exactly_the_scraped_series() -> None:
    registry = CollectorRegistry()
    register_metrics(registry, sample_service())
    scraped = {
        line.split("{")[0].split()[0]
        for line in generate_latest(registry).decode().splitlines()
        if line and not line.startswith("#")
    }
    page = metrics_page(registry)
    listed = {n for cell in _first_cells(page) for n in re.findall(r"`([^`]+)`", cell)}
    assert "weightstream_job_step" in scraped  # the per-job families, with a running job
    assert listed == scraped


# --- markdown ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "cell", "shown"),
    [
        ("a | b", True, "a \\| b"),
        ("keeps `a | b` as code", True, "keeps `a | b` as code"),
        ("``wsctl``: the client", False, "``wsctl``: the client"),
        ("logs/*.log and <id>.tar.gz", False, "logs/\\*.log and \\<id\\>.tar.gz"),
        ("an odd ` quote", False, "an odd \\` quote"),
        ("two\nlines", True, "two lines"),
    ],
)
def test_text_renders_literally(raw: str, cell: bool, shown: str) -> None:
    assert text(raw, cell=cell) == shown


def test_code_span_holds_backquotes() -> None:
    assert code("a`b") == "``a`b``"
    assert code("`x`") == "`` `x` ``"
