"""The service's limits: every bound checked by ``JobService.submit`` itself (the path both APIs take),
refused with the key, the limit and the ``serve`` option, before anything is built or allocated."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fleet import Fleet
from tests.params_edit import MLP, edit
from tests.params_files import TINY
from tests.waiting import wait_until
from weightstream.jobs.service import JobService, QueueFull, ServiceConfig, ServiceLimits
from weightstream.jobs.store import Job
from weightstream.params import ParamsError, load_params, model_def
from weightstream.params.size import num_layers, num_params, tokens_per_step


@pytest.fixture
def make_service(tmp_path: Path) -> Iterator[Callable[..., JobService]]:
    """A real JobService whose jobs block in a fake runner (nothing here needs a job to train)."""
    made: list[JobService] = []

    def make(slots: int = 4, fleet: Fleet | None = None, **limits: Any) -> JobService:
        config = ServiceConfig(tmp_path / f"data{len(made)}", slots, limits=ServiceLimits(**limits))
        made.append(JobService(config, runner_factory=fleet or Fleet()))
        return made[-1]

    yield make
    for s in made:
        s.shutdown(grace_s=5)


@pytest.mark.parametrize(
    "raw",
    [
        TINY,
        edit(TINY, **{"model.share_embedding_weights": False}),
        edit(TINY, **{"model.filter_size": None, "model.num_hidden_layers": 3}),
        MLP,
        edit(MLP, **{"model.depth": 1}),
    ],
    ids=["gpt2", "gpt2-untied", "gpt2-default-ffn", "fc_mlp", "fc_mlp-depth-1"],
)
def test_closed_form_sizes_match_the_built_model(raw: dict[str, Any]) -> None:
    p = load_params(raw)
    model = model_def(p)
    assert num_params(p.model) == model.num_params
    assert num_layers(p.model) + (2 if p.model.name == "gpt2" else 1) == len(model.units)
    seq = p.train_input.max_sequence_length or 1
    assert tokens_per_step(p.train_input, p.model) == p.train_input.batch_size * seq


HUGE = [  # (what, params, the key the problem names, the serve option it names)
    ("hidden_size", edit(TINY, **{"model.hidden_size": 10**9, "model.num_heads": 1}), "model.hidden_size",
     "--max-params"),
    ("vocab_size", edit(TINY, **{"model.vocab_size": 10**9}), "model.hidden_size", "--max-params"),
    ("layers", edit(TINY, **{"model.num_hidden_layers": 10**9}), "model.num_hidden_layers", "--max-layers"),
    ("fc_mlp input", edit(MLP, **{"model.input_size": 10**9}), "model.hidden_size", "--max-params"),
    ("fc_mlp depth", edit(MLP, **{"model.depth": 10**9}), "model.depth", "--max-layers"),
    ("batch_size", edit(TINY, **{"train_input.batch_size": 10**9}), "train_input.batch_size",
     "--max-tokens-per-step"),
    ("eval batch", edit(TINY, **{"eval_input.batch_size": 10**6}), "eval_input.batch_size",
     "--max-tokens-per-step"),
    ("fc_mlp batch", edit(MLP, **{"train_input.batch_size": 2**21}), "train_input.batch_size",
     "--max-tokens-per-step"),
    ("max_steps", edit(TINY, **{"runconfig.max_steps": 10**9}), "runconfig.max_steps", "--max-steps"),
    ("act servers", edit(TINY, **{"runconfig.num_act_servers": 65}), "runconfig.num_act_servers",
     "--max-workers"),
    ("rpc timeout", edit(TINY, **{"runconfig.rpc_timeout_s": 10**6}), "runconfig.rpc_timeout_s",
     "--max-job-seconds"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "raw", "path", "option"), HUGE, ids=[h[0] for h in HUGE])
def test_a_job_over_a_limit_is_refused_naming_the_key_the_limit_and_the_option(
    make_service: Callable[..., JobService], what: str, raw: dict[str, Any], path: str, option: str
) -> None:
    service = make_service()
    with pytest.raises(ParamsError) as e:
        service.submit(copy.deepcopy(raw), num_csx=1)
    problems = {p.path: str(p) for p in e.value.problems}
    assert path in problems, f"{what}: {problems}"
    assert option in problems[path] and "at most" in problems[path]
    assert service.store.list() == []


def test_the_default_limits_name_the_parameter_count() -> None:
    raw = edit(TINY, **{"model.hidden_size": 10**6, "model.num_heads": 1})
    from weightstream.jobs.limits import check_params

    (problem,) = check_params(load_params(raw), ServiceLimits())
    assert str(problem).startswith("model.hidden_size: the model has 8e+12 parameters; this service "
                                   "accepts at most 2e+09 (serve --max-params)")  # fmt: skip


BAD_REQUESTS = [  # (num_csx, labels, priority, the path named)
    (1, {}, -1000, "priority"),
    (1, {}, 0, "priority"),
    (1, {}, 4, "priority"),
    (1, {}, True, "priority"),
    (0, {}, 2, "num_csx"),
    (-3, {}, 2, "num_csx"),
    (65, {}, 2, "num_csx"),  # over max_workers (64), even though within no slot count's business
    (1, {f"k{i}": "v" for i in range(33)}, 2, "labels"),
    (1, {"team": "x" * 257}, 2, "labels.team"),
    (1, {"": "v"}, 2, "labels."),
    (1, {"team": 7}, 2, "labels.team"),
    (1, ["team"], 2, "labels"),
]


@pytest.mark.parametrize(("num_csx", "labels", "priority", "path"), BAD_REQUESTS)
def test_the_submission_fields_are_checked_by_the_service(
    make_service: Callable[..., JobService], num_csx: Any, labels: Any, priority: Any, path: str
) -> None:
    """What REST's schema checks, the service checks again: gRPC (and any future API) has no schema."""
    service = make_service(slots=128)
    with pytest.raises(ParamsError) as e:
        service.submit(copy.deepcopy(TINY), num_csx=num_csx, labels=labels, priority=priority)
    assert path in [p.path for p in e.value.problems]
    assert service.store.list() == []


