"""The performance page's Markdown from the records in ``bench/results/*.jsonl``.

Pure functions: ``read_records`` reads the files, ``latest`` keeps each bench's newest record per machine,
``render`` writes the page. The figures shown for each bench, and their targets, are ``BENCHES`` below; a
bench without an entry there still appears, with the numbers at the top level of its record. The record
format is bench/results/README.md's.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the fields that name a machine (bench/machine.py's MACHINE_KEYS): one section per distinct triple
MACHINE_KEYS = ("cpu", "cores", "ram_gib")

Record = dict[str, Any]


@dataclass(frozen=True)
class Target:
    """What a figure must be: ``op`` one of ``<=``, ``>=``, ``abs<=`` (its size) or ``==``."""

    op: str
    limit: float | bool

    def met(self, value: Any) -> bool:
        check: dict[str, Callable[[Any, Any], bool]] = {
            "<=": operator.le,
            ">=": operator.ge,
            "abs<=": lambda v, lim: abs(v) <= lim,
            "==": operator.eq,
        }
        return check[self.op](value, self.limit)

    def __str__(self) -> str:
        limit = _fmt(self.limit)
        return {"<=": f"≤ {limit}", ">=": f"≥ {limit}", "abs<=": f"within ±{limit}", "==": limit}[self.op]


@dataclass(frozen=True)
class Figure:
    """One row of a bench's table: ``path`` walks the record's keys; ``scale`` and ``unit`` for reading."""

    label: str
    path: tuple[str, ...]
    target: Target | None = None
    scale: float = 1.0
    unit: str = ""


@dataclass(frozen=True)
class Bench:
    title: str
    figures: tuple[Figure, ...]


def _at(*path: str) -> tuple[str, ...]:
    return path


LE, GE = "<=", ">="

# The targets are the project's performance goals (the README's Status table and its sections).
BENCHES: dict[str, Bench] = {
    "streaming": Bench(
        "Streaming overhead and broadcast",
        (
            Figure(
                "step of `weightstream run --num_csx 1` / in-process reference (median of pairs)",
                _at("streaming_overhead_ratio"),
                Target(LE, 1.05),
            ),
            Figure("the interval the pairs put that median in", _at("streaming_overhead_interval")),
            Figure(
                "broadcast MemoryX → SwarmX → worker / raw gRPC stream",
                _at("bandwidth_ratio_swarmx_over_raw"),
                Target(GE, 0.8),
            ),
            Figure(
                "MemoryX alone / raw gRPC stream", _at("bandwidth_ratio_memoryx_over_raw"), Target(GE, 0.9)
            ),
            Figure("tokens/s, num_csx 1", _at("tokens_per_second", "num_csx_1")),
            Figure("tokens/s, num_csx 2", _at("tokens_per_second", "num_csx_2")),
        ),
    ),
    "streaming_pooled": Bench(
        "Streaming overhead, runs pooled",
        (
            Figure(
                "overhead, median of every run's pairs", _at("streaming_overhead_ratio"), Target(LE, 1.05)
            ),
            Figure("its interval", _at("streaming_overhead_interval")),
            Figure("runs", _at("runs")),
            Figure("pairs", _at("pairs")),
        ),
    ),
    "kernels": Bench(
        "GPT-2 block kernels",
        (
            Figure(
                "block forward+backward, numpy / PyTorch",
                _at("block_time_ratio_numpy_over_torch"),
                Target(LE, 1.0),
            ),
            Figure("block forward+backward, numpy", _at("units", "block", "fwd_bwd_s"), unit="s"),
            Figure("block forward+backward, PyTorch", _at("torch_block_fwd_bwd_s"), unit="s"),
        ),
    ),
    "peer": Bench(
        "End to end against PyTorch",
        (
            Figure(
                "tokens/s, `--num_csx 1` / PyTorch eager",
                _at("ratio_weightstream_over_torch"),
                Target(GE, 1.0),
            ),
            Figure("tokens/s, `--num_csx 2` / PyTorch DDP (2 processes)", _at("ratio_num_csx_2_over_ddp")),
            Figure("tokens/s, weightstream num_csx 1", _at("tokens_per_second", "weightstream_num_csx_1")),
            Figure("tokens/s, PyTorch eager", _at("tokens_per_second", "torch_eager")),
        ),
    ),
    "sparsity": Bench(
        "Weight sparsity",
        (
            Figure(
                "wire bytes a step at 90% sparsity / dense",
                _at("by_sparsity", "0.9", "wire_bytes_ratio"),
                Target(LE, 0.2),
            ),
            Figure(
                "worker compute at 90% sparsity / dense",
                _at("by_sparsity", "0.9", "worker_time_ratio"),
                Target(LE, 1.0),
            ),
            Figure("step time at 90% sparsity / dense", _at("by_sparsity", "0.9", "step_time_ratio")),
        ),
    ),
    "beyond_ram": Bench(
        "Bigger than memory",
        (
            Figure("weights + Adam state / RAM", _at("state_over_ram"), Target(GE, 1.0)),
            Figure(
                "the appliance's peak resident memory / RAM",
                _at("peak_resident_appliance_over_ram"),
                Target(LE, 0.6),
            ),
            Figure("loss falls every step", _at("loss_falls"), Target("==", True)),
            Figure("parameters", _at("parameters")),
        ),
    ),
    "scaling": Bench(
        "Scaling model, calibrated from N = 1",
        (
            Figure("predicted / measured step - 1, N = 2", _at("error", "2"), Target("abs<=", 0.2)),
            Figure("predicted / measured step - 1, N = 4", _at("error", "4"), Target("abs<=", 0.2)),
            Figure("measured step, N = 1", _at("measured", "1"), unit="s"),
            Figure("Cerebras-like preset: scaling breaks (< 80%) at N", _at("cerebras_like", "breaks_at")),
        ),
    ),
    "chaos": Bench(
        "Cost of a fault",
        (
            Figure(
                "time lost per fault, in the run's steps",
                _at("cost_per_fault_in_steps_in_run"),
                Target(LE, 2),
            ),
            Figure(
                "faulty run bitwise equal to the fault-free one", _at("bitwise_equal"), Target("==", True)
            ),
            Figure("SIGKILL noticed, median", _at("detection_s_sigkill_median"), unit="s"),
            Figure("SIGSTOP (a hung role) noticed", _at("detection_s_sigstop"), unit="s"),
            Figure("recovery, median", _at("recovery_s_median"), unit="s"),
            Figure(
                "steps replayed after MemoryX faults (with replicas)",
                _at("replay_steps_after_memoryx_faults"),
            ),
        ),
    ),
    "replicas": Bench(
        "What MemoryX replicas cost without faults",
        (
            Figure(
                "step time with replicas / neither replicas nor snapshots",
                _at("ratio_to_none", "replicas", "step_s_median"),
            ),
            Figure(
                "MemoryX memory with replicas / without",
                _at("ratio_to_none", "replicas", "memoryx_rss_peak"),
            ),
            Figure(
                "step time with snapshots every 10 steps / neither (mean)",
                _at("ratio_to_none", "snapshots", "step_s_mean"),
            ),
        ),
    ),
    "chaos_hosts": Bench(
        "Host faults on Slurm",
        (
            Figure(
                "a host lost: time lost within SlurmdTimeout + 2 steps, every one",
                _at("host_loss", "all_within_target"),
                Target("==", True),
            ),
            Figure("a host lost: time lost, worst", _at("host_loss", "lost_s_max"), unit="s"),
            Figure(
                "a host lost: noticed (its first restart), worst",
                _at("host_loss", "detection_s_max"),
                unit="s",
            ),
            Figure("a 30 s partition: time lost, worst", _at("partition", "lost_s_max"), unit="s"),
            Figure(
                "a 30 s partition: old steps left once the link is back",
                _at("partition", "old_steps_left_total"),
                Target("==", 0),
            ),
            Figure("a link at 1/20: the straggler's ratio, median", _at("slow_link", "ratio_median")),
            Figure(
                "faulty run bitwise equal to the fault-free one", _at("bitwise_equal"), Target("==", True)
            ),
        ),
    ),
    "rpc_costs": Bench(
        "A unit's control message on the role plane",
        (
            Figure("CPU a unit, one stream a pass / one call a unit", _at("ratio_stream_over_call")),
            Figure(
                "CPU a unit, one call a unit, both ends (TCP)",
                _at("tcp_both_ends_cpu_us_per_unit", "call_per_unit"),
                unit="µs",
            ),
        ),
    ),
    "hosts": Bench(
        "Across hosts",
        (
            Figure(
                "broadcast through SwarmX, every link 1 Gbit/s: busiest link's bytes/s / link rate",
                _at("broadcast_link_ratio_1gbit"),
                Target(GE, 0.8),
            ),
            Figure(
                "step, num_csx 2, each worker on its own host / every role on one host",
                _at("cross_host_step_ratio"),
                Target(LE, 1.15),
            ),
            Figure(
                "`weightstream simulate` across hosts, unlimited and 1 Gbit/s: larger relative error",
                _at("simulate_max_error"),
                Target(LE, 0.15),
            ),
            Figure("step across hosts, links unlimited", _at("step_s", "across_hosts"), unit="s"),
            Figure("step across hosts, links 1 Gbit/s", _at("step_s", "across_hosts_1gbit"), unit="s"),
        ),
    ),
    "plane_bytes": Bench(
        "A byte on the network plane (one loopback hop, both ends' CPU)",
        (
            Figure("network data plane (bulk transfers)", _at("plane", "cpu_ns_per_byte"), unit="CPU-ns/B"),
            Figure("network data plane, inline over gRPC", _at("inline", "cpu_ns_per_byte"), unit="CPU-ns/B"),
            Figure("plain gRPC messages", _at("grpc", "cpu_ns_per_byte"), unit="CPU-ns/B"),
            Figure("TCP socket, recv_into", _at("socket", "cpu_ns_per_byte"), unit="CPU-ns/B"),
            Figure("inline over gRPC / network plane", _at("inline_over_plane_cpu")),
            Figure("socket / network plane", _at("socket_over_plane_cpu")),
            Figure("network data plane, one hop", _at("plane", "gb_per_s"), unit="GB/s"),
        ),
    ),
}


def read_records(results: Path) -> list[Record]:
    """Every record of ``results/*.jsonl``, file by file (sorted by name), in file order; blank lines are
    skipped, a line that is not a JSON object raises ValueError naming its file and line."""
    records = []
    for path in sorted(results.glob("*.jsonl")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not a JSON line ({e})") from e
            if not isinstance(record, dict) or "bench" not in record:
                raise ValueError(f"{path}:{number}: not a bench record (no 'bench' field)")
            records.append(record)
    return records


def machine_key(record: Record) -> tuple[Any, ...]:
    machine = record.get("machine") or {}
    return tuple(machine.get(k) for k in MACHINE_KEYS)


def latest(records: Iterable[Record]) -> dict[tuple[str, tuple[Any, ...]], Record]:
    """The newest record of each (bench, machine): the latest ``date``, and of one date the later line."""
    out: dict[tuple[str, tuple[Any, ...]], Record] = {}
    for record in sorted(records, key=lambda r: r.get("date") or ""):  # stable: file order within a day
        out[(record["bench"], machine_key(record))] = record
    return out


def _fmt(value: Any, scale: float = 1.0, unit: str = "") -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict) and {"low", "high"} <= value.keys():  # a median's interval
        coverage = f" ({value['coverage']:.0%})" if value.get("coverage") is not None else ""
        return f"{_fmt(value['low'])}\u2013{_fmt(value['high'])}{coverage}"  # an en dash
    if isinstance(value, int | float):
        v = value * scale if scale != 1.0 else value
        text = f"{v:,}" if isinstance(v, int) else f"{v:,.4g}"
        return f"{text} {unit}".strip()
    return "—" if value is None else str(value)


def _lookup(record: Record, path: tuple[str, ...]) -> Any:
    value: Any = record
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _figures(record: Record) -> tuple[Figure, ...]:
    bench = BENCHES.get(record["bench"])
    if bench is not None:
        return bench.figures
    skip = {"date", "commit", "source", "note"}  # a bench without an entry: its top-level numbers
    return tuple(
        Figure(k.replace("_", " "), (k,))
        for k, v in record.items()
        if k not in skip and isinstance(v, int | float) and not isinstance(v, bool)
    )


def machine_name(record: Record) -> str:
    """``AMD EPYC, 2 cores, 23.5 GiB RAM`` (what the record says; "unknown machine" without one)."""
    cpu, cores, ram = machine_key(record)
    parts = [str(cpu) if cpu else "unknown machine"]
    parts += [f"{cores} cores"] if cores else []
    parts += [f"{_fmt(ram)} GiB RAM"] if ram else []
    return ", ".join(parts)


def render_record(record: Record) -> str:
    """One record: its machine, date, commit and source, the command, and its figures with targets."""
    commit = record.get("commit")
    where = [
        f"**{machine_name(record)}**",
        str(record.get("date") or "undated"),
        f"commit `{commit[:12]}`" if commit else "commit not recorded",
        {"transcribed": "transcribed from the documentation", "pooled": "pooled runs"}.get(
            record.get("source") or "", "as the bench printed it"
        ),
    ]
    lines = [
        ", ".join(where),
        "",
        "```bash",
        str(record.get("command") or "(command not recorded)"),
        "```",
        "",
    ]
    lines += ["| figure | value | target | |", "|---|---|---|---|"]
    for fig in _figures(record):
        value = _lookup(record, fig.path)
        if value is None:
            continue  # not measured in this record (a transcribed record has only what was written down)
        target = str(fig.target) if fig.target else ""
        verdict = "" if fig.target is None else ("met" if fig.target.met(value) else "**not met**")
        lines.append(f"| {fig.label} | {_fmt(value, fig.scale, fig.unit)} | {target} | {verdict} |")
    if record.get("note"):
        lines += ["", f"Note: {record['note']}"]
    return "\n".join(lines) + "\n"


def render(records: Iterable[Record]) -> str:
    """The performance page: for each bench (``BENCHES``' order, then others by name) the newest record
    on each machine."""
    newest = latest(records)
    order = list(BENCHES) + sorted({b for b, _ in newest} - set(BENCHES))
    out = [
        "# Performance",
        "",
        "The current figures of each benchmark, generated from the records in `bench/results/` (one JSON "
        "line per run, the files keep every earlier run): for each bench, the newest record on each machine, "
        "with the command that produced it. Each figure is a ratio measured side by side in one run where "
        "it can be: these machines are shared and noisy, so ratios mean more than absolute numbers.",
        "",
    ]
    for bench in order:
        found = sorted((r for (b, _), r in newest.items() if b == bench), key=machine_name)
        if not found:
            out += [render_awaiting(bench)]  # a bench the page knows: its targets, before its first run
            continue
        title = BENCHES[bench].title if bench in BENCHES else bench
        out += [f"## {title}", "", f"From `bench/results/{bench}.jsonl`.", ""]
        out += [render_record(r) for r in found]
    return "\n".join(out)


def render_awaiting(bench: str) -> str:
    """A known bench with no record yet: its figures and their targets, and the command to measure them."""
    title, command = BENCHES[bench].title, f"python bench/{bench}.py"
    intro = f"Not measured yet: no record in `bench/results/{bench}.jsonl`. Its figures and their targets:"
    lines = [f"## {title}", "", intro, "", "```bash", command, "```", "", "| figure | target |", "|---|---|"]
    lines += [f"| {fig.label} | {fig.target or ''} |" for fig in BENCHES[bench].figures]
    return "\n".join(lines) + "\n"
