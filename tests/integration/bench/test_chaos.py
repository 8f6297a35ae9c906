"""bench/chaos.py's smoke run end to end (slow): the appliance recovers from every kind of fault bit for
bit. Its schedule and summary are tested in tests/unit/bench/test_chaos.py."""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from tests.bench_module import load_bench


def _load() -> ModuleType:
    return load_bench("chaos")


chaos = _load()


@pytest.mark.slow
def test_smoke_run_recovers_from_every_kind_of_fault_bit_for_bit(capsys: pytest.CaptureFixture[str]) -> None:
    result = chaos.main(["--smoke"])
    assert json.loads(capsys.readouterr().out) == result
    assert result["faults"]["total"] == 5 and result["faults"]["by_signal"]["SIGSTOP"] == 1
    assert result["restarts"] == 5 and result["undetected_faults"] == 0
    assert result["detection_s_sigstop"] < result["rpc_timeout_s"]  # found by its heartbeats, before that
    # replicas by default: MemoryX losses fail over and replay nothing (without them the first would roll
    # back to the seed's state; tests/integration/test_faults.py strikes a job without replicas)
    assert result["config"]["replicas"] == 1 and result["faults"]["by_kind"]["memoryx-replica"] == 1
    assert result["replay_steps_total"] == 0 and result["replay_steps_after_memoryx_faults"] == 0
    assert result["bitwise_equal"] and result["losses_equal"]
