"""The key report ``validate`` and ``run`` print: by default a summary line and only the keys worth a
look; ``--keys all`` every key; ``--keys none`` nothing. At 100 columns nothing is cut mid-word."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from weightstream.config_cli import KeyView, print_key_report
from weightstream.params import KeyUse, read_params

EXAMPLES = sorted((Path(__file__).parents[2] / "services" / "weightstream" / "examples").glob("*.yaml"))

REPORT = [
    KeyUse("trainer.init.model.name", "gpt2", "used"),
    KeyUse("trainer.init.model.hidden_size", 128, "used"),
    KeyUse("trainer.init.backend.backend_type", "CSX", "not applicable", "weightstream is its own device"),
    KeyUse(
        "trainer.init.model.fp16_type", "bfloat16", "used", "bfloat16 on the wire; master weights stay fp32"
    ),
]


def _shown(report: list[KeyUse], keys: KeyView, width: int = 100) -> str:
    buf = io.StringIO()
    print_key_report(Console(file=buf, width=width, force_terminal=True, color_system=None), report, keys)
    return buf.getvalue()


def test_by_default_only_the_keys_worth_a_look() -> None:
    text = _shown(REPORT, KeyView.notable)
    assert text.splitlines()[0] == "params: 2 keys used as written (--keys all lists them); 2 worth a look:"
    assert "backend_type = CSX" in text and "fp16_type = bfloat16" in text
    assert "model.name" not in text and "hidden_size" not in text


def test_all_lists_every_key_and_none_nothing() -> None:
    text = _shown(REPORT, KeyView.all)
    assert all(f"{u.path} = " in text for u in REPORT)
    assert _shown(REPORT, KeyView.none) == ""


def test_nothing_worth_a_look_is_one_line() -> None:
    assert _shown(REPORT[:2], KeyView.notable) == "params: 2 keys used as written (--keys all lists them)\n"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("keys", [KeyView.notable, KeyView.all])
def test_no_row_is_cut_mid_word_at_100_columns(example: Path, keys: KeyView) -> None:
    report = read_params(example).report
    report.append(
        KeyUse(
            "trainer.init.model.fp16_type",
            "cbfloat16",
            "used",
            "runs as bfloat16 (cbfloat16 is the CS-2's own format; weightstream has no such type) " * 2,
        )
    )
    text = _shown(report, keys)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100
    words = set(text.split())
    rows = report if keys == KeyView.all else [u for u in report if u.action != "used" or u.note]
    for use in rows:
        assert any(line.strip().startswith(f"{use.path} = ") for line in lines), use.path
        if use.action != "used" or use.note:  # what weightstream does, its words whole
            for word in f"{use.action}: {use.note}".split():
                assert word in words, (use.path, word)
