"""A params file that is not UTF-8, or not YAML, is a ParamsError naming the file (and the line and
column), never a traceback or PyYAML's ``"<unicode string>"``."""

from __future__ import annotations

from pathlib import Path

import pytest

from weightstream.params import ParamsError, read_params


def test_a_file_that_is_not_utf8_names_the_file_and_the_line(tmp_path: Path) -> None:
    f = tmp_path / "latin1.yaml"
    f.write_bytes("model:\n  name: gpt2  # caf\xe9\n".encode("latin-1"))
    with pytest.raises(ParamsError) as e:
        read_params(f)
    assert e.value.source == str(f)
    assert str(f) in str(e.value)
    assert "is not UTF-8 text: byte 0xe9 at line 2" in str(e.value)


def test_malformed_yaml_names_the_file_line_and_column(tmp_path: Path) -> None:
    f = tmp_path / "broken.yaml"
    f.write_text("runconfig:\n  max_steps: 4\n  seed: 1: 2\n", encoding="utf-8")
    with pytest.raises(ParamsError) as e:
        read_params(f)
    text = str(e.value)
    assert text.startswith(f"invalid {f} (1 problem)")
    assert "is not valid YAML at line 3, column 10: mapping values are not allowed here" in text
    assert "<unicode string>" not in text
