"""Shared by the unit tests: a small valid params file (legacy layout) for a test to change a key of, and
the rule that a unit test starts no process.

While a test under tests/unit sets up, runs or tears down (its module- and session-scoped fixtures
included), every way of starting a process fails the test with a message naming it: subprocess's child
start, ``os.fork``/``os.forkpty``, ``os.posix_spawn``/``os.posix_spawnp``, ``os.system``, a
multiprocessing process's ``start`` and multiprocessing's own helper starts (forkserver, resource
tracker). A test that swallows the failure still fails when its phase ends. A test that needs a process
belongs in tests/integration.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import copy
import multiprocessing.process
import os
import platform
import subprocess
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest

# (owner, attribute, what the message calls it): each way a test could start a process. Popen's
# _execute_child covers subprocess.run/check_output/os.popen and asyncio's subprocesses, whether they
# fork_exec or posix_spawn; _posixsubprocess.fork_exec is what multiprocessing.util.spawnv_passfds calls
# to start a forkserver or a resource tracker (subprocess binds its own reference at import, so patching
# it here does not reach subprocess).
# h5py asks ``platform.processor()`` when first imported, which runs ``uname -p`` once and keeps the
# answer: asked here, before any test, so a unit test that is the first to import h5py starts no process
platform.processor()

_PROCESS_STARTS: list[tuple[object, str, str]] = [
    (subprocess.Popen, "_execute_child", "subprocess.Popen"),
    (os, "fork", "os.fork"),
    (os, "forkpty", "os.forkpty"),
    (os, "posix_spawn", "os.posix_spawn"),
    (os, "posix_spawnp", "os.posix_spawnp"),
    (os, "system", "os.system"),
    (multiprocessing.process.BaseProcess, "start", "multiprocessing Process.start"),
    (_posixsubprocess, "fork_exec", "multiprocessing's spawnv_passfds"),
]


@contextlib.contextmanager
def _process_starts_refused(item: pytest.Item) -> Iterator[list[str]]:
    """Within the block, every start in ``_PROCESS_STARTS`` fails the test ``item``; yields the messages
    of those tried, so that one the test caught and swallowed can still fail it. Undone on leaving."""
    tried: list[str] = []

    def refuse(what: str) -> Callable[..., Any]:
        def start(*args: Any, **kwargs: Any) -> Any:
            message = (
                f"{item.nodeid} started a process ({what}): tests under tests/unit start none; "
                "a test that needs a process belongs in tests/integration"
            )
            tried.append(message)
            pytest.fail(message)

        return start

    with pytest.MonkeyPatch.context() as patch:
        for owner, name, what in _PROCESS_STARTS:
            patch.setattr(owner, name, refuse(what))
        yield tried


def _no_process_started(item: pytest.Item) -> Generator[None, object, object]:
    """One phase of ``item`` (set-up, call or teardown) with process starts refused; fails the phase if
    it tried one, even where the test caught the failure raised at the attempt."""
    with _process_starts_refused(item) as tried:
        result = yield
    if tried:
        pytest.fail(tried[0], pytrace=False)
    return result


# Hooks rather than an autouse fixture: a function-scoped fixture would come after the module- and
# session-scoped fixtures a test uses, and those must start no process either. A conftest's runtest
# hooks run only for the tests under its folder.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _no_process_started(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _no_process_started(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    return (yield from _no_process_started(item))


_SMALL: dict[str, Any] = {
    "train_input": {"data_processor": "SyntheticDataProcessor", "batch_size": 8, "max_sequence_length": 16},
    "model": {
        "name": "gpt2",
        "vocab_size": 256,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_heads": 4,
        "max_position_embeddings": 16,
    },
    "optimizer": {"optimizer_type": "adamw", "learning_rate": 1.0e-3},
    "runconfig": {"max_steps": 4},
}


@pytest.fixture
def small() -> dict[str, Any]:
    """A fresh copy of a small gpt2 params file that validates; change a key to break it."""
    return copy.deepcopy(_SMALL)
