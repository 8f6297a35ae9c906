"""`validate` and `run` check a params file by the same code path before any role starts: what one
refuses the other refuses with the same words; a finished run and an unreadable file are told at once."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.integration.appliance import sigint_at_default, weightstream_cmd

EXAMPLES = Path(__file__).parents[2] / "services" / "weightstream" / "examples"


def weightstream(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*weightstream_cmd(), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _example(tmp_path: Path, **train: object) -> Path:
    p = yaml.safe_load((EXAMPLES / "gpt2_synthetic.yaml").read_text(encoding="utf-8"))
    p["trainer"]["init"]["model_dir"] = str(tmp_path / "model_dir")
    p["trainer"]["fit"]["train_dataloader"] |= train
    p["trainer"]["fit"]["train_dataloader"] = {
        k: v for k, v in p["trainer"]["fit"]["train_dataloader"].items() if v is not None
    }
    f = tmp_path / "params.yaml"
    f.write_text(yaml.safe_dump(p), encoding="utf-8")
    return f


def test_validate_and_run_refuse_a_missing_data_dir_alike(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    f = _example(tmp_path, data_processor="TextFileDataProcessor", data_dir=str(missing))
    want = f"trainer.fit.train_dataloader.data_dir: data_dir {str(missing)!r} is not a directory"
    v, r = weightstream("validate", str(f)), weightstream("run", str(f))
    assert v.returncode == 2 and r.returncode == 2
    assert want in v.stderr and want in r.stderr
    assert not (tmp_path / "model_dir").exists()  # run started nothing


def test_an_hdf5_length_left_out_names_the_data_dir_not_the_length(tmp_path: Path) -> None:
    hdf5 = {"data_processor": "GptHDF5MapDataProcessor", "data_dir": str(tmp_path / "empty")}
    f = _example(tmp_path, **hdf5, max_sequence_length=None)  # left out: read from the files
    (tmp_path / "empty").mkdir()
    r = weightstream("validate", str(f))
    assert r.returncode == 2
    assert "max_sequence_length:" not in r.stderr
    assert "trainer.fit.train_dataloader.data_dir: no *.h5 files in data_dir" in r.stderr


def test_a_file_that_is_not_utf8_exits_2_naming_it(tmp_path: Path) -> None:
    f = tmp_path / "latin1.yaml"
    f.write_bytes((EXAMPLES / "gpt2_synthetic.yaml").read_bytes() + "# caf\xe9\n".encode("latin-1"))
    for verb in ("validate", "run"):
        r = weightstream(verb, str(f))
        assert r.returncode == 2, r.stderr
        assert f"invalid {f}" in r.stderr and "is not UTF-8 text" in r.stderr
        assert "Traceback" not in r.stderr


def test_a_finished_run_says_so_before_starting_roles(tmp_path: Path) -> None:
    f = _example(tmp_path)
    last = tmp_path / "model_dir" / "checkpoint_300"
    last.mkdir(parents=True)
    (last / "trainer_state.json").write_text(json.dumps({"global_step": 300}), encoding="utf-8")
    r = weightstream("run", str(f), timeout=30)
    assert r.returncode == 0, r.stderr
    assert "nothing to do" in r.stdout and "raise max_steps (e.g. --max_steps 600)" in r.stdout
    assert "starting" not in r.stdout and not (tmp_path / "model_dir" / "logs").exists()
    v = weightstream("validate", str(f))
    assert v.returncode == 0 and "nothing to do" in v.stdout


def test_the_key_report_is_short_unless_asked(tmp_path: Path) -> None:
    f = EXAMPLES / "gpt2_synthetic.yaml"
    short = weightstream("validate", str(f)).stdout
    assert "keys used as written (--keys all lists them); 1 worth a look:" in short
    assert "trainer.init.model.hidden_size" not in short
    assert "trainer.init.model.hidden_size = 128" in weightstream("validate", str(f), "--keys", "all").stdout
    assert "keys used as written" not in weightstream("validate", str(f), "--keys", "none").stdout


# a real run interrupted with SIGINT (~6 s); the message itself is unit-tested (test_interrupted_message)
@pytest.mark.slow
def test_ctrl_c_without_a_checkpoint_says_what_was_lost(tmp_path: Path) -> None:
    p = yaml.safe_load((EXAMPLES / "gpt2_synthetic.yaml").read_text(encoding="utf-8"))
    p["trainer"]["init"]["model_dir"] = str(tmp_path / "model_dir")
    del p["trainer"]["init"]["checkpoint"]  # a checkpoint only at the end
    f = tmp_path / "params.yaml"
    f.write_text(yaml.safe_dump(p), encoding="utf-8")
    proc = subprocess.Popen(
        [*weightstream_cmd(), "run", str(f)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_at_default,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the first logged step: training is under way
            if line.startswith("step     10"):
                break
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    m = re.search(r"interrupted at step (\d+): every role was stopped\. No checkpoint was written", err)
    assert m and int(m.group(1)) >= 10, err  # the steps the run had committed
    assert f"so the {m.group(1)} steps trained are lost; set checkpoint_steps" in err
    assert "intact" not in err
