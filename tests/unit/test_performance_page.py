"""docs/gen/performance_page.py: the performance page shows each bench's newest record per machine, with
its figures' targets, the command that produced it and the machine it ran on."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.bench_module import load_bench

ROOT = Path(__file__).resolve().parents[2]
EPYC = {"cpu": "AMD EPYC", "cores": 2, "ram_gib": 23.5}
XEON = {"cpu": "Intel Xeon", "cores": 2, "ram_gib": 23.5}


@pytest.fixture(scope="module")
def page() -> ModuleType:
    path = ROOT / "docs" / "gen" / "performance_page.py"
    spec = importlib.util.spec_from_file_location("performance_page", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["performance_page"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _kernels(
    ratio: float, date: str = "2026-11-27", machine: dict[str, Any] = EPYC, **extra: Any
) -> dict[str, Any]:
    return {
        "bench": "kernels",
        "date": date,
        "command": "python bench/kernels.py --repeats 3",
        "commit": "0123456789abcdef0123456789abcdef01234567",
        "machine": machine,
        "source": "run",
        "block_time_ratio_numpy_over_torch": ratio,
        **extra,
    }


def _write(tmp_path: Path, name: str, records: list[dict[str, Any]]) -> Path:
    (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + "\n")
    return tmp_path


def test_a_record_appears_with_its_machine_command_commit_and_target(
    page: ModuleType, tmp_path: Path
) -> None:
    md = page.render(page.read_records(_write(tmp_path, "kernels", [_kernels(0.937)])))
    assert "## GPT-2 block kernels" in md
    assert "**AMD EPYC, 2 cores, 23.5 GiB RAM**, 2026-11-27, commit `0123456789ab`" in md
    assert "```bash\npython bench/kernels.py --repeats 3\n```" in md
    assert "| block forward+backward, numpy / PyTorch | 0.937 | ≤ 1 | met |" in md


def test_a_figure_past_its_target_reads_not_met(page: ModuleType, tmp_path: Path) -> None:
    md = page.render(page.read_records(_write(tmp_path, "kernels", [_kernels(1.08)])))
    assert "| block forward+backward, numpy / PyTorch | 1.08 | ≤ 1 | **not met** |" in md


def test_the_latest_record_of_a_machine_wins(page: ModuleType, tmp_path: Path) -> None:
    # the newest date wins wherever it is in the file; of one date, the later line
    runs = [_kernels(0.911, "2026-11-28"), _kernels(0.933, "2026-11-28"), _kernels(0.902, "2026-11-26")]
    md = page.render(page.read_records(_write(tmp_path, "kernels", runs)))
    assert "| 0.933 |" in md and "0.911" not in md and "0.902" not in md


def test_each_machine_keeps_its_own_latest(page: ModuleType, tmp_path: Path) -> None:
    runs = [_kernels(0.951, machine=EPYC), _kernels(0.953, "2026-11-24", machine=XEON)]
    md = page.render(page.read_records(_write(tmp_path, "kernels", runs)))
    assert "**AMD EPYC, 2 cores, 23.5 GiB RAM**" in md and "**Intel Xeon, 2 cores, 23.5 GiB RAM**" in md
    assert "| 0.951 |" in md and "| 0.953 |" in md


def test_a_bench_the_page_does_not_know_shows_its_numbers(page: ModuleType, tmp_path: Path) -> None:
    new = {**_kernels(0.9), "bench": "new_bench", "command": "python bench/new_bench.py", "ratio_x": 1.5}
    md = page.render(page.read_records(_write(tmp_path, "new_bench", [new])))
    assert "## new_bench" in md and "| ratio x | 1.5 |  |  |" in md and "python bench/new_bench.py" in md


def test_a_line_that_is_not_a_record_is_named(page: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "kernels.jsonl").write_text(json.dumps(_kernels(0.9)) + "\n{cut\n")
    with pytest.raises(ValueError, match=r"kernels.jsonl:2: not a JSON line"):
        page.read_records(tmp_path)


def test_the_page_and_the_benches_name_machines_by_the_same_fields(page: ModuleType) -> None:
    assert page.MACHINE_KEYS == load_bench("machine").MACHINE_KEYS


def test_the_kept_results_give_every_bench_its_figures(page: ModuleType) -> None:
    """bench/results/ as committed: every bench the page knows has a record, every record names its
    machine, date and command, and each figure with a target is shown with it."""
    records = page.read_records(ROOT / "bench" / "results")
    for r in records:
        assert r.get("date") and r.get("command") and all(r["machine"].get(k) for k in page.MACHINE_KEYS), r
        assert r["source"] in ("run", "pooled", "transcribed"), r
    recorded = {r["bench"] for r in records}
    md = page.render(records)
    for name, bench in page.BENCHES.items():
        # a bench without a record yet is shown as such, with its targets: never with made-up figures
        assert (name in recorded) != (f"no record in `bench/results/{name}.jsonl`" in md), name
        for fig in bench.figures:
            if fig.target is not None:
                assert f"| {fig.label} | " in md and f" | {fig.target} |" in md, fig.label


def test_a_known_bench_without_a_record_shows_its_targets_and_command(
    page: ModuleType, tmp_path: Path
) -> None:
    md = page.render(page.read_records(_write(tmp_path, "kernels", [_kernels(0.937)])))
    assert "## Across hosts" in md and "no record in `bench/results/hosts.jsonl`" in md
    assert "```bash\npython bench/hosts.py\n```" in md
    simulate = "`weightstream simulate` across hosts, unlimited and 1 Gbit/s: larger relative error"
    assert f"| {simulate} | ≤ 0.15 |" in md
    assert "| step across hosts, links unlimited |  |" in md  # no target, no value
