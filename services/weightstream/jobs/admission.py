"""Admission: the checks a job passes before anything of it runs, in one order, each run once.

``weightstream validate`` and ``weightstream run`` (``Admission.local``) and the service
(``Admission.submitted``, from ``JobService.submit``: the path of REST and gRPC) admit a job with
``admit``, through the same ``CHECKS``; each check says where it applies. The service brings its limits,
data roots and CS-2 slots (``ServiceConfig``) and the request's own fields; the command line has none of
those, and checks what a run on this machine needs instead: its memory and the checkpoint the run starts
from (``training/preflight.py``).

The order is the rule. A request's own fields are checked before its params are read. The service counts
a job's size from the params before it looks at any path, and confines every path to its data roots
before a file there is read; an HDF5 input's left-out sequence length is read from its files only then,
and the tokens a step has with it are checked next. The data is opened after all of that.

Two ways to answer:

- The command line reports every problem at once. ``read_params`` runs the checks after ``params`` as its
  ``resolve`` (on stand-ins for keys that failed, when it can), so their problems come with the params'
  own, each at the key path the user wrote; a check leaves out only what an earlier one left unknown.
- The service refuses at the first check that finds a problem: nothing is opened, read or built for a
  submission already refused. It raises ``ParamsError`` (REST 422 ``invalid_params``, gRPC
  INVALID_ARGUMENT) or ``CapacityError`` (422 ``over_capacity``, INVALID_ARGUMENT).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from weightstream.data.check import FILE_PROCESSORS, data_problems, resolve_sequence_lengths
from weightstream.jobs.data_roots import confine_data
from weightstream.jobs.limits import check_params, check_request, check_tokens, with_service_defaults
from weightstream.params import Loaded, Params, ParamsError, Problem, read_params
from weightstream.params.layout import relocate
from weightstream.params.load import Resolve
from weightstream.training.preflight import StartCheckpoint, memory_problems, start_checkpoint

if TYPE_CHECKING:
    from weightstream.jobs.config import ServiceConfig

__all__ = ["CHECKS", "Admission", "CapacityError", "Check", "Submission", "admit"]

Where = Literal["local", "service"]  # a run on this machine (validate, run), or the service
LOCAL: frozenset[Where] = frozenset({"local"})
SERVICE: frozenset[Where] = frozenset({"service"})
BOTH = LOCAL | SERVICE
SECTIONS = ("train_input", "eval_input")


class CapacityError(ValueError):
    """A job asks for more CS-2 than the service has: it could never run."""


@dataclass(frozen=True)
class Submission:
    """A job submitted to the service, its fields as the API gave them (the ``request`` check's)."""

    params: Any
    num_csx: Any = None  # None: the params' own runconfig.num_csx
    labels: Any = field(default_factory=dict)
    priority: Any = 2


@dataclass
class Admission:
    """One job's admission under way, and its record: the checks that ran, in order, and what each found.

    ``params`` are the params as the checks so far have completed them (data paths made real, sequence
    lengths read); ``start`` is what the checkpoint a local run starts from said (notes, a finished run)."""

    source: str | Path | Mapping[str, Any]  # the params: a file's path, or the mapping submitted
    overrides: Mapping[str, Any]  # runconfig keys the caller sets: flags, the service's model_dir
    service: ServiceConfig | None = None  # None: a run on this machine
    submission: Submission | None = None  # the service's request
    ran: list[str] = field(default_factory=list)
    found: dict[str, list[Problem]] = field(default_factory=dict)  # a check's problems, at canonical keys
    lengths_read: tuple[str, ...] = ()  # the inputs whose max_sequence_length came from their files
    start: StartCheckpoint = field(default_factory=StartCheckpoint)
    # the command line's: the checks after params, run by read_params as it reads (see admit)
    resolve: Resolve | None = field(default=None, init=False, repr=False)
    _loaded: Loaded | None = field(default=None, init=False, repr=False)
    _params: Params | None = field(default=None, init=False, repr=False)

    @classmethod
    def local(
        cls, params: str | Path | Mapping[str, Any], overrides: Mapping[str, Any] | None = None
    ) -> Admission:
        """A run on this machine (``weightstream validate`` and ``weightstream run``): ``params`` a
        file's path (or a mapping); ``overrides`` the runconfig keys the command line's flags set, named
        ``--key`` in problems."""
        return cls(params, dict(overrides or {}))

    @classmethod
    def submitted(
        cls, submission: Submission, config: ServiceConfig, overrides: Mapping[str, Any]
    ) -> Admission:
        """A job submitted to the service ``config`` describes; ``overrides`` the runconfig keys the
        service sets (its ``model_dir``), named ``runconfig.key`` in problems."""
        return cls(submission.params, dict(overrides), config, submission)

    @property
    def where(self) -> Where:
        return "local" if self.service is None else "service"

    @property
    def loaded(self) -> Loaded:
        """The params as read: validated, with the key report and where each key was written."""
        if self._loaded is None:
            raise RuntimeError("the params have not been read yet (the params check comes first)")
        return self._loaded

    @loaded.setter
    def loaded(self, loaded: Loaded) -> None:
        self._loaded = loaded

    @property
    def params(self) -> Params:
        if self._params is None:
            raise RuntimeError("the params have not been read yet (the params check comes first)")
        return self._params

    @params.setter
    def params(self, p: Params) -> None:
        self._params = p

    @property
    def config(self) -> ServiceConfig:
        if self.service is None:
            raise RuntimeError("a check of the service's ran on the command line")
        return self.service

    @property
    def request(self) -> Submission:
        if self.submission is None:
            raise RuntimeError("a check of the service's ran without a submission")
        return self.submission


@dataclass(frozen=True)
class Check:
    """One question asked of a job: ``run`` returns its problems (at canonical key paths) and may
    complete ``Admission.params``; it raises ``CapacityError`` itself."""

    name: str
    where: frozenset[Where]
    run: Callable[[Admission], list[Problem]]
    wanted: Callable[[Admission], bool] = lambda a: True  # some questions only some admissions ask
    refused_as: str = "params"  # the service's ParamsError names what it refused: the request or params


def _within_slots(num_csx: int, slots: int) -> None:
    if num_csx > slots:
        raise CapacityError(f"num_csx={num_csx} exceeds this service's {slots} CS-2 slots")


def _request(a: Admission) -> list[Problem]:
    s = a.request
    return check_request(s.params, s.num_csx, s.labels, s.priority, a.config.limits)


def _requested_slots(a: Admission) -> list[Problem]:
    _within_slots(a.request.num_csx, a.config.slots)  # before reading params: a job that could never run
    return []


def _params(a: Admission) -> list[Problem]:
    """Read the params: either layout, the caller's overrides applied, every key validated and checked
    across sections. ``read_params`` raises ParamsError itself, with ``Admission.resolve``'s problems
    on the command line."""
    overrides = dict(a.overrides)
    if a.submission is not None and a.submission.num_csx is not None:
        overrides = {"num_csx": a.submission.num_csx, **overrides}
    if a.service is not None:
        assert isinstance(a.source, Mapping)  # the request check refuses anything else
        overrides |= with_service_defaults(a.source, a.service.limits)
        a.loaded = read_params(a.source, overrides, "params", override_label="runconfig.{}")
    else:
        a.loaded = read_params(a.source, overrides, resolve=a.resolve)
    a.params = a.loaded.params
    return []


def _service_limits(a: Admission) -> list[Problem]:
    return check_params(a.params, a.config.limits)  # from counts: no file is opened before this passes


def _data_roots(a: Admission) -> list[Problem]:
    a.params, problems = confine_data(a.params, a.config.data_roots)  # only confined paths are opened
    return problems


def _sequence_lengths(a: Admission) -> list[Problem]:
    before = a.params
    a.params, problems = resolve_sequence_lengths(before)
    a.lengths_read = tuple(
        sec
        for sec in SECTIONS
        if (inp := getattr(before, sec)) is not None
        and inp.max_sequence_length is None
        and getattr(a.params, sec).max_sequence_length is not None
    )
    return problems


def _read_lengths_limits(a: Admission) -> list[Problem]:
    # service_limits counted 1 token a sample for these: the files have now said how many
    return check_tokens(a.params, a.config.limits, a.lengths_read)


def _data(a: Admission) -> list[Problem]:
    unresolved = frozenset(q.path.split(".")[0] for q in a.found.get("sequence_lengths", []))
    # the service builds nothing at submission: it opens the inputs that read files and generates no
    # synthetic or digits data; a local run opens every input as its activation servers will
    processors = FILE_PROCESSORS if a.service is not None else None
    return data_problems(a.params, processors, skip=unresolved)


def _memory(a: Admission) -> list[Problem]:
    return memory_problems(a.params)


def _start_checkpoint(a: Admission) -> list[Problem]:
    if a.found.get("memory"):  # a model too large to hold is not built to compare it with a checkpoint
        return []
    a.start = start_checkpoint(a.params)
    return a.start.problems


def _params_slots(a: Admission) -> list[Problem]:
    _within_slots(a.params.runconfig.num_csx, a.config.slots)
    return []


PARAMS = "params"
CHECKS: tuple[Check, ...] = (
    Check("request", SERVICE, _request, refused_as="request"),
    Check("requested_slots", SERVICE, _requested_slots, wanted=lambda a: a.request.num_csx is not None),
    Check(PARAMS, BOTH, _params),
    Check("service_limits", SERVICE, _service_limits),
    Check("data_roots", SERVICE, _data_roots),
    Check("sequence_lengths", BOTH, _sequence_lengths),
    Check("read_lengths_limits", SERVICE, _read_lengths_limits, wanted=lambda a: bool(a.lengths_read)),
    Check("data", BOTH, _data),
    Check("memory", LOCAL, _memory),
    Check("start_checkpoint", LOCAL, _start_checkpoint),
    Check("params_slots", SERVICE, _params_slots, wanted=lambda a: a.request.num_csx is None),
)
"""Every check, in the order asked. ``Admission.ran`` records the names of those that ran."""


def admit(a: Admission) -> Admission:
    """Run the checks of ``a``'s context in order, each once; ``a`` completed, its record filled in.
    On the command line, ParamsError listing every problem; for the service, ParamsError or
    CapacityError at the first check that finds a problem. Either way each problem is at the key path
    the user wrote, and ``a.ran`` says which checks ran."""
    checks = [c for c in CHECKS if a.where in c.where]
    at = [c.name for c in checks].index(PARAMS)
    before, reading, after = checks[:at], checks[at], checks[at + 1 :]
    for check in before:  # the request's own fields: nothing is read before they pass
        _refuse_if_found(a, check, _ask(a, check))
    if a.service is None:
        # every problem at once: read_params runs the checks after it as its resolve and reports their
        # problems with its own
        a.resolve = lambda p: _every_problem(a, after, p)
        _ask(a, reading)
        return a
    _ask(a, reading)
    for check in after:
        _refuse_if_found(a, check, _ask(a, check))
    return a


def _ask(a: Admission, check: Check) -> list[Problem]:
    """Run ``check`` if this admission asks it, and record it."""
    if not check.wanted(a):
        return []
    a.ran.append(check.name)
    problems = check.run(a)
    if problems:
        a.found[check.name] = problems
    return problems


def _refuse_if_found(a: Admission, check: Check, problems: list[Problem]) -> None:
    """The service's answer to the first check that finds a problem: each at the key path the user
    wrote, once the params have been read."""
    if problems:
        raise ParamsError(relocate(problems, a._loaded.origin) if a._loaded else problems, check.refused_as)


def _every_problem(a: Admission, checks: Sequence[Check], p: Params) -> tuple[Params, list[Problem]]:
    """``read_params``' resolve on the command line: ``p`` as ``checks`` complete it, and every problem
    they find."""
    a.params = p
    problems = []
    for check in checks:
        problems += _ask(a, check)
    return a.params, problems
