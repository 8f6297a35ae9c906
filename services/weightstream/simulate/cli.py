"""``weightstream simulate``: the scaling model from the command line (registered in ``weightstream.cli``)."""

from __future__ import annotations

import dataclasses
import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from weightstream.data.check import with_sequence_lengths
from weightstream.params import ParamsError, load_params
from weightstream.simulate.cluster import PRESETS, Cluster, ClusterError, load_cluster
from weightstream.simulate.model import predict
from weightstream.simulate.report import PLOT_HINT, breaks_line, document, plot, table
from weightstream.simulate.workload import build_workload

__all__ = ["DEFAULT_NS", "DataPlane", "parse_ns", "simulate"]

DEFAULT_NS = "1,2,4,8,16,32,64,128,192"
MAX_N = 100_000  # beyond this the tree (built node by node, as make_plan does) takes a while for nothing

# option -> Cluster field, for the figures that can be set one by one
FIGURES = {
    "--worker-flops": "worker_flops",
    "--link-bandwidth": "link_bandwidth",
    "--link-latency": "link_latency_s",
    "--relay": "relay",
    "--fanout": "swarmx_fanout",
    "--swarmx-bandwidth": "swarmx_bandwidth",
    "--memoryx-shards": "memoryx_shards",
    "--update-rate": "memoryx_update_rate",
    "--host-cores": "host_cores",
    "--workers-per-host": "workers_per_host",
}
OPTION_OF = {field: option for option, field in FIGURES.items()}
RECALIBRATE = "python bench/scaling.py --calibration-out FILE"


class DataPlane(StrEnum):
    """How the roles exchange tensors: a calibration prices both, from runs on one host."""

    shared_memory = "shared_memory"  # the cluster's own figures (a calibration's: every role on one host)
    network = "network"  # roles on separate hosts, every byte on the network plane (``over_network``)


err = Console(stderr=True)


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True, highlight=False)
    return typer.Exit(2)


