"""Params validation in a process of its own: the pipelined memory check counts a billion layers in closed
form, under a 2 GiB address-space limit. The rest is in tests/unit/params/test_validation.py."""

from __future__ import annotations

from tests.integration.appliance import TINY
from tests.params_edit import edit


def test_the_pipelined_memory_check_builds_no_model() -> None:
    """A billion layers are counted in closed form: building the model to count them would take all the
    memory of the machine. Run with 2 GiB of address space, so a regression fails instead of swapping."""
    import json
    import subprocess
    import sys

    d = edit(
        TINY,
        **{"model.num_hidden_layers": 10**9, "runconfig.execution_mode": "pipelined",
           "runconfig.worker_memory_mb": 1, "runconfig.num_wgt_servers": 1},
    )  # fmt: skip
    script = (
        "import json, resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
        "from weightstream.params import ParamsError, load_params\n"
        "try:\n    load_params(json.loads(sys.stdin.read()))\n"
        "except ParamsError as e:\n    print(json.dumps([p.path for p in e.problems]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", script], input=json.dumps(d), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == ["runconfig.execution_mode"]
