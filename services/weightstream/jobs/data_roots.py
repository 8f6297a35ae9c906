"""Where jobs submitted to the service may read data: under the service's data roots, nowhere else.

A job reads its data with the service's rights and can carry what it read out in the checkpoint it trains,
so a path a REST or gRPC user names (``train_input.data_dir``, ``eval_input.data_dir``, each
``mixture[i].data_dir``, and ``runconfig.checkpoint_path``, a model to start from) must resolve, every
symlink followed, inside one of the roots an operator chose (``serve --data-root``). The answer to a path
outside them is one message, the same whether or not the path exists, given before anything about it is
looked at; a data file inside a root that is a link leading out is refused too. The job's params then
carry the resolved path, so the job reads exactly what was checked. A relative ``data_dir`` is taken
from the first root: ``data_dir: shakespeare`` is ``<first root>/shakespeare``.

``weightstream run`` (one's own machine, no service) never comes here: it reads any path its user can.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from weightstream.params import Params, Problem

__all__ = ["confine_data", "default_data_root", "resolve_data_roots", "within"]

# what the file data processors read from a data_dir (data/processors.py): the files whose links are checked
_DATA_FILES = ("*.txt", "*.bin", "*.h5")
_CHECKPOINT_FILES = ("*.safetensors", "*.json")  # what a starting checkpoint's directory is read for


def default_data_root(data_dir: Path) -> Path:
    return data_dir / "datasets"


def _names(roots: Sequence[Path]) -> str:
    return ", ".join(map(str, roots))


def within(path: str, root: str) -> bool:
    """``path`` is ``root`` or lies under it (both real paths: links already followed)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def resolve_data_roots(roots: Sequence[Path], data_dir: Path) -> tuple[Path, ...]:
    """The roots as real paths (default: ``<data_dir>/datasets``). ValueError if one holds the service's
    job directory or lies inside it: jobs could then read each other's files."""
    jobs = os.path.realpath(data_dir / "jobs")
    out = []
    for root in roots or [default_data_root(data_dir)]:
        real = os.path.realpath(root)
        if within(jobs, real) or within(real, jobs):
            raise ValueError(
                f"data root {root} overlaps the service's job directory {jobs}: jobs could read each "
                "other's checkpoints and logs; give a directory of datasets apart from --data-dir/jobs"
            )
        out.append(Path(real))
    return tuple(out)


def _confine_one(
    value: str, field: str, roots: Sequence[Path], problems: list[Problem], files: Sequence[str] = _DATA_FILES
) -> str:
    """``value``'s real path if it and the data files in it stay inside ``roots``; else a problem."""
    candidate = value if os.path.isabs(value) else os.path.join(roots[0], value)
    # follows every link that exists; never raises for a missing path (a NUL byte names no path at all)
    real = os.path.realpath(candidate) if "\0" not in candidate else ""
    if not any(within(real, str(r)) for r in roots):
        # one message for any path outside, whatever is (or is not) there: only what the user wrote is echoed
        problems.append(Problem(field, f"is outside the service's data roots ({_names(roots)})", value))
        return value
    for pattern in files:  # inside a root: listing it tells nothing about the rest of the machine
        for f in sorted(Path(real).glob(pattern)):
            if not any(within(os.path.realpath(f), str(r)) for r in roots):
                problems.append(
                    Problem(
                        field, f"holds {f.name!r}, a link leading outside the service's data roots", value
                    )
                )
    return real


def confine_data(p: Params, roots: Sequence[Path]) -> tuple[Params, list[Problem]]:
    """``p`` with every data path replaced by its real path inside ``roots``, and a problem naming each
    field whose path (or a data file in it) is outside them."""
    problems: list[Problem] = []
    updates = {}
    for sec in ("train_input", "eval_input"):
        inp = getattr(p, sec)
        if inp is None:
            continue
        update: dict[str, object] = {}
        if isinstance(inp.data_dir, str):
            update["data_dir"] = _confine_one(inp.data_dir, f"{sec}.data_dir", roots, problems)
        elif inp.data_dir is not None:
            update["data_dir"] = [
                _confine_one(d, f"{sec}.data_dir[{i}]", roots, problems) for i, d in enumerate(inp.data_dir)
            ]
        if inp.mixture is not None:
            update["mixture"] = [
                m.model_copy(
                    update={
                        "data_dir": _confine_one(m.data_dir, f"{sec}.mixture[{i}].data_dir", roots, problems)
                    }
                )
                for i, m in enumerate(inp.mixture)
            ]
        if update:
            updates[sec] = inp.model_copy(update=update)
    start = p.runconfig.checkpoint_path
    if start is not None:
        real = _confine_one(start, "runconfig.checkpoint_path", roots, problems, _CHECKPOINT_FILES)
        updates["runconfig"] = p.runconfig.model_copy(update={"checkpoint_path": real})
    return p.model_copy(update=updates), problems
