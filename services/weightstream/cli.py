"""The ``weightstream`` command."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from weightstream import __version__
from weightstream import serve_options as limit
from weightstream.config_cli import config_app, print_key_report
from weightstream.data import DataError
from weightstream.data.cli import data_preprocess, tokenizer_train
from weightstream.params import Loaded, Params, ParamsError, model_def, read_params
from weightstream.params.layout import relocate
from weightstream.params.sparsity import filter_selection
from weightstream.role_cli import add_role_commands
from weightstream.simulate.cli import simulate
from weightstream.training.plot import plot

app = typer.Typer(
    help="weightstream: a weight-streaming training appliance (MemoryX, SwarmX, CS-2 workers in numpy).",
    no_args_is_help=True,
    add_completion=False,
)
err = Console(stderr=True)
out = Console()

ParamsArg = Annotated[Path, typer.Argument(help="params YAML (ModelZoo layout)", show_default=False)]
NumCsx = Annotated[int | None, typer.Option("--num_csx", help="CS-2 workers (overrides runconfig.num_csx)")]
MaxSteps = Annotated[int | None, typer.Option("--max_steps", help="overrides runconfig.max_steps")]
CheckpointPath = Annotated[
    Path | None,
    typer.Option(
        "--checkpoint_path",
        help="a Hugging Face save_pretrained directory to start from (overrides runconfig.checkpoint_path)",
    ),
]


def _read(path: Path, **overrides: Any) -> Loaded:
    """The params file (either layout) validated, ``max_sequence_length`` of HDF5 inputs read from their
    files where left out; exit 2 listing every problem."""
    from weightstream.data.sequence_length import with_sequence_lengths

    try:
        loaded = read_params(path, overrides={k: v for k, v in overrides.items() if v is not None})
        try:
            return Loaded(with_sequence_lengths(loaded.params), loaded.report, loaded.origin)
        except ParamsError as e:  # named as the user wrote them
            raise ParamsError(relocate(e.problems, loaded.origin), str(path)) from None
    except ParamsError as e:
        err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _load(path: Path, **overrides: Any) -> Params:
    return _read(path, **overrides).params


@app.callback(invoke_without_command=True)
def _main(
    version: Annotated[bool, typer.Option("--version", help="print the version and exit")] = False,
) -> None:
    if version:
        out.print(f"weightstream {__version__}")
        raise typer.Exit()


@app.command()
def validate(params: ParamsArg, num_csx: NumCsx = None, checkpoint_path: CheckpointPath = None) -> None:
    """Check a params file (and the checkpoint it starts from, if any) without running anything; exit 2
    listing every problem."""
    loaded = _read(params, num_csx=num_csx, checkpoint_path=str(checkpoint_path) if checkpoint_path else None)
    p, model = loaded.params, model_def(loaded.params)
    print_key_report(out, loaded.report)
    if p.runconfig.checkpoint_path is not None:
        from weightstream.hf_checkpoint import StartCheckpointError
        from weightstream.training.hf_start import check_start_checkpoint

        try:
            for note in check_start_checkpoint(p, model, p.runconfig.checkpoint_path):
                out.print(note, highlight=False)
        except StartCheckpointError as e:
            err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
    for glob, tensors in filter_selection(p, model):  # which weights each sparsity filter made sparse
        kinds = sorted({re.sub(r"\.\d+\.", ".*.", n) for n in tensors})
        line = f"sparsity.param_filter {glob!r}: {len(tensors)} tensors ({', '.join(kinds)})"
        out.print(escape(line), highlight=False)
    out.print(
        f"[green]ok[/green] {params}: {p.model.name}, {model.num_params:,} parameters in "
        f"{len(model.units)} streamable units, num_csx={p.runconfig.num_csx}, "
        f"max_steps={p.runconfig.max_steps}"
    )


@app.command()
def example(
    name: Annotated[
        str, typer.Argument(help="gpt2_synthetic, gpt2_sparse, llama_tiny or fc_mlp_digits")
    ] = "gpt2_synthetic",
) -> None:
    """Print a shipped example params file (redirect it to a file to start from it)."""
    files = resources.files("weightstream") / "examples"
    names = sorted(f.name.removesuffix(".yaml") for f in files.iterdir() if f.name.endswith(".yaml"))
    if name not in names:
        err.print(f"[red]error:[/red] no example {name!r}; available: {', '.join(names)}")
        raise typer.Exit(2)
    print((files / f"{name}.yaml").read_text(encoding="utf-8"), end="")


@app.command("train-reference")
def train_reference(
    params: ParamsArg,
    num_csx: NumCsx = None,
    max_steps: MaxSteps = None,
    metrics: Annotated[
        Path | None, typer.Option(help="also write one JSON line per logged step here")
    ] = None,
) -> None:
    """Train in this one process with every weight resident (the numpy reference the appliance must match)."""
    from weightstream.console import train_reference as run_reference  # keeps `--help` fast
    from weightstream.training.errors import TrainingDiverged

    p = _load(params, num_csx=num_csx, max_steps=max_steps)
    try:
        run_reference(p, out, metrics)
    except DataError as e:
        err.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    except TrainingDiverged as e:
        err.print(f"[red]error:[/red] {e}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None


# ---------------------------------------------------------------------------------------------------------
# The appliance
# ---------------------------------------------------------------------------------------------------------
ModelDir = Annotated[Path | None, typer.Option("--model_dir", help="overrides runconfig.model_dir")]


@app.command()
def run(
    params: ParamsArg,
    num_csx: NumCsx = None,
    max_steps: MaxSteps = None,
    model_dir: ModelDir = None,
    checkpoint_path: CheckpointPath = None,
    backend: Annotated[
        str, typer.Option(help="local (processes here) or slurm (steps of a Slurm job, one node per worker)")
    ] = "local",
    partition: Annotated[
        str | None, typer.Option(help="with --backend slurm: the partition of every role (default: Slurm's)")
    ] = None,
    worker_features: Annotated[
        str | None,
        typer.Option(
            "--worker_features",
            help="with --backend slurm: features (comma-separated) of nodes for workers and their activation",
        ),
    ] = None,
    server_features: Annotated[
        str | None,
        typer.Option(
            "--server_features",
            help="with --backend slurm: features (comma-separated) of nodes for MemoryX and SwarmX",
        ),
    ] = None,
) -> None:
    """Train on the appliance: every role a local process talking gRPC over loopback, or (--backend slurm)
    a step of a Slurm job on the node its placement names."""
    from weightstream.console import run_job  # keeps `--help` fast

    if backend not in ("local", "slurm"):
        err.print(f"[red]error:[/red] --backend must be local or slurm, not {backend!r}")
        raise typer.Exit(2)
    loaded = _read(
        params,
        num_csx=num_csx,
        max_steps=max_steps,
        model_dir=str(model_dir) if model_dir else None,
        checkpoint_path=str(checkpoint_path.resolve()) if checkpoint_path else None,
    )
    print_key_report(out, loaded.report)
    make_backend = None
    if backend == "slurm":
        from weightstream.backends.slurm.backend import SlurmBackend
        from weightstream.backends.slurm.placement import NodeRule, PlacementRules

        def features(text: str | None) -> tuple[str, ...]:
            return tuple(f.strip() for f in (text or "").split(",") if f.strip())

        rules = PlacementRules(
            workers=NodeRule(partition, features(worker_features)),
            servers=NodeRule(partition, features(server_features)),
        )

        def make_backend(run_dir: Path) -> SlurmBackend:
            return SlurmBackend(run_dir, "weightstream", rules)

    raise typer.Exit(run_job(loaded.params, out, err, make_backend))


app.command("fit", help="The same as `run`, for hands used to `cszoo fit`.")(run)


@app.command()
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
    backend: Annotated[str, typer.Option(help="local (processes here) or kubernetes (pods)")] = "local",
    namespace: Annotated[str, typer.Option(help="kubernetes: where job pods go")] = "default",
    image: Annotated[
        str, typer.Option(help="kubernetes: the weightstream image for job pods")
    ] = "weightstream:dev",
    data_claim: Annotated[
        str | None,
        typer.Option(
            "--data-claim", help="kubernetes: PVC mounted at /data in job pods (use --data-dir /data)"
        ),
    ] = None,
    worker_cpu: Annotated[str, typer.Option("--worker-cpu", help="kubernetes: CPU of each worker pod")] = "2",
    overhead_mib: Annotated[
        int, typer.Option("--overhead-mib", help="kubernetes: memory added per pod")
    ] = 512,
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
    """Run the coordinator as a service: the REST API over a persistent job queue (local processes).
    SIGTERM stops it: running jobs go back to the queue and resume from their last checkpoint after a
    restart."""
    import logging
    import os

    from weightstream.backends.kubernetes import INSTALL_HINT, client_available
    from weightstream.backends.kubernetes.manifests import ClusterConfig
    from weightstream.jobs.api import create_app
    from weightstream.jobs.api.server import run_until_signalled
    from weightstream.jobs.data_roots import resolve_data_roots
    from weightstream.jobs.grpc_api import serve_grpc
    from weightstream.jobs.service import JobService, ServiceConfig

    if not token:
        err.print("[red]error:[/red] set WEIGHTSTREAM_TOKEN (or --token): every /v1 route needs it")
        raise typer.Exit(2)
    if backend not in ("local", "kubernetes"):
        err.print(f"[red]error:[/red] --backend must be local or kubernetes, not {backend!r}")
        raise typer.Exit(2)
    if backend == "kubernetes" and not client_available():
        err.print(
            "[red]error:[/red] --backend kubernetes needs the Kubernetes client, which is an optional "
            f"extra: run  {escape(INSTALL_HINT)}",
            soft_wrap=True,
            highlight=False,
        )
        raise typer.Exit(2)
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
        config = ServiceConfig(data_dir.resolve(), slots, backend, cluster, roots, limits, user_name)
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
    out.print(
        f"weightstream service: REST http://{host}:{port}, gRPC {host}:{bound}, {slots} CS-2 slots, "
        f"data in {data_dir}"
    )
    try:  # SIGTERM or Ctrl-C: running jobs are stopped and requeued at once, while REST connections drain
        run_until_signalled(create_app(service, token), host, port, on_signal=service.stop)
    finally:
        grpc_server.stop(grace=2)
        service.shutdown()


@app.command("plan")
def plan_command(
    params: ParamsArg,
    num_csx: NumCsx = None,
    backend: Annotated[str, typer.Option(help="local or kubernetes")] = "local",
    output: Annotated[str, typer.Option("--output", "-o", help="yaml or json")] = "yaml",
    namespace: Annotated[str, typer.Option(help="kubernetes: namespace")] = "default",
    image: Annotated[str, typer.Option(help="kubernetes: the weightstream image")] = "weightstream:dev",
    job_id: Annotated[str, typer.Option("--job-id", help="kubernetes: the job id used in names")] = "preview",
    data_claim: Annotated[
        str | None,
        typer.Option(
            "--data-claim", help="kubernetes: the service's PVC, as `serve --data-claim` (at /data)"
        ),
    ] = None,
    data_dir: Annotated[
        Path,
        typer.Option(
            "--data-dir",
            help="kubernetes: the service's --data-dir; a job's directory is <data-dir>/jobs/<id>",
        ),
    ] = Path("/data"),
    data_root: Annotated[
        list[Path] | None,
        typer.Option(
            "--data-root",
            help="kubernetes: the service's --data-root (repeat for several), mounted read-only in "
            "activation pods; default: <data-dir>/datasets",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Print what a job would start: the plan, or with --backend kubernetes every manifest, as `serve`
    with the same options would create them (the role credential's Secret shows a placeholder)."""
    import json as json_lib

    import yaml

    from weightstream.backends.kubernetes.manifests import ClusterConfig, job_manifests, role_addresses
    from weightstream.jobs.data_roots import resolve_data_roots
    from weightstream.plan import make_plan

    if backend not in ("local", "kubernetes") or output not in ("yaml", "json"):
        err.print("[red]error:[/red] --backend must be local or kubernetes, --output yaml or json")
        raise typer.Exit(2)
    # the service puts job <id>'s model_dir at <data-dir>/jobs/<id> (jobs/service.py), whatever the file says
    job_dir = str(data_dir.resolve() / "jobs" / job_id) if backend == "kubernetes" else None
    p = _load(params, num_csx=num_csx, model_dir=job_dir)
    model = model_def(p)
    the_plan = make_plan(p, model)
    if backend == "kubernetes":
        try:
            roots = resolve_data_roots(data_root or [], data_dir.resolve())
            cluster = ClusterConfig(
                namespace=namespace, image=image, data_claim=data_claim, data_roots=tuple(map(str, roots))
            )
            docs: list[Any] = job_manifests(job_id, p, model, the_plan, cluster)
        except ValueError as e:
            err.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True, highlight=False)
            raise typer.Exit(2) from None
    else:
        units = [
            {"unit": u.name, "shard": the_plan.unit_shard[i], "bytes": model.unit_bytes(i)}
            for i, u in enumerate(model.units)
        ]
        docs = [{"roles": the_plan.counts(), "swarmx_tree": the_plan.to_dict()["swarm"], "units": units}]
    if output == "json":
        print(json_lib.dumps(docs if backend == "kubernetes" else docs[0], indent=2))
    else:
        print(yaml.safe_dump_all(docs, sort_keys=False), end="")
    if backend == "kubernetes":
        err.print(
            f"# roles will reach each other at: {role_addresses(job_id, the_plan, cluster)['memoryx'][0]} ..."
        )


app.add_typer(config_app, name="config")  # params files: weightstream/config_cli.py
app.command()(simulate)  # the scaling model: weightstream/simulate/
app.command()(plot)  # loss curves of runs from their metrics.jsonl: weightstream/training/plot.py
app.command("tokenizer-train")(tokenizer_train)  # the data pipeline: weightstream/data/
app.command("data-preprocess")(data_preprocess)
add_role_commands(app)  # health and the four roles: weightstream/role_cli.py


if __name__ == "__main__":  # pragma: no cover
    app()
