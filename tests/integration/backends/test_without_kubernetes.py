"""Kubernetes is an optional extra: without the client, everything but the Kubernetes backend works, and
asking for that backend says which command installs it.

The fast tests hide the installed client from every process they start (a ``sitecustomize`` on
PYTHONPATH makes ``import kubernetes`` fail, as it does where the package is not installed). The slow one
installs weightstream with plain ``pip install .`` into a fresh virtual environment and trains there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[3]
EXAMPLE = ROOT / "services" / "weightstream" / "examples" / "gpt2_synthetic.yaml"
HINT = 'pip install "weightstream[kubernetes]"'


def _without_kubernetes(tmp_path: Path) -> dict[str, str]:
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['kubernetes'] = None\n")
    path = os.pathsep.join(p for p in (str(hide), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "WEIGHTSTREAM_TOKEN": "t"}


def _weightstream(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "weightstream.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)


def test_the_client_is_really_hidden(tmp_path: Path) -> None:
    env = _without_kubernetes(tmp_path)
    r = subprocess.run([sys.executable, "-c", "import kubernetes"], env=env, capture_output=True, timeout=60)
    assert r.returncode != 0


def test_serve_with_the_kubernetes_backend_names_the_install_command(tmp_path: Path) -> None:
    env = _without_kubernetes(tmp_path)
    r = _weightstream(env, "serve", "--backend", "kubernetes", "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert HINT in " ".join(r.stderr.split()), r.stderr


def test_plan_and_run_work_without_the_client(tmp_path: Path) -> None:
    env = _without_kubernetes(tmp_path)
    r = _weightstream(
        env, "plan", str(EXAMPLE), "--backend", "kubernetes", "--data-claim", "d", "--num_csx", "2"
    )
    assert r.returncode == 0, r.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(r.stdout)]
    assert kinds[:2] == ["ConfigMap", "Service"] and kinds.count("Pod") >= 2 + 2  # workers and the rest
    r = _weightstream(env, "run", str(EXAMPLE), "--max_steps", "2", "--model_dir", str(tmp_path / "m"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "m" / "checkpoint_2" / "config.json").is_file()


@pytest.mark.slow
def test_plain_pip_install_has_no_kubernetes_and_trains(tmp_path: Path) -> None:
    """`pip install .` (no extras, not editable) into a fresh environment: no kubernetes package, the
    shipped example (package data) trains for 3 steps, and plan --backend kubernetes still works."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", str(ROOT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    show = subprocess.run(
        [str(py), "-m", "pip", "show", "kubernetes"], env=env, capture_output=True, timeout=60
    )
    assert show.returncode != 0, "plain `pip install .` installed kubernetes"
    ws = str(env_dir / "bin" / "weightstream")
    os.chdir(tmp_path)  # away from the source tree: the installed package, not the checkout, must work
    example = subprocess.run(
        [ws, "example", "gpt2_synthetic"], env=env, capture_output=True, text=True, timeout=60
    )
    assert example.returncode == 0, example.stderr
    (tmp_path / "params.yaml").write_text(example.stdout)
    run = subprocess.run(
        [ws, "run", "params.yaml", "--max_steps", "3", "--model_dir", str(tmp_path / "m")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "m" / "checkpoint_3" / "config.json").is_file()
    plan = subprocess.run(
        [ws, "plan", "params.yaml", "--backend", "kubernetes", "--data-claim", "d"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert plan.returncode == 0, plan.stderr
    serve = subprocess.run(
        [ws, "serve", "--backend", "kubernetes"],
        env={**env, "WEIGHTSTREAM_TOKEN": "t"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert serve.returncode == 2 and HINT in " ".join(serve.stderr.split()), serve.stderr
