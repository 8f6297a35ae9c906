"""role_kinds: every role package is listed once, loads as a ``RoleKind``, and the import linter's contract
that only role_kinds imports a role's service module covers every module of the package."""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

import pytest

from weightstream.role_kinds import KINDS, RoleKind, role_kind

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "services" / "weightstream"
CONTRACT = "a role's service module is imported only through role_kinds, the declared role kinds"


def role_packages() -> set[str]:
    """The packages that serve a role: a service module with an ``add_servicer``."""
    return {p.parent.name for p in PACKAGE.glob("*/service.py") if "def add_servicer(" in p.read_text()}


def test_every_role_package_is_listed() -> None:
    assert set(KINDS) == role_packages()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_loads_with_what_serving_it_takes(kind: str) -> None:
    role = role_kind(kind)
    assert isinstance(role, RoleKind)
    assert list(inspect.signature(role.build).parameters) == ["job"]
    assert list(inspect.signature(role.add_servicer).parameters) == ["host", "server"]
    module = inspect.getmodule(role.build)
    assert module is not None and module.__name__ == f"weightstream.{kind}.service"
    # a role that keeps its state across configurations says so, and role_kinds passes it on
    assert role.reconfigure is getattr(module, "reconfigure", None)


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