def test_params_that_are_not_a_mapping_are_refused(make_service: Callable[..., JobService]) -> None:
    with pytest.raises(ParamsError) as e:
        make_service().submit([1, 2], num_csx=1)  # type: ignore[arg-type]
    assert [p.path for p in e.value.problems] == ["params"]


def test_a_full_queue_refuses_submissions_until_a_job_starts(make_service: Callable[..., JobService]) -> None:
    fleet = Fleet()
    service = make_service(slots=1, fleet=fleet, max_queued_jobs=2)
    ids = {}
    for name in ("a", "b", "c"):
        ids[name] = service.submit(copy.deepcopy(TINY), 1, {"name": name}).id
        if name == "a":  # running: it does not count
            wait_until(lambda: fleet.started == ["a"], lambda: f"a started ({fleet.started})")
    with pytest.raises(QueueFull, match="--max-queued-jobs"):
        service.submit(copy.deepcopy(TINY), 1, {"name": "d"})
    assert len(service.store.list()) == 3
    fleet.runners["a"].finish()
    wait_until(lambda: fleet.started == ["a", "b"], lambda: f"b started ({fleet.started})")
    service.submit(copy.deepcopy(TINY), 1, {"name": "e"})  # room again


@pytest.mark.parametrize(
    ("params_value", "service_default", "kept"),
    [("absent", 5, 5), ("absent", None, None), (None, 5, None), (2, 5, 2), (9, None, 9)],
)
def test_the_service_applies_its_checkpoint_retention_where_params_set_none(
    make_service: Callable[..., JobService], params_value: Any, service_default: int | None, kept: int | None
) -> None:
    raw = copy.deepcopy(TINY)
    if params_value != "absent":
        raw["runconfig"]["keep_checkpoint_max"] = params_value
    job = make_service(keep_checkpoint_max=service_default).submit(raw, num_csx=1)
    assert job.params["runconfig"]["keep_checkpoint_max"] == kept


@pytest.mark.parametrize(
    "kwargs", [{"max_params": 0}, {"max_queued_jobs": -1}, {"max_job_seconds": 0}, {"keep_checkpoint_max": 0}]
)
def test_nonsense_limits_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        ServiceLimits(**kwargs)


def test_limits_are_the_services_only() -> None:
    """`weightstream run` validates with load_params alone: a huge model is still valid params there."""
    raw = edit(TINY, **{"model.hidden_size": 10**6, "model.num_heads": 1, "train_input.batch_size": 10**6})
    assert load_params(raw).model.hidden_size == 10**6


