"""`weightstream serve --backend slurm` as a user runs it where Slurm's commands reach the cluster (the
switch's network namespace), and `wsctl` beside it: what the service's tests on Slurm share."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from testbed.slurm import SlurmCluster
from tests.integration.backends.slurm_job import PYTHONPATH
from tests.waiting import wait_until

TOKEN = "slurm-service-token-0123456789"
BANNER = "weightstream service:"  # the first line `serve` prints once it listens
PORT = 8080  # in the switch's network namespace, which this test made: nothing else listens there


class SlurmService:
    """A `weightstream serve --backend slurm` on ``data_dir``; its output goes to ``<data_dir>.log``."""

    def __init__(self, cluster: SlurmCluster, data_dir: Path, *args: str) -> None:
        """``args``: more `serve` options (placement)."""
        self.cluster, self.data_dir, self.args = cluster, data_dir, args
        self.log = data_dir.with_suffix(".log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = {"PYTHONPATH": PYTHONPATH, "WEIGHTSTREAM_TOKEN": TOKEN, "COLUMNS": "200"}

    def start(self) -> SlurmService:
        argv = [sys.executable, "-m", "weightstream.cli", "serve", "--port", str(PORT), "--grpc-port", "0",
                "--data-dir", str(self.data_dir), "--slots", "2", "--backend", "slurm",
                *self.args]  # fmt: skip
        with open(self.log, "ab") as out:  # a restart's output follows its predecessor's
            # nsenter -n execs the service: this Popen is the service itself
            self.proc = subprocess.Popen(self.cluster.command(argv), env={**self.cluster.env, **self.env},
                                         stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        banners = self.log.read_text().count(BANNER)

        def listening() -> bool:  # the banner, printed once it listens, is the service's signal
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
            return self.log.read_text().count(BANNER) > banners

        # 90 s: a restart first ends what its predecessor left in Slurm
        wait_until(listening, lambda: f"the service's banner: {self.log.read_text()[-3000:]}", 90, poll_s=0.1)
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(timeout=60)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill(signal.SIGTERM)

    def wsctl(self, *args: str) -> str:
        """`wsctl ARGS` against this service; its output (it must succeed)."""
        argv = [sys.executable, "-m", "weightstream_client.cli", *args]
        env = {**self.env, "WEIGHTSTREAM_URL": f"http://127.0.0.1:{PORT}"}
        done = self.cluster.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def job(self, job_id: str) -> dict[str, Any]:
        info: dict[str, Any] = json.loads(self.wsctl("get", "job", job_id, "-o", "json"))
        return info

    def wait_status(self, job_id: str, *statuses: str, timeout: float = 240) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        def reached() -> bool:
            seen.update(self.job(job_id))
            return seen["status"] in statuses

        wait_until(  # the REST API is polled, as a user's script polls it
            reached,
            lambda: f"job {job_id} {statuses}: {seen} {self.log.read_text()[-3000:]}",
            timeout,
            poll_s=0.5,
        )
        return seen


def slurm_jobs_named(cluster: SlurmCluster) -> dict[str, str]:
    """Each job Slurm lists: its name -> its nice value."""
    done = cluster.run(["squeue", "--noheader", "--format=%j %y"], capture_output=True, text=True,
                       timeout=60, check=True)  # fmt: skip
    return dict(line.split() for line in done.stdout.splitlines())
