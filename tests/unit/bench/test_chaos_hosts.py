"""bench/chaos_hosts.py and bench/host_faults.py: the run's size for its faults, the cost of a fault in the
run's own step time, and what is read of a run's events file; the bench itself needs emulated hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_module import load_bench

host_faults = load_bench("host_faults")
chaos_hosts = load_bench("chaos_hosts")
chaos = load_bench("chaos")


@pytest.mark.parametrize("argv", [[], ["--smoke"], ["--replicas", "0"]])
def test_its_arguments_make_the_chaos_jobs_params(argv: list[str]) -> None:
    raw = chaos.params_dict(chaos_hosts.parse_args(argv))
    assert raw["runconfig"]["num_csx"] == 2 and raw["runconfig"]["standby_roles"] == 0


def test_a_fault_costs_its_span_over_the_normal_step() -> None:
    steps = [0.0, 1.0, 2.0, 3.0, 13.0, 14.0, 15.0]  # a fault at 3.5: the next step 9 s late
    normal, lost = chaos.lost_in_run(steps, [3.5, 20.0])
    assert normal == 1.0
    assert lost == [9.0, None]  # no step after the second


def test_the_run_holds_every_fault_at_its_step_time() -> None:
    plan = host_faults.PLAN
    assert [f.what for f in plan].count("host_loss") == 3 and [f.what for f in plan].count("partition") == 2
    slow, fast = host_faults.steps_for(plan, 2.0), host_faults.steps_for(plan, 0.1)
    seconds = 3 * 10 + 2 * 30 + 40  # each host loss, each partition, the tail
    assert fast > seconds / 0.1 and slow > seconds / 2.0
    assert fast > slow
    smoke = host_faults.steps_for(host_faults.SMOKE_PLAN, 1.0)
    assert smoke < host_faults.steps_for(plan, 1.0)


def test_the_run_log_reads_complete_lines_of_the_events_file(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    events = [
        {
            "t": 1.0,
            "event": "step",
            "step": 1,
            "step_time_s": 0.5,
            "slowest_worker": 1,
            "slowest_worker_ratio": 2.0,
        },
        {"t": 2.0, "event": "restart", "role": "worker-1", "step": 2},
        {"t": 3.0, "event": "recovered", "step": 1, "replay_steps": 0},
        {
            "t": 4.0,
            "event": "step",
            "step": 2,
            "step_time_s": 0.4,
            "slowest_worker": 0,
            "slowest_worker_ratio": 1.1,
        },
        {
            "t": 5.0,
            "event": "straggler",
            "step": 2,
            "worker": "worker-1",
            "host": "h2",
            "ratio": 2.0,
            "steps": 3,
        },
        {"t": 6.0, "event": "checkpoint", "step": 2, "path": "/m/checkpoint_2"},
    ]
    path.write_text("".join(json.dumps(e) + "\n" for e in events) + '{"t": 7.0, "ev')  # a line half written
    log = host_faults.RunLog(path)
    log.close()
    assert log.step == 2 and log.step_times() == [1.0, 4.0]
    assert log.first_restart(["worker-1", "activation-1"], 1.5) == 2.0
    assert log.first_restart(["worker-0"], 0.0) is None
    assert log.replay_after(1.5) == 0
    assert log.ratios(1, 0, 2) == [2.0, 0.0]  # worker-1 the slowest in step 1 only
    assert log.stragglers() == [{"step": 2, "worker": "worker-1", "host": "h2", "ratio": 2.0, "steps": 3}]
    assert log.final_checkpoint() == Path("/m/checkpoint_2")
    assert log.wall_s() == pytest.approx(5.0)
