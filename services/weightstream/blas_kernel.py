"""Which of OpenBLAS's kernels numpy loads, chosen before numpy is imported.

numpy's OpenBLAS picks its kernels by CPU when it loads, and reads ``OPENBLAS_CORETYPE`` to be told
otherwise; once loaded, nothing changes them. On an AMD Zen 4 (family 25 with AVX-512) it picks the
SkylakeX kernels, written for Intel's full-width AVX-512 units, where Zen 4 runs each 512-bit operation
as two 256-bit halves. Its AVX2 kernels (``Haswell``) are faster there: the workers' sgemm shapes at 107-110
GFLOP/s a core against 101-106, two processes at once 106-108 against 97-103, and a GPT-2 d768 block's
forward and backward 0.470 s against 0.496 (on a 2-core AMD EPYC, Zen 4). So a process
that imports ``weightstream`` before numpy asks for them there, and nowhere else: Intel CPUs compute with
MKL (numerics/_gemm.py), other CPUs keep OpenBLAS's own choice, and Zen 5's full-width AVX-512 was not
measured.

The choice is a function of the CPU alone, made the same way in every process on a machine, so the
workers, the in-process reference trainer and a rerun all compute with the same kernels (bitwise
reproducibility holds). ``OPENBLAS_CORETYPE`` set by the user wins. In a process that imported numpy
before ``weightstream`` the choice comes too late for itself; the roles it starts then inherit the kernels
it has. This module imports only the standard library (threadpoolctl in that late case): it runs from
``weightstream/__init__.py``, before anything imports numpy.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

__all__ = ["CORETYPE_ENV", "choose_openblas_kernel", "numpys_blas", "preferred_coretype"]

CORETYPE_ENV = "OPENBLAS_CORETYPE"

_ZEN4_FAMILY = 25  # AMD family 19h: Zen 3 (no AVX-512) and Zen 4 (AVX-512 on 256-bit units)


def _cpu_fields(cpuinfo: str) -> dict[str, str]:
    """The first processor's ``key: value`` lines of /proc/cpuinfo."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block ends at its blank line
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def preferred_coretype(cpuinfo: str) -> str | None:
    """The OpenBLAS kernel set this CPU computes fastest with where it differs from OpenBLAS's own pick
    (``Haswell`` on a Zen 4), else None."""
    fields = _cpu_fields(cpuinfo)
    try:
        family = int(fields.get("cpu family", ""))
    except ValueError:
        return None
    flags = fields.get("flags", "").split()
    if fields.get("vendor_id") == "AuthenticAMD" and family == _ZEN4_FAMILY and "avx512f" in flags:
        return "Haswell"
    return None


def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return f.read(64 * 1024)  # the first processor's block is all that is read
    except OSError:
        return ""  # not Linux: OpenBLAS's own choice


def choose_openblas_kernel(
    environ: MutableMapping[str, str] | None = None,
    modules: Mapping[str, object] | None = None,
    cpuinfo: str | None = None,
) -> str | None:
    """Set ``OPENBLAS_CORETYPE`` for this CPU if numpy has not loaded its OpenBLAS yet; return the kernel
    set this process asks for (the user's own setting included), or None where OpenBLAS chooses.

    The variable stays in the environment, so the roles this process starts inherit the same choice."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if environ.get(CORETYPE_ENV):
        return environ[CORETYPE_ENV]  # the user's choice
    coretype = preferred_coretype(_read_cpuinfo() if cpuinfo is None else cpuinfo)
    if coretype is None:
        return None  # OpenBLAS's own choice, the same in every process here
    if "numpy" in modules:
        # Too late for this process: numpy's OpenBLAS has chosen. The roles it starts are told to use
        # the kernels it has, so that a job's processes compute alike (a test compares them bitwise).
        coretype = _loaded_coretype()
        if coretype is None:
            return None
    environ[CORETYPE_ENV] = coretype
    return coretype


def _loaded_coretype() -> str | None:
    """The kernel set of the OpenBLAS already loaded in this process, or None if none is."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    info = numpys_blas(
        [i for i in threadpool_info() if i.get("internal_api") == "openblas" and i.get("architecture")]
    )
    return str(info["architecture"]) if info is not None else None


def numpys_blas(infos: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """Of BLAS libraries as ``threadpoolctl.threadpool_info()`` lists them, the one numpy's products run on:
    its own wheel's (in ``numpy.libs``) where listed, else the first; None if none. scipy's wheels load
    another OpenBLAS (another version), and threadpoolctl lists the two in no fixed order."""
    own = [i for i in infos if os.path.basename(os.path.dirname(i.get("filepath", ""))) == "numpy.libs"]
    return own[0] if own else (infos[0] if infos else None)
