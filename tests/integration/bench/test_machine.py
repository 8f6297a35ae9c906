"""bench/machine.py in a bench run as a script: its JSON line leads with the machine, date, command and
commit. The reading of the machine is tested in tests/unit/bench/test_machine.py."""

from __future__ import annotations

import re

from tests.bench_module import load_bench


def test_a_record_leads_with_where_when_and_what_ran() -> None:
    machine = load_bench("machine")
    figures = {"bench": "ignored", "machine": {"numpy": "2.3"}, "ratio": 0.95}
    out = machine.record("kernels", figures, ["/anywhere/bench/kernels.py", "--repeats", "3"])
    assert list(out)[:6] == ["bench", "date", "command", "commit", "machine", "source"]
    assert out["bench"] == "kernels" and out["source"] == "run" and out["ratio"] == 0.95
    assert out["command"] == "python bench/kernels.py --repeats 3"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", out["date"])
    assert out["commit"] is None or re.fullmatch(r"[0-9a-f]{40}(-dirty)?", out["commit"])
    assert set(machine.MACHINE_KEYS) <= out["machine"].keys() and out["machine"]["numpy"] == "2.3"
