"""``runconfig.min_num_csx`` and ``elastic_wait_s`` (params/schema.py, checks.py): the fewest workers a job
may go on with must be at most num_csx, and the global batch, and each worker's shard in micro-batches,
must split evenly at every worker count from it to num_csx; each problem names the key, the value and the
count that fails."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.params_files import TINY
from weightstream.params import ParamsError, load_params


def _params(train: dict[str, Any] | None = None, **runconfig: Any) -> dict[str, Any]:
    """TINY with ``runconfig`` and ``train`` (train_input keys; eval_input takes its batch_size too)."""
    raw = copy.deepcopy(TINY)  # batch_size 8 (train and eval)
    raw["runconfig"].update(runconfig)
    raw["train_input"].update(train or {})
    raw["eval_input"]["batch_size"] = raw["train_input"]["batch_size"]
    return raw


def _problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ParamsError) as info:
        load_params(raw)
    return [str(p) for p in info.value.problems]


def test_unset_it_is_num_csx_and_the_job_never_shrinks() -> None:
    rc = load_params(_params(num_csx=4)).runconfig
    assert (rc.min_num_csx, rc.elastic_wait_s, list(rc.worker_counts)) == (None, 30.0, [4])
    rc = load_params(_params({"batch_size": 24}, num_csx=4, min_num_csx=2, elastic_wait_s=5)).runconfig
    assert (list(rc.worker_counts), rc.elastic_wait_s) == ([2, 3, 4], 5.0)


def test_more_than_num_csx_names_both() -> None:
    assert _problems(_params(num_csx=2, min_num_csx=3)) == [
        "runconfig.min_num_csx: must be at most runconfig.num_csx=2 (the fewest workers the job may go on "
        "with) (got 3)"
    ]


@pytest.mark.parametrize(("key", "value"), [("min_num_csx", 0), ("elastic_wait_s", -1)])
def test_out_of_range_values_are_refused(key: str, value: int) -> None:
    raw = _params(num_csx=2)
    raw["runconfig"][key] = value
    [problem] = _problems(raw)
    assert problem.startswith(f"runconfig.{key}: ") and f"(got {value})" in problem


def test_every_worker_count_down_to_it_must_divide_both_batches_naming_the_first_that_does_not() -> None:
    problems = _problems(_params(num_csx=4, min_num_csx=2))  # 8 splits 2 and 4 ways, not 3
    assert [p.split(":")[0] for p in problems] == ["train_input.batch_size", "eval_input.batch_size"]
    assert "every worker count from runconfig.min_num_csx=2 to num_csx=4" in problems[0]
    assert "and 3 does not divide it (got 8)" in problems[0]
    load_params(_params({"batch_size": 24}, num_csx=4, min_num_csx=2))


def test_num_csx_itself_keeps_its_own_message() -> None:
    [first, *_] = _problems(_params(num_csx=3, min_num_csx=2))
    assert first == (
        "train_input.batch_size: must be divisible by runconfig.num_csx=3 (the global batch is split evenly "
        "across CS-2 workers) (got 8)"
    )


def test_micro_batches_must_divide_the_shard_at_every_worker_count() -> None:
    # batch 8: shards of 4 (2 workers) and 8 (1 worker); micro-batches of 8 divide the latter only
    [problem] = _problems(_params({"micro_batch_size": 8}, num_csx=2, min_num_csx=1))
    assert problem.startswith("train_input.micro_batch_size: must divide the per-worker shard of 4 samples")
    # micro-batches of 4: shards of 4 at num_csx 2, and of 8 at 1 worker: fine
    load_params(_params({"micro_batch_size": 4}, num_csx=2, min_num_csx=1))
    raw = _params({"batch_size": 24, "micro_batch_size": 4}, num_csx=4, min_num_csx=2)
    [problem] = _problems(raw)  # 24 / 4 = 6 samples at num_csx: 4 does not divide it
    assert "per-worker shard of 6 samples (batch_size 24 / num_csx 4)" in problem
    raw = _params({"batch_size": 24, "micro_batch_size": 3}, num_csx=4, min_num_csx=2)
    [problem] = _problems(raw)  # 6 at 4 workers and 12 at 2; 8 at 3 workers: 3 does not divide it
    assert "shard of 8 samples (batch_size 24 / 3 workers (runconfig.min_num_csx=2))" in problem
