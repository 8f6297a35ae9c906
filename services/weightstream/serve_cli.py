"""``weightstream serve``: the coordinator as a long-lived service (REST, gRPC, the dashboard) over a
persistent job queue, with local processes, Kubernetes pods or Slurm jobs for the jobs' roles."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from weightstream import serve_options as limit
from weightstream import slurm_options as slurm

__all__ = ["no_data_claim", "serve"]

err = Console(stderr=True)


def no_data_claim() -> None:
    """Exit 2: a job's pods see the service's files only through its data volume, and every job needs
    them (MemoryX pods write each checkpoint, the final one at least, into the job's directory there;
    activation pods read the data roots there), so Kubernetes manifests without one could never run."""
    err.print(
        "[red]error:[/red] --backend kubernetes needs --data-claim NAME: the PersistentVolumeClaim holding "
        "the service's --data-dir, mounted at /data in job pods (MemoryX pods write the job's checkpoints "
        "there, activation pods read the data roots from it)",
        soft_wrap=True,
        highlight=False,
    )
    raise typer.Exit(2)


def serve(
    host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="REST port")] = 8080,
    grpc_port: Annotated[
        int, typer.Option("--grpc-port", help="the coordinator's gRPC port; 0 picks one")
    ] = 50050,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="job store and every job's model_dir")] = Path(
        "./weightstream-data"
    ),
    slots: Annotated[int, typer.Option(min=1, help="CS-2 workers the service may run at once")] = 4,
    backend: Annotated[
        str, typer.Option(help="local (processes here), kubernetes (pods) or slurm (a Slurm job per job)")
    ] = "local",
    namespace: Annotated[str, typer.Option(help="kubernetes: where job pods go")] = "default",
    image: Annotated[
        str, typer.Option(help="kubernetes: the weightstream image for job pods")
    ] = "weightstream:dev",
    data_claim: limit.DataClaim = None,
    worker_cpu: Annotated[str, typer.Option("--worker-cpu", help="kubernetes: CPU of each worker pod")] = "2",
    overhead_mib: Annotated[
        int, typer.Option("--overhead-mib", help="kubernetes: memory added per pod")
    ] = 512,
    partition: slurm.Partition = None,
    worker_features: slurm.WorkerFeatures = None,
    server_features: slurm.ServerFeatures = None,
    token: Annotated[
        str | None, typer.Option(envvar="WEIGHTSTREAM_TOKEN", help="API bearer token", show_default=False)
    ] = None,
    data_root: limit.DataRoots = None,
    max_params: limit.MaxParams = limit.DEFAULTS.max_params,
    max_layers: limit.MaxLayers = limit.DEFAULTS.max_layers,
    max_tokens_per_step: limit.MaxTokensPerStep = limit.DEFAULTS.max_tokens_per_step,
    max_steps_limit: limit.MaxStepsLimit = limit.DEFAULTS.max_steps,
    max_workers: limit.MaxWorkers = limit.DEFAULTS.max_workers,
    max_queued_jobs: limit.MaxQueuedJobs = limit.DEFAULTS.max_queued_jobs,
    max_job_seconds: limit.MaxJobSeconds = limit.DEFAULTS.max_job_seconds or 0,
    keep_checkpoint_max: limit.KeepCheckpointMax = limit.DEFAULTS.keep_checkpoint_max or 0,
    user_name: limit.UserName = "",
) -> None:
    """Run the coordinator as a service: the REST API over a persistent job queue (local processes,
    Kubernetes pods, or one Slurm job per job: its --data-dir then on a filesystem every node sees).
    Once it listens it prints the dashboard's URL, the API's base, the job store and the data roots.
    SIGTERM or Ctrl-C stops it: running jobs go back to the queue and resume from their last checkpoint
    after a restart."""
    import logging
    import os

    from weightstream.backends.kubernetes import INSTALL_HINT, client_available
    from weightstream.backends.kubernetes.manifests import ClusterConfig
    from weightstream.jobs.api import create_app
    from weightstream.jobs.api.server import run_until_signalled
    from weightstream.jobs.data_roots import resolve_data_roots
    from weightstream.jobs.grpc_api import serve_grpc
    from weightstream.jobs.service import JobService, ServiceConfig
    from weightstream.serve_banner import STOPPED, ServeBanner, stopping_lines

    if not token:
        err.print("[red]error:[/red] set WEIGHTSTREAM_TOKEN (or --token): every /v1 route needs it")
        raise typer.Exit(2)
    if backend not in ("local", "kubernetes", "slurm"):
        err.print(f"[red]error:[/red] --backend must be local, kubernetes or slurm, not {backend!r}")
        raise typer.Exit(2)
    if backend == "kubernetes" and not client_available():
        err.print(
            "[red]error:[/red] --backend kubernetes needs the Kubernetes client, which is an optional "
            f"extra: run  {escape(INSTALL_HINT)}",
            soft_wrap=True,
            highlight=False,
        )
        raise typer.Exit(2)
    if backend == "kubernetes" and not data_claim:
        no_data_claim()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # what the service and its role processes create (job store, logs, metrics, checkpoints) is no other
    # user's business: group-readable at most
    os.umask(0o027)
    limits = limit.service_limits(
        max_params, max_layers, max_tokens_per_step, max_steps_limit, max_workers, max_queued_jobs,
        max_job_seconds, keep_checkpoint_max,
    )  # fmt: skip
    try:
        roots = resolve_data_roots(data_root or [], data_dir.resolve())
        cluster = ClusterConfig(
            namespace=namespace,
            image=image,
            data_claim=data_claim,
            worker_cpu=worker_cpu,
            overhead_mib=overhead_mib,
            data_roots=tuple(map(str, roots)),
        )
        rules = slurm.placement_rules(partition, worker_features, server_features)
        config = ServiceConfig(data_dir.resolve(), slots, backend, cluster, rules, roots, limits, user_name)
        service = JobService(config)
    except ValueError as e:
        err.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from None
    try:  # the aio server runs on a thread and event loop of its own; stop() it below
        grpc_server, bound = serve_grpc(service, token, f"{host}:{grpc_port}")
    except OSError as e:  # the port is taken: say so, and leave no job thread behind
        service.shutdown()
        err.print(
            f"[red]error:[/red] {escape(str(e))}; choose another --grpc-port (0 picks a free one)",
            soft_wrap=True,
            highlight=False,
        )
        raise typer.Exit(2) from None
    rest = create_app(service, token)

    def ready(bound_port: int) -> None:  # plain lines, flushed: this usually goes to a log, not a terminal
        token_source = "$WEIGHTSTREAM_TOKEN" if os.environ.get("WEIGHTSTREAM_TOKEN") == token else "--token"
        banner = ServeBanner(
            host, bound_port, f"{host}:{bound}", backend, slots, config.data_dir, config.data_roots,
            token_source, rest.docs_url,
        )  # fmt: skip
        print("\n".join(banner.lines()), flush=True)

    def stopping(signal_name: str) -> None:
        running = [j.id for j in service.store.list("running")]
        print("\n".join(stopping_lines(signal_name, running, len(service.store.queue()))), flush=True)
        service.stop()

    try:  # SIGTERM or Ctrl-C: running jobs are stopped and requeued at once, while REST connections drain
        run_until_signalled(rest, host, port, on_signal=stopping, on_ready=ready)
    finally:
        grpc_server.stop(grace=2)
        service.shutdown()
        print(STOPPED, flush=True)
