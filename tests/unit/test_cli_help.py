"""Every command's --help of both CLIs (`weightstream` and `wsctl`), as a user reads it: no reST markup
(double backquotes) leaking out of docstrings, no "a" before a vowel's word."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from weightstream.cli import app as weightstream_app
from weightstream_client.cli import app as wsctl_app

APPS = {"weightstream": weightstream_app, "wsctl": wsctl_app}


def _command_paths(app: typer.Typer) -> Iterator[list[str]]:
    def walk(command: Any, path: list[str]) -> Iterator[list[str]]:
        yield path
        for name, sub in getattr(command, "commands", {}).items():  # a group (typer's own, not click's)
            yield from walk(sub, [*path, name])

    yield from walk(typer.main.get_command(app), [])


def _help_text(app: typer.Typer, path: list[str]) -> str:
    """The help as one line of words: rich's box drawing and line breaks taken out."""
    r = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "120", "TERM": "dumb"})
    assert r.exit_code == 0, (path, r.output)
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", r.output).split())


@pytest.mark.parametrize("cli", APPS)
def test_every_help_text_reads_as_plain_text(cli: str) -> None:
    paths = list(_command_paths(APPS[cli]))
    assert len(paths) > 10  # the walk reached the subcommands
    for path in paths:
        text = _help_text(APPS[cli], path)
        where = " ".join([cli, *path])
        assert "``" not in text, f"{where} --help: {text}"
        assert not re.search(r"\ba [aeiou]\w*", text, re.IGNORECASE) or _only_allowed(text), (
            f"{where}: {text}"
        )


def _only_allowed(text: str) -> bool:
    """ "a" before a vowel's letter is right where the word sounds a consonant ("a user", "a unit")."""
    found = re.findall(r"\ba ([aeiou]\w*)", text, re.IGNORECASE)
    return all(word.lower().startswith(("u", "one", "eu")) for word in found)
