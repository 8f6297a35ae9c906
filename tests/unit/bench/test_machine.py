"""bench/machine.py: every bench's JSON line names its machine, date, command and commit, in one format."""

from __future__ import annotations

import re
from pathlib import Path

from tests.bench_module import load_bench

BENCH = Path(__file__).resolve().parents[3] / "bench"
CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\nflags\t\t: avx2\n"


def test_the_machine_is_read_from_cpuinfo_and_meminfo() -> None:
    machine = load_bench("machine")
    assert machine.cpu_model(CPUINFO) == "AMD EPYC 9R14"
    assert machine.ram_gib("MemFree: 1 kB\nMemTotal:       24684096 kB\n") == 23.5
    assert machine.ram_gib("") is None


def test_every_bench_that_prints_a_line_prints_a_record() -> None:
    """A bench that builds its line without bench/machine.py's record would print figures of no machine."""
    prints = re.compile(r"print\(\s*json\.dumps\(")
    benches = [
        p
        for p in BENCH.glob("*.py")
        if prints.search(p.read_text()) and p.name not in ("pool.py", "machine.py")
    ]
    assert len(benches) >= 9
    bare = [p.name for p in benches if not re.search(r"record\(\s*\"" + p.stem + '"', p.read_text())]
    assert not bare, f"these benches print their line without machine.record: {bare}"
