"""SIGTERM to `weightstream serve` (what systemd, Kubernetes and Ctrl-C send): running jobs go back to the
queue and resume from their last checkpoint once the service is back, to the uninterrupted result."""

from __future__ import annotations

import contextlib
import signal
import stat
import threading
from pathlib import Path

import pytest
from numpy.testing import assert_array_equal

from tests.integration.appliance import metrics, run_uninterrupted
from tests.integration.jobs.service_process import (
    Service,
    alive,
    checkpoint_tensors,
    job_params,
    logged_steps,
    role_pids,
    stop_leftovers,
    wait_for,
)
from weightstream.checkpoint_layout import complete_checkpoints


@pytest.mark.slow  # ~10 s: in .ci/run's slow phase, keeping the default suite short
def test_sigterm_requeues_a_running_job_which_resumes_after_a_restart(tmp_path: Path) -> None:
    """SIGTERM while a job trains past its first checkpoint: the service exits on its own, the job's roles
    are gone, and the job is ``queued`` with the reason in its history, not failed. The service started
    again on the same data dir resumes it from that checkpoint; it succeeds with bitwise the losses and
    weights of an uninterrupted `weightstream run`. A client following the job's events does not hold the
    shutdown up. Nothing the service wrote is readable by other users."""
    max_steps, every = 40, 8
    params = job_params(max_steps=max_steps, checkpoint_steps=every)
    service = Service(tmp_path / "data", 1).start()
    pids: set[int] = set()
    model_dir = tmp_path / "unset"
    try:
        job = service.client().submit(params, num_csx=1)
        model_dir = Path(job.info()["params"]["runconfig"]["model_dir"])
        wait_for(lambda: len(role_pids(model_dir)) == 5, "its five roles to be ready")
        pids.update(role_pids(model_dir))

        def past_a_checkpoint() -> bool:
            if job.status() != "running":
                pytest.fail(f"job is {job.status()} before the SIGTERM: {job.info().get('error')}")
            cps = complete_checkpoints(model_dir)
            return bool(cps) and max(logged_steps(model_dir), default=0) > cps[-1][0]

        wait_for(past_a_checkpoint, "a step past a checkpoint", 120)

        def follow() -> None:  # a client following the job's events must not hold the shutdown up
            with contextlib.suppress(Exception):
                for _ in service.client().job(job.id).events(follow=True):
                    pass

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        assert service.proc is not None
        service.proc.send_signal(signal.SIGTERM)
        assert (
            service.proc.wait(timeout=60) == 0
        )  # it stops by itself, well inside a pod's 30 s grace + margin
        assert not any(alive(p) for p in pids), "a role outlived the service's shutdown"
        port = service.url.rsplit(":", 1)[1]
        said = (tmp_path / f"serve-{port}.log").read_text().splitlines()  # what the operator was told
        assert said[said.index("SIGTERM: stopping; new submissions are refused.") + 1].startswith(
            f"  running jobs: 1 ({job.id}), stopped now and queued again"
        )
        resume_step = complete_checkpoints(model_dir)[-1][0]
        done_before = max(logged_steps(model_dir))
        assert every <= resume_step < done_before < max_steps

        service.start()
        job = service.client().job(job.id)
        info = job.wait(progress=False, timeout_s=180)
        pids.update(role_pids(model_dir))
        history = info["history"]
        assert [h["status"] for h in history] == ["queued", "running", "queued", "running", "succeeded"], info
        assert history[2]["reason"] == "service stopped; resumes from its last checkpoint"
        assert info["error"] is None
        events = [e for e in job.events(follow=False) if e["kind"] != "keepalive"]
        resuming = [e for e in events if e["kind"] == "progress" and e.get("status") == "resuming"]
        assert [e["step"] for e in resuming] == [resume_step]

        straight = run_uninterrupted(tmp_path, params)
        straight_losses, _ = metrics(straight)
        rows = job.metrics()["steps"]
        assert {row["step"] for row in rows} == set(range(1, max_steps + 1))
        for row in rows:
            assert row["loss"] == straight_losses[row["step"]], f"step {row['step']}"
        got = checkpoint_tensors(model_dir / f"checkpoint_{max_steps}", "model")
        want = checkpoint_tensors(straight / f"checkpoint_{max_steps}", "model")
        assert sorted(got) == sorted(want) and got
        for name, w in want.items():
            assert_array_equal(got[name], w, err_msg=name)
            assert got[name].tobytes() == w.tobytes(), f"{name}: equal, but not bitwise"

        service.stop()
        data = tmp_path / "data"
        opened = [
            f"{p} {stat.filemode(p.stat().st_mode)}"
            for p in [data, *data.rglob("*")]
            if not p.is_symlink() and p.stat().st_mode & 0o007
        ]
        assert not opened, "readable by other users:\n" + "\n".join(opened[:20])
    finally:
        service.stop()
        stop_leftovers(pids | set(role_pids(model_dir) if model_dir.is_dir() else []), model_dir)
