"""``weightstream plot`` through typer's CliRunner, registered as the CLI registers it: a PNG of several runs'
curves from their metrics.jsonl, and bad input refused with exit 2 and a message naming the directory,
file and line, or the extra to install."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from weightstream.training.plot import plot, read_curves

app = typer.Typer()
app.command()(plot)


@app.callback()
def _main() -> None:
    """Subcommands, as in ``weightstream``: ``plot`` is invoked by its name."""


runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _model_dir(tmp_path: Path, name: str, scale: float, steps: int = 8) -> Path:
    """A model_dir whose metrics.jsonl has ``steps`` training records and an evaluation every 4 steps."""
    d = tmp_path / name
    d.mkdir()
    rows = []
    for step in range(1, steps + 1):
        rows.append(
            {"step": step, "loss": scale * (5.0 - 0.3 * step), "learning_rate": 1e-3, "grad_norm": 1.0}
        )
        if step % 4 == 0:
            rows.append({"step": step, "eval_loss": scale * (5.1 - 0.3 * step)})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_two_runs_make_one_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is the optional extra weightstream[plot]")
    a, b = _model_dir(tmp_path, "a", 1.0), _model_dir(tmp_path, "b", 0.9, steps=12)
    out = tmp_path / "curves.png"
    r = runner.invoke(app, ["plot", str(a), str(b), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert f"plot: {out}" in r.output
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000  # a drawn figure, not an empty file


def test_a_dir_without_metrics_is_named(tmp_path: Path) -> None:
    a = _model_dir(tmp_path, "a", 1.0)
    empty = tmp_path / "not_a_run"
    empty.mkdir()
    out = tmp_path / "curves.png"
    r = runner.invoke(app, ["plot", str(a), str(empty), "-o", str(out)])
    assert r.exit_code == 2
    assert f"{empty} has no metrics.jsonl" in " ".join(r.output.split())
    assert not out.exists()
    r = runner.invoke(app, ["plot", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "missing: no such directory" in r.output


def test_without_matplotlib_it_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    a = _model_dir(tmp_path, "a", 1.0)
    r = runner.invoke(app, ["plot", str(a), "-o", str(tmp_path / "c.png")])
    assert r.exit_code == 2
    assert 'pip install "weightstream[plot]"' in r.output and not (tmp_path / "c.png").exists()


def test_an_output_in_a_missing_directory_is_refused_before_drawing(tmp_path: Path) -> None:
    a = _model_dir(tmp_path, "a", 1.0)
    r = runner.invoke(app, ["plot", str(a), "-o", str(tmp_path / "no" / "c.png")])
    assert r.exit_code == 2 and "no directory" in r.output


def test_records_a_restart_wrote_twice_keep_the_last_and_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    lines = [
        {"step": 1, "loss": 4.0},
        {"step": 2, "loss": 3.0},
        {"step": 2, "eval_loss": 3.5},
        {"step": 1, "loss": 4.5},  # a second run from scratch, appended
    ]
    text = "".join(json.dumps(r) + "\n" for r in lines)
    (d / "metrics.jsonl").write_text(text + '{"step": 2, "lo')  # torn by a crash
    curves = read_curves(d)
    assert curves.train == {1: 4.5, 2: 3.0} and curves.evals == {2: 3.5}


def test_a_bad_line_is_named_by_file_and_line(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"step": 1, "loss": 4.0}\nnot json\n{"step": 2, "loss": 3.0}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a metrics record"):
        read_curves(d)
    (d / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="has no loss logged yet"):
        read_curves(d)
