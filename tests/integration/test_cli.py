"""The `weightstream` command, run as a user runs it: a real subprocess through the installed entry point."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.waiting import wait_until

EXAMPLES = Path(__file__).parents[2] / "services" / "weightstream" / "examples"


def weightstream(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("weightstream")
    cmd = [exe] if exe else [sys.executable, "-m", "weightstream.cli"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_version_and_help() -> None:
    r = weightstream("--version")
    assert r.returncode == 0 and r.stdout.startswith("weightstream ")
    r = weightstream("--help")
    assert r.returncode == 0 and "train-reference" in r.stdout


def test_validate_ok_and_overrides() -> None:
    r = weightstream("validate", str(EXAMPLES / "gpt2_synthetic.yaml"), "--num_csx", "4")
    assert r.returncode == 0, r.stderr
    assert "num_csx=4" in r.stdout and "4 streamable units" in r.stdout


def test_validate_bad_file_exits_2_naming_each_key(tmp_path: Path) -> None:
    p = yaml.safe_load((EXAMPLES / "gpt2_synthetic.yaml").read_text())
    p["trainer"]["init"]["model"]["num_heads"] = 3
    p["trainer"]["init"]["loop"]["max_stepz"] = 10
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(p))
    r = weightstream("validate", str(bad))
    assert r.returncode == 2
    init = "trainer.init."  # named as written in the trainer: layout
    assert f"{init}model.hidden_size: must be divisible by {init}model.num_heads=3" in r.stderr
    assert f"{init}loop.max_stepz: is not a known key; did you mean 'max_steps'?" in r.stderr


def test_example_prints_a_valid_params_file(tmp_path: Path) -> None:
    r = weightstream("example", "fc_mlp_digits")
    assert r.returncode == 0
    (tmp_path / "p.yaml").write_text(r.stdout)
    assert weightstream("validate", str(tmp_path / "p.yaml")).returncode == 0
    r = weightstream("example", "nope")
    assert r.returncode == 2 and "gpt2_synthetic" in r.stderr


@pytest.mark.parametrize("num_csx", ["1", "2"])
def test_train_reference_writes_metrics_and_learns(tmp_path: Path, num_csx: str) -> None:
    metrics = tmp_path / "metrics.jsonl"
    r = weightstream(
        "train-reference",
        str(EXAMPLES / "fc_mlp_digits.yaml"),
        "--max_steps",
        "100",
        "--num_csx",
        num_csx,
        "--metrics",
        str(metrics),
    )
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [row for row in rows if "loss" in row]
    assert [row["step"] for row in steps] == [20, 40, 60, 80, 100]
    assert steps[-1]["loss"] < 0.5 * steps[0]["loss"]
    assert any("eval_loss" in row for row in rows)
    assert "done: 100 steps" in r.stdout


def test_a_role_will_not_start_without_its_credential(tmp_path: Path) -> None:
    r = weightstream("worker", "--port", "0")
    assert r.returncode == 2 and "--token-file is required" in r.stderr
    bad = tmp_path / "token"
    bad.write_text("secret")
    r = weightstream("memoryx", "--port", "0", "--token-file", str(bad))
    assert r.returncode == 2 and "not 64 hex digits" in r.stderr and "Traceback" not in r.stderr


def test_health_asks_a_live_role(tmp_path: Path) -> None:
    exe = shutil.which("weightstream")
    cmd = [exe] if exe else [sys.executable, "-m", "weightstream.cli"]
    ready = tmp_path / "ready.json"
    token = tmp_path / "token"
    token.write_text("ab" * 32)
    token.chmod(0o600)
    role = subprocess.Popen(
        [*cmd, "worker", "--port", "0", "--ready-file", str(ready), "--token-file", str(token)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(ready.exists, "the role's ready file", 30)
        said = json.loads(ready.read_text())
        address = said["address"]
        assert said["host"] == socket.gethostname() and said["pid"] == role.pid  # where it runs
        r = weightstream("health", "--address", address)
        # it answers without the job's credential, and then says nothing about itself
        assert r.returncode == 0 and "worker" not in r.stdout and "pid" not in r.stdout
    finally:
        role.terminate()
        role.wait(timeout=10)
    r = weightstream("health", "--address", address, "--timeout", "1")
    assert r.returncode == 1 and "unhealthy" in r.stderr


def test_a_role_on_a_lifeline_ends_when_its_standard_input_closes(tmp_path: Path) -> None:
    # how a Slurm step's role learns its coordinator is gone: srun forwards the coordinator's pipe
    exe = shutil.which("weightstream")
    cmd = [exe] if exe else [sys.executable, "-m", "weightstream.cli"]
    ready = tmp_path / "ready.json"
    role = subprocess.Popen(
        [
            *cmd,
            "worker",
            "--port",
            "0",
            "--ready-file",
            str(ready),
            "--token-file",
            "-",
            "--until-stdin-closes",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert role.stdin is not None
    try:
        role.stdin.write(b"cd" * 32 + b"\n")  # the credential: its line, and the pipe stays open
        role.stdin.flush()

        def ready_while_running() -> bool:
            assert role.poll() is None, role.communicate()[1].decode()[-2000:]
            return ready.exists()

        wait_until(ready_while_running, "the role's ready file", 30)
        # the credential read, the role serves while the pipe is open: it answers
        address = json.loads(ready.read_text())["address"]
        assert weightstream("health", "--address", address).returncode == 0
        assert role.poll() is None
        role.stdin.close()
        role.wait(timeout=20)  # its few log lines fit the pipe
    finally:
        if role.poll() is None:
            role.kill()
            role.wait(timeout=10)
    assert role.stderr is not None
    err = role.stderr.read()
    role.stderr.close()
    assert role.returncode == 0 and b"standard input closed" in err, err.decode()[-2000:]


# a whole run (~11 s) for an alias of `run`
@pytest.mark.slow
def test_fit_is_run_for_cszoo_hands(tmp_path: Path) -> None:
    """`weightstream fit` (as `cszoo fit`) trains exactly as `run`: the same checkpoint bytes."""
    from tests.integration.appliance import write_params

    params = write_params(tmp_path, max_steps=2)
    for verb in ("run", "fit"):
        r = weightstream(verb, str(params), "--model_dir", str(tmp_path / verb), "--num_csx", "2")
        assert r.returncode == 0, r.stderr
    for f in sorted((tmp_path / "run" / "checkpoint_2").glob("*.safetensors")):
        assert f.read_bytes() == (tmp_path / "fit" / "checkpoint_2" / f.name).read_bytes(), f.name
