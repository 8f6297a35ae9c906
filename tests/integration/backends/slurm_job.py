"""What the Slurm backend's tests share: a tiny GPT-2 params file, `weightstream run` as a user runs it
where Slurm's commands reach the cluster (the switch's network namespace), and what a run leaves to read
(its checkpoints' bytes, the steps it logged)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from testbed.slurm import SlurmCluster

EXAMPLE = Path(__file__).parents[3] / "services" / "weightstream" / "examples" / "gpt2_synthetic.yaml"
# the repository's code, for the coordinator and for every role srun starts on a node (shared files)
PYTHONPATH = os.pathsep.join(str(Path(__file__).parents[3] / d) for d in ("services", "client"))


def tiny_gpt2(tmp_path: Path, steps: int = 4) -> Path:
    """gpt2_synthetic for ``steps`` steps, evaluated and checkpointed at the end."""
    params = yaml.safe_load(EXAMPLE.read_text())
    loop = params["trainer"]["init"]["loop"]
    loop.update(max_steps=steps, eval_frequency=steps, eval_steps=2)
    path = tmp_path / "gpt2.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def weightstream_run(
    cluster: SlurmCluster | None, params: Path, model_dir: Path, *args: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``weightstream run params --num_csx 2 --model_dir model_dir *args``: at the switch with Slurm's
    configuration (``cluster``), or on this machine (None)."""
    argv = [sys.executable, "-m", "weightstream.cli", "run", str(params), "--num_csx", "2",
            "--model_dir", str(model_dir), *args]  # fmt: skip
    env = {"PYTHONPATH": PYTHONPATH, "COLUMNS": "200"}
    if cluster is None:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              env={**os.environ, **env})  # fmt: skip
    return cluster.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env)


def slurm_jobs(cluster: SlurmCluster) -> list[str]:
    """Every job Slurm lists (id, name, state), one line each."""
    done = cluster.run(["squeue", "--noheader", "--format=%i %j %T"], capture_output=True, text=True,
                       timeout=60, check=True)  # fmt: skip
    return done.stdout.splitlines()


def host_processes(cluster: SlurmCluster) -> dict[str, list[str]]:
    """Each host's processes other than its PID 1 and its slurmd, by command line."""
    out: dict[str, list[str]] = {}
    for host in cluster.hosts:
        for pid in host.processes():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if pid != host.init_pid and "slurmd" not in cmdline:
                out.setdefault(host.name, []).append(cmdline)
    return out


CHECKPOINT_FILES = ("model", "optimizer")


def checkpoint_bytes(model_dir: Path, step: int) -> dict[str, bytes]:
    """Every weight and optimizer file of ``checkpoint_<step>``, by name."""
    ckpt = model_dir / f"checkpoint_{step}"
    files = {f.name: f.read_bytes() for f in ckpt.glob("*.safetensors")}
    assert {name.split("-")[0].split(".")[0] for name in files} == set(CHECKPOINT_FILES), sorted(files)
    return files


def steps_logged(model_dir: Path) -> int:
    metrics = model_dir / "metrics.jsonl"
    return sum('"loss"' in line for line in metrics.read_text().splitlines()) if metrics.exists() else 0