def parse_ns(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; raises ValueError naming the bad item."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or not 1 <= int(item) <= MAX_N:
            raise ValueError(f"--num_csx: {item!r} is not a worker count (an integer from 1 to {MAX_N})")
        out.append(int(item))
    return out


def _base_cluster(cluster: str | None, calibration: Path | None) -> Cluster:
    if cluster is not None and calibration is not None:
        raise ClusterError("--cluster and --calibration both give the cluster: use one")
    if calibration is not None:
        try:
            return load_cluster(calibration)
        except ClusterError as e:
            raise ClusterError(f"--calibration {e}") from e
    name = cluster or "cerebras-like"
    if name in PRESETS:
        return PRESETS[name]()
    if not Path(name).is_file():
        raise ClusterError(f"--cluster: {name!r} is neither a preset ({', '.join(PRESETS)}) nor a file")
    try:
        return load_cluster(Path(name))
    except ClusterError as e:
        raise ClusterError(f"--cluster {e}") from e


def _over_network(base: Cluster, cluster: str | None, calibration: Path | None) -> Cluster:
    """``base`` with the network data plane's figures in place; ClusterError when it has none."""
    if not base.has_network_figures:
        source = f"--calibration {calibration}" if calibration else f"--cluster {cluster or base.name}"
        raise ClusterError(
            f"--data-plane network: {source} has no network-plane figures (network_stream_cpu_s_per_byte, "
            f"network_link_bandwidth); recalibrate with `{RECALIBRATE}` (its null run over gRPC measures "
            "them) or give them in a --cluster file"
        )
    return base.over_network()


def simulate(
    params: Annotated[
        Path, typer.Argument(help="params YAML: the model and batch to price", show_default=False)
    ],
    num_csx: Annotated[str, typer.Option("--num_csx", help="worker counts, comma-separated")] = DEFAULT_NS,
    cluster: Annotated[
        str | None,
        typer.Option(
            help=f"a preset ({', '.join(PRESETS)}, the default) or a JSON/YAML file of Cluster fields"
        ),
    ] = None,
    calibration: Annotated[
        Path | None, typer.Option(help="a calibration of this machine, as bench/scaling.py writes it")
    ] = None,
    data_plane: Annotated[
        DataPlane,
        typer.Option(
            "--data-plane",
            help="how roles exchange tensors: shared_memory (the cluster's figures as given; a calibration's "
            "are every role on one host) or network (roles on separate hosts over gRPC: the calibration's "
            "figures from its loopback gRPC run; options such as --link-bandwidth still apply on top)",
        ),
    ] = DataPlane.shared_memory,
    per_worker_batch: Annotated[
        int | None,
        typer.Option("--per-worker-batch", min=1, help="samples per worker (default: batch_size / num_csx)"),
    ] = None,
    global_batch: Annotated[
        bool,
        typer.Option(
            "--global-batch", help="hold batch_size as the global batch and split it (strong scaling)"
        ),
    ] = False,
    worker_flops: Annotated[float | None, typer.Option("--worker-flops", help="FLOP/s of one worker")] = None,
    link_bandwidth: Annotated[float | None, typer.Option("--link-bandwidth", help="bytes/s per hop")] = None,
    link_latency: Annotated[float | None, typer.Option("--link-latency", help="seconds per hop")] = None,
    relay: Annotated[str | None, typer.Option(help="store_and_forward or cut_through")] = None,
    fanout: Annotated[int | None, typer.Option(help="children per SwarmX node")] = None,
    swarmx_bandwidth: Annotated[
        float | None, typer.Option("--swarmx-bandwidth", help="bytes/s a SwarmX node moves in all")
    ] = None,
    memoryx_shards: Annotated[int | None, typer.Option("--memoryx-shards", help="MemoryX shards")] = None,
    update_rate: Annotated[
        float | None, typer.Option("--update-rate", help="parameters/s one MemoryX shard updates")
    ] = None,
    host_cores: Annotated[int | None, typer.Option("--host-cores", help="cores per worker host")] = None,
    workers_per_host: Annotated[
        int | None, typer.Option("--workers-per-host", help="0: every worker and role on one host")
    ] = None,
    plot_to: Annotated[Path | None, typer.Option("--plot", help="also draw the table into this PNG")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of the table")] = False,
) -> None:
    """Predict step time, tokens/s and scaling efficiency at each N for a cluster of stated or measured
    costs (the cost model of weight streaming: compute, broadcast, reduce, shared cores, update, barrier)."""
    values: dict[str, Any] = {
        "worker_flops": worker_flops,
        "link_bandwidth": link_bandwidth,
        "link_latency_s": link_latency,
        "relay": relay,
        "swarmx_fanout": fanout,
        "swarmx_bandwidth": swarmx_bandwidth,
        "memoryx_shards": memoryx_shards,
        "memoryx_update_rate": update_rate,
        "host_cores": host_cores,
        "workers_per_host": workers_per_host,
    }
    try:
        ns = parse_ns(num_csx)
        base = _base_cluster(cluster, calibration)
        if data_plane == DataPlane.network:
            base = _over_network(base, cluster, calibration)
        changes = {k: v for k, v in values.items() if v is not None}
        try:
            the_cluster = dataclasses.replace(base, **changes)
        except ClusterError as e:  # name the option that set the bad figure
            field = str(e).split(":", 1)[0]
            raise ClusterError(f"{OPTION_OF[field]} {e}" if field in OPTION_OF else str(e)) from e
    except (ValueError, ClusterError) as e:
        raise _fail(str(e)) from None
    if per_worker_batch is not None and global_batch:
        raise _fail("--per-worker-batch and --global-batch both set the batch: use one")
    try:  # an HDF5 input's left-out sequence length is read from its files, as `run` does
        p = with_sequence_lengths(load_params(params))
    except ParamsError as e:
        raise _fail(str(e)) from None
    workload = build_workload(
        p, ns, the_cluster.swarmx_fanout, the_cluster.memoryx_shards, per_worker_batch, global_batch
    )
    preds = predict(the_cluster, workload, ns)
    if plot_to is not None:
        try:
            plot(plot_to, f"{workload.model} on {the_cluster.name}", preds)
        except ImportError:
            raise _fail(f"--plot needs matplotlib, an optional extra: {PLOT_HINT}") from None
    out = Console(width=None if sys.stdout.isatty() else 160)  # 13 columns: never squeeze them into 80
    if as_json:
        print(json.dumps(document(the_cluster, workload, ns, preds)))
        return
    out.print(table(the_cluster, workload, ns, preds))
    out.print(breaks_line(preds), highlight=False)
    for note in the_cluster.notes:
        out.print(f"  {note}", highlight=False)
    if plot_to is not None:
        out.print(f"plot: {plot_to}")
