"""The service's limits, in a process of their own: huge params are refused by ``JobService.submit`` before
anything is built or allocated, under a 2 GiB address-space limit so that a regression fails instead of
swapping. The other bounds are in tests/unit/jobs/test_limits.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.integration.appliance import TINY
from tests.params_edit import MLP, edit


def test_submit_allocates_nothing_for_huge_params(tmp_path: Path) -> None:
    """With 3 GiB of address space: submits that would build a billion-layer model or make a billion
    classes are refused at once (ParamsError, never MemoryError), and a job within the limits whose
    synthetic task is big (4 GB of class centres) is accepted without generating it in the API."""
    script = textwrap.dedent(f"""
        import json, resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        from pathlib import Path
        from weightstream.jobs.service import JobService, ServiceConfig
        from weightstream.params import ParamsError
        def no_runner(*args):  # an accepted job fails to start: only what submit does is measured
            raise RuntimeError("not here")
        service = JobService(ServiceConfig(Path({str(tmp_path)!r}), 4), runner_factory=no_runner)
        for raw in json.loads(sys.stdin.read()):
            try:
                service.submit(raw, num_csx=1)
                print("accepted")
            except ParamsError as e:
                print(sorted(p.path for p in e.problems))
            except Exception as e:
                print(type(e).__name__)
    """)
    cases = {
        "['runconfig.execution_mode']": edit(
            TINY,
            **{"model.num_hidden_layers": 10**9, "runconfig.execution_mode": "pipelined",
               "runconfig.worker_memory_mb": 1, "runconfig.num_wgt_servers": 1},
        ),
        "['model.hidden_size']": edit(MLP, **{"model.num_classes": 10**9}),
        "['train_input.batch_size']": edit(TINY, **{"train_input.batch_size": 10**9}),
        "accepted": edit(MLP, **{"model.input_size": 10**8, "model.hidden_size": 1, "model.depth": 1}),
    }  # fmt: skip
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(list(cases.values())),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == list(cases), r.stderr[-3000:]
