"""role_kinds: every role package is listed once, its service module provides the declared protocol
(``RoleService``, or ``StatefulRoleService`` where it keeps its logic across configurations) with the
declared parameters and annotations, loads as a ``RoleKind``, and the import linter's contract that only
role_kinds imports a role's service module covers every module of the package."""

from __future__ import annotations

import inspect
import tomllib
import typing
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from weightstream import role_kinds
from weightstream.plan import JobSpec
from weightstream.role import RoleHost
from weightstream.role_kinds import KINDS, RoleKind, RoleService, StatefulRoleService, role_kind

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "services" / "weightstream"
CONTRACT = "a role's service module is imported only through role_kinds, the declared role kinds"


def role_packages() -> set[str]:
    """The packages that serve a role: a service module with an ``add_servicer``."""
    return {p.parent.name for p in PACKAGE.glob("*/service.py") if "def add_servicer(" in p.read_text()}


def test_every_role_package_is_listed() -> None:
    assert set(KINDS) == role_packages()


def _declared(protocol: type, member: str) -> tuple[list[inspect.Parameter], dict[str, Any]]:
    """A protocol method's parameters (without self) and resolved annotations."""
    fn = getattr(protocol, member)
    names = {"JobSpec": JobSpec, "RoleHost": RoleHost, "grpc": grpc}  # role_kinds imports them to type-check
    hints = typing.get_type_hints(fn, globalns=vars(role_kinds), localns=names)
    return list(inspect.signature(fn).parameters.values())[1:], hints


def mismatches(service: ModuleType, protocol: type) -> list[str]:
    """How ``service`` differs from ``protocol``: a member missing, or one whose parameters (names where
    the protocol lets a caller pass them by keyword; kinds; annotations) or return annotation differ. The
    protocol's logic type ``L`` stands for what the module's ``build`` returns."""
    members = sorted(n for n in dir(protocol) if not n.startswith("_"))
    missing = [m for m in members if not callable(getattr(service, m, None))]
    if missing:
        return [f"no {m}" for m in missing]
    logic = typing.get_type_hints(service.build)["return"]
    bind: Callable[[Any], Any] = lambda t: logic if t is role_kinds.L else t  # noqa: E731
    found = []
    for member in members:
        params, hints = _declared(protocol, member)
        fn = getattr(service, member)
        got, got_hints = list(inspect.signature(fn).parameters.values()), typing.get_type_hints(fn)
        if len(got) != len(params):
            found.append(f"{member} takes {[p.name for p in got]}, not {[p.name for p in params]}")
            continue
        for want, have in zip(params, got, strict=True):
            if want.kind is inspect.Parameter.POSITIONAL_ONLY:
                ok = have.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            else:
                ok = (have.name, have.kind) == (want.name, want.kind)
            if not ok:
                found.append(f"{member}'s {have.name} is not {want.name} ({want.kind.description})")
            if got_hints.get(have.name) != bind(hints[want.name]):
                found.append(
                    f"{member}'s {have.name}: {got_hints.get(have.name)}, not {bind(hints[want.name])}"
                )
        want_return, have_return = hints["return"], got_hints.get("return")
        if want_return == role_kinds.L | None:
            allowed = {logic, logic | None}
        else:
            allowed = {bind(want_return)} if want_return is not Any else {have_return}
        if have_return not in allowed:
            found.append(f"{member} returns {have_return}, not {bind(want_return)}")
    return found


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kinds_service_module_provides_the_declared_protocol(kind: str) -> None:
    role = role_kind(kind)
    assert isinstance(role, RoleKind)
    module = inspect.getmodule(role.build)
    assert module is not None and module.__name__ == f"weightstream.{kind}.service"
    # a role that keeps its state across configurations says so, and role_kinds passes it on
    assert role.reconfigure is getattr(module, "reconfigure", None)
    assert mismatches(module, RoleService) == []
    if role.reconfigure is not None:
        assert mismatches(module, StatefulRoleService) == []
    assert (role.build, role.add_servicer) == (module.build, module.add_servicer)


def test_an_unknown_kind_is_refused_naming_the_kinds() -> None:
    with pytest.raises(ValueError, match=r"no role kind 'coordinator': the kinds are memoryx, swarmx"):
        role_kind("coordinator")


def test_the_import_contract_covers_every_module_but_role_kinds() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["name"] == CONTRACT]
    top = {p.stem for p in PACKAGE.glob("*.py")} | {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    # proto: generated code
    expected = {f"weightstream.{m}" for m in top - {"__init__", "__main__", "role_kinds", "proto"}}
    assert set(contract["source_modules"]) == expected
    assert set(contract["forbidden_modules"]) == {f"weightstream.{k}.service" for k in KINDS}


class OddLogic:
    pass


def _odd_module(**functions: Callable[..., Any]) -> ModuleType:
    module = ModuleType("odd")
    module.__dict__.update(functions)
    return module


def _build(job: JobSpec) -> OddLogic:
    return OddLogic()


def _add_servicer_renamed(host: RoleHost, srv: grpc.Server) -> None:
    pass


def _add_servicer(host: RoleHost, server: grpc.Server) -> None:
    pass


def _reconfigure_int(logic: int, job: JobSpec) -> OddLogic | None:
    return None


def _reconfigure_kept(kept: OddLogic, job: JobSpec) -> OddLogic:
    return kept


def test_a_module_that_differs_from_the_protocol_is_told_apart() -> None:
    """The check itself: a renamed parameter, a logic ``reconfigure`` does not take, a member missing."""
    odd = _odd_module(build=_build, add_servicer=_add_servicer_renamed, reconfigure=_reconfigure_int)
    assert mismatches(odd, StatefulRoleService) == [
        "add_servicer's srv is not server (positional or keyword)",
        f"reconfigure's logic: {int}, not {OddLogic}",
    ]
    # a name of its own for the logic (passed by position), and the logic itself returned: as declared
    fine = _odd_module(build=_build, add_servicer=_add_servicer, reconfigure=_reconfigure_kept)
    assert mismatches(fine, StatefulRoleService) == []
    assert mismatches(_odd_module(build=_build, add_servicer=_add_servicer), StatefulRoleService) == [
        "no reconfigure"
    ]
