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
    assert result["replay_steps_total"] >= 3  # the first MemoryX kill rolls back to the seed's state
    assert result["bitwise_equal"] and result["losses_equal"]