def test_time_used_counts_every_run_of_a_job() -> None:
    """The wall-clock limit spans restarts: a requeued job gets only what is left of it."""
    history = [
        {"status": "queued", "at": 100.0},
        {"status": "running", "at": 110.0},
        {"status": "queued", "at": 150.0, "reason": "service stopped"},
        {"status": "running", "at": 500.0},
        {"status": "queued", "at": 520.0, "reason": "service restarted"},
    ]
    job = Job("j", "queued", {}, 1, {}, 2, 100.0, 520.0, None, "/x", history)
    assert job.running_seconds() == 60.0
    # running again: the run under way counts up to `now` when one is given (JobView's duration_s)
    job = Job(
        "j", "running", {}, 1, {}, 2, 100.0, 600.0, None, "/x", [*history, {"status": "running", "at": 600.0}]
    )
    assert job.running_seconds() == 60.0 and job.running_seconds(now=612.5) == 72.5


@pytest.mark.parametrize("where", ["/tmp/elsewhere", "../other-job", ".", "sub/../..", "mx\0"])
def test_a_memoryx_dir_outside_the_jobs_own_directory_is_refused(
    make_service: Callable[..., JobService], where: str
) -> None:
    """Disk-mode shards empty and delete their directory: a job may only name one inside its own."""
    raw = edit(TINY, **{"runconfig.memoryx_storage": "disk", "runconfig.memoryx_dir": where})
    service = make_service()
    with pytest.raises(ParamsError) as e:
        service.submit(raw, num_csx=1)
    assert [p.path for p in e.value.problems] == ["runconfig.memoryx_dir"]
    assert "inside the job's own directory" in str(e.value)
    assert service.store.list() == []


def test_a_memoryx_dir_inside_the_job_is_accepted(make_service: Callable[..., JobService]) -> None:
    raw = edit(TINY, **{"runconfig.memoryx_storage": "disk", "runconfig.memoryx_dir": "scratch/mx"})
    job = make_service().submit(raw, num_csx=1)
    assert job.params["runconfig"]["memoryx_dir"] == "scratch/mx"


def test_the_service_keeps_a_files_own_checkpoint_retention_in_either_layout() -> None:
    from weightstream.jobs.limits import ServiceLimits, with_service_defaults

    limits = ServiceLimits(keep_checkpoint_max=5)
    assert with_service_defaults({"runconfig": {"max_steps": 3}}, limits) == {"keep_checkpoint_max": 5}
    assert with_service_defaults({"runconfig": {"keep_checkpoint_max": None}}, limits) == {}
    trainer: dict[str, Any] = {"trainer": {"init": {"callbacks": [{"ComputeNorm": {}}]}}}
    assert with_service_defaults(trainer, limits) == {"keep_checkpoint_max": 5}
    trainer["trainer"]["init"]["callbacks"].append({"KeepNCheckpoints": {"n": 2}})
    assert with_service_defaults(trainer, limits) == {}  # KeepNCheckpoints is the trainer: spelling


def test_without_num_csx_the_params_say_how_many_and_are_held_to_the_limits(
    make_service: Callable[..., JobService],
) -> None:
    """num_csx left out (REST omits it, gRPC sends 0): the params' runconfig.num_csx, as `weightstream run`
    without --num_csx; checked against --max-workers (named at the key the file wrote) and the slots."""
    from weightstream.jobs.service import CapacityError

    service = make_service(slots=4)
    two = edit(TINY, **{"runconfig.num_csx": 2})
    assert service.submit(copy.deepcopy(two)).num_csx == 2
    assert service.submit(copy.deepcopy(two), num_csx=1).num_csx == 1  # an override still wins
    assert service.submit(copy.deepcopy(TINY)).num_csx == 1  # the params' default
    with pytest.raises(ParamsError) as e:
        service.submit(
            edit(TINY, **{"runconfig.num_csx": 65, "train_input.batch_size": 65, "eval_input.batch_size": 65})
        )
    [problem] = [str(p) for p in e.value.problems]
    assert problem.startswith("runconfig.num_csx: too many CS-2 workers") and "--max-workers" in problem
    with pytest.raises(CapacityError, match=r"num_csx=8 exceeds this service's 4 CS-2 slots"):
        service.submit(edit(TINY, **{"runconfig.num_csx": 8}))
