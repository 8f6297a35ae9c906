"""``weightstream config convert`` and the key report table that ``validate`` and ``run`` print."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.text import Text

from weightstream.params import KeyUse, ParamsError, dump_params, load_params, parse_params, read_params_text
from weightstream.params.convert import to_trainer

__all__ = ["KeyView", "KeysOption", "config_app", "print_key_report"]

config_app = typer.Typer(help="Params files: convert between ModelZoo's layouts.", no_args_is_help=True)
_WIDTH = 48  # a value wider than this is cut (a data_dir list, an initializer mapping)


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip()
    text = text.removesuffix("\n...").strip()
    return text if len(text) <= _WIDTH else text[: _WIDTH - 1] + "…"


class KeyView(StrEnum):
    """Which keys ``validate`` and ``run`` list: those worth a look (default), every one, or none."""

    notable = "notable"
    all = "all"
    none = "none"


KeysOption = Annotated[
    KeyView,
    typer.Option(
        "--keys",
        help="which keys of the params file to list: notable (all but those used plainly as written), "
        "all (every key) or none",
    ),
]


def _plain(use: KeyUse) -> bool:
    """Used as written, with nothing more to say: the rows a user need not read."""
    return use.action == "used" and not use.note


def print_key_report(console: Console, report: list[KeyUse], keys: KeyView = KeyView.notable) -> None:
    """The keys the file sets, their values and what weightstream does with each: by default a one-line
    summary and only the keys not plainly used as written (not applicable, converted, with a note)."""
    if keys == KeyView.none:
        return
    # a terminal gets its own width; a pipe or a log file one row per line, so grep finds a key whole
    wide = console if console.is_terminal else Console(file=console.file, width=220, highlight=False)
    rows = report if keys == KeyView.all else [u for u in report if not _plain(u)]
    if keys != KeyView.all:
        plain = len(report) - len(rows)
        line = f"params: {plain} key{'' if plain == 1 else 's'} used as written (--keys all lists them)"
        line += f"; {len(rows)} worth a look:" if rows else ""
        wide.print(line, highlight=False)
        if not rows:
            return
    elif rows:
        wide.print(
            "params: every key; below it, what weightstream does where not simply used", highlight=False
        )
    # one key per line, never cut (a path cut in two is no longer greppable); what weightstream does with
    # it on the lines below, indented and wrapped between words: a table's narrow columns at 100 columns
    # would fold long key paths and notes mid-word
    for use in rows:
        style = "dim" if use.action == "not applicable" else ""
        wide.print(Text(f"  {use.path} = {_shown(use.value)}", style=style, overflow="fold"))
        if not _plain(use):
            what = use.action + (f": {use.note}" if use.note else "")
            wide.print(Padding(Text(what, style=style), (0, 0, 0, 6), expand=False))


class _Dumper(yaml.SafeDumper):
    """Lists of scalars (betas, data_dir) in flow style, as ModelZoo's files write them; mappings in
    block style."""


_Dumper.add_representer(
    list,
    lambda d, v: d.represent_sequence(
        "tag:yaml.org,2002:seq", v, flow_style=all(not isinstance(x, dict | list) for x in v)
    ),
)


@config_app.command("convert")
def convert(
    params: Annotated[Path, typer.Argument(help="a legacy-layout params file", show_default=False)],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="write here (default: print)", show_default=False)
    ] = None,
) -> None:
    """Rewrite a legacy params file (train_input/model/optimizer/runconfig) in ModelZoo's trainer: layout,
    as `cszoo config convert` does; the result trains bitwise the same."""
    err = Console(stderr=True)
    try:
        raw = parse_params(read_params_text(params), str(params))
    except ParamsError as e:
        err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False)
        raise typer.Exit(2) from None
    if "trainer" in raw:
        err.print(f"[red]error:[/red] {params} is already in the trainer: layout")
        raise typer.Exit(2)
    converted, notes = to_trainer(raw)
    _same_meaning(raw, converted, err)
    for note in notes:
        err.print(f"note: {escape(note)}", highlight=False)
    text = yaml.dump(converted, Dumper=_Dumper, sort_keys=False, allow_unicode=True)
    if output is None:
        print(text, end="")
        return
    output.write_text(text, encoding="utf-8")
    err.print(f"wrote {output} (check it with `weightstream validate {output}`)", highlight=False)


def _same_meaning(legacy: dict[str, Any], converted: dict[str, Any], err: Console) -> None:
    """Where the original is valid, its conversion must resolve to the very same params (so it trains
    bitwise the same): checked here rather than trusted."""
    try:
        want = dump_params(load_params(legacy))
    except ParamsError as e:
        err.print(f"note: the original does not validate yet; converted as written\n{escape(str(e))}")
        return
    if dump_params(load_params(converted)) != want:  # pragma: no cover - a bug in convert.py
        err.print("[red]error:[/red] the conversion would change what trains; please report this file")
        raise typer.Exit(1)
