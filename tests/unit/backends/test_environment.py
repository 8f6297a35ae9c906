"""A role's process environment is the same whichever backend starts it (one function computes it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.params_files import TINY
from weightstream.backends.base import RoleSpec
from weightstream.backends.environment import THREAD_ENV_VARS, role_env
from weightstream.backends.kubernetes.manifests import (
    ROLE_ADDRESS_ENV,
    ClusterConfig,
    cpu_cores,
    job_manifests,
)
from weightstream.backends.local import LocalProcessBackend
from weightstream.params import load_params, model_def
from weightstream.plan import make_plan


def _pod_env(kind: str, worker_cpu: str) -> dict[str, str]:
    p = load_params(TINY)
    model = model_def(p)
    docs = job_manifests("t", p, model, make_plan(p, model), ClusterConfig(worker_cpu=worker_cpu))
    pod = next(d for d in docs if d["kind"] == "Pod" and d["metadata"]["name"] == f"ws-t-{kind}-0")
    # less the pod's own address (POD_IP from the downward API, and the probe's address made of it): a
    # local process is told where to listen on its command line instead
    plumbing = {"POD_IP", ROLE_ADDRESS_ENV}
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if e["name"] not in plumbing}


@pytest.mark.parametrize("kind", ["worker", "memoryx", "swarmx", "activation"])
def test_local_processes_and_pods_get_the_same_role_environment(tmp_path: Path, kind: str) -> None:
    local = LocalProcessBackend(tmp_path)._env(RoleSpec(kind, 0), num_workers=1)
    cores = local["OPENBLAS_NUM_THREADS"]  # the local backend gives one worker every core here
    pod = _pod_env(kind, worker_cpu=cores)
    ours = role_env(kind, int(cores))
    assert pod == ours  # the pod gets exactly the role environment, nothing more, nothing less
    assert {k: local[k] for k in ours} == ours
    assert set(THREAD_ENV_VARS) <= set(ours) and "MKL_NUM_THREADS" in ours


def test_workers_use_their_cores_and_other_roles_one_thread() -> None:
    assert _pod_env("worker", "4")["OMP_NUM_THREADS"] == "4"
    assert _pod_env("worker", "500m")["OMP_NUM_THREADS"] == "1"  # never "500m" or 0 threads
    assert _pod_env("memoryx", "4")["OMP_NUM_THREADS"] == "1"
    assert [cpu_cores(q) for q in ("2", "1.5", "2500m", "100m")] == [2, 1, 2, 1]
