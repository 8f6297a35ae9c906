"""The ``weightstream`` command."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from weightstream import __version__, slurm_options
from weightstream import serve_options as limit
from weightstream.config_cli import KeysOption, KeyView, config_app, print_key_report
from weightstream.data import DataError
from weightstream.data.cli import data_preprocess, tokenizer_train
from weightstream.params import Params, ParamsError, model_def, read_params
from weightstream.params.sparsity import filter_selection
from weightstream.role_cli import add_role_commands
from weightstream.serve_cli import no_data_claim, serve
from weightstream.simulate.cli import simulate
from weightstream.training.plot import plot

if TYPE_CHECKING:
    from weightstream.jobs.admission import Admission

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


def _refused(e: ParamsError) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def _admit(path: Path, **overrides: Any) -> Admission:
    """The params file admitted as ``run`` admits it before it starts any role (jobs/admission.py: the
    one pipeline of validate, run and the service): every key, the data, the model's size on this
    machine, the checkpoint it starts from. Exit 2 listing every problem."""
    from weightstream.jobs.admission import Admission, admit

    try:
        return admit(Admission.local(path, {k: v for k, v in overrides.items() if v is not None}))
    except ParamsError as e:
        raise _refused(e) from None


def _load(path: Path, **overrides: Any) -> Params:
    """The params file (either layout) validated, ``max_sequence_length`` of HDF5 inputs read from their
    files where left out. Exit 2 listing every problem."""
    from weightstream.data.check import resolve_sequence_lengths

    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return read_params(path, overrides=given, resolve=resolve_sequence_lengths).params
    except ParamsError as e:
        raise _refused(e) from None


def _nothing_to_do(p: Params, step: int) -> str:
    rc = p.runconfig
    return (
        f"nothing to do: {rc.model_dir} already holds the checkpoint of step {step} (max_steps "
        f"{rc.max_steps}). To train further, raise max_steps (e.g. --max_steps {step + rc.max_steps}); "
        "to start over, use another model_dir"
    )


@app.callback(invoke_without_command=True)
def _main(
    version: Annotated[bool, typer.Option("--version", help="print the version and exit")] = False,
) -> None:
    if version:
        out.print(f"weightstream {__version__}")
        raise typer.Exit()


@app.command()
def validate(
    params: ParamsArg,
    num_csx: NumCsx = None,
    checkpoint_path: CheckpointPath = None,
    keys: KeysOption = KeyView.notable,
) -> None:
    """Check a params file as `run` does before it starts anything (its data, its size, the checkpoint
    it starts from) without running anything; exit 2 listing every problem."""
    admitted = _admit(
        params, num_csx=num_csx, checkpoint_path=str(checkpoint_path) if checkpoint_path else None
    )
    p, model = admitted.params, model_def(admitted.params)
    print_key_report(out, admitted.loaded.report, keys)
    for note in admitted.start.notes:  # on the Hugging Face checkpoint it starts from
        out.print(note, highlight=False)
    for glob, tensors in filter_selection(p, model):  # which weights each sparsity filter made sparse
        kinds = sorted({re.sub(r"\.\d+\.", ".*.", n) for n in tensors})
        line = f"sparsity.param_filter {glob!r}: {len(tensors)} tensors ({', '.join(kinds)})"
        out.print(escape(line), highlight=False)
    out.print(
        f"[green]ok[/green] {params}: {p.model.name}, {model.num_params:,} parameters in "
        f"{len(model.units)} streamable units, num_csx={p.runconfig.num_csx}, "
        f"max_steps={p.runconfig.max_steps}"
    )
    done = admitted.start.finished_step
    if done is not None:
        out.print(f"note: run would have {escape(_nothing_to_do(p, done))}", highlight=False, soft_wrap=True)


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
    keys: KeysOption = KeyView.notable,
    backend: Annotated[
        str, typer.Option(help="local (processes here) or slurm (steps of a Slurm job, one node per worker)")
    ] = "local",
    partition: slurm_options.Partition = None,
    worker_features: slurm_options.WorkerFeatures = None,
    server_features: slurm_options.ServerFeatures = None,
) -> None:
    """Train on the appliance: every role a local process talking gRPC over loopback, or (--backend slurm)
    a step of a Slurm job on the node its placement names. Everything `validate` checks is checked first,
    before any role starts."""
    from weightstream.console import run_job  # keeps `--help` fast

    if backend not in ("local", "slurm"):
        err.print(f"[red]error:[/red] --backend must be local or slurm, not {backend!r}")
        raise typer.Exit(2)
    admitted = _admit(
        params,
        num_csx=num_csx,
        max_steps=max_steps,
        model_dir=str(model_dir) if model_dir else None,
        checkpoint_path=str(checkpoint_path.resolve()) if checkpoint_path else None,
    )
    print_key_report(out, admitted.loaded.report, keys)
    done = admitted.start.finished_step
    if done is not None:  # said at once: no role starts, no checkpoint loads
        out.print(escape(_nothing_to_do(admitted.params, done)), highlight=False, soft_wrap=True)
        raise typer.Exit(0)
    make_backend = None
    if backend == "slurm":
        make_backend = slurm_options.backend_factory(partition, worker_features, server_features)
    raise typer.Exit(run_job(admitted.params, out, err, make_backend))


app.command("fit", help="The same as `run`, for hands used to `cszoo fit`.")(run)


@app.command("plan")
def plan_command(
    params: ParamsArg,
    num_csx: NumCsx = None,
    backend: Annotated[str, typer.Option(help="local or kubernetes")] = "local",
    output: Annotated[str, typer.Option("--output", "-o", help="yaml or json")] = "yaml",
    namespace: Annotated[str, typer.Option(help="kubernetes: namespace")] = "default",
    image: Annotated[str, typer.Option(help="kubernetes: the weightstream image")] = "weightstream:dev",
    job_id: Annotated[str, typer.Option("--job-id", help="kubernetes: the job id used in names")] = "preview",
    data_claim: limit.DataClaim = None,
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
    if backend == "kubernetes" and not data_claim:
        no_data_claim()
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


app.command()(serve)  # the service: weightstream/serve_cli.py
app.add_typer(config_app, name="config")  # params files: weightstream/config_cli.py
app.command()(simulate)  # the scaling model: weightstream/simulate/
app.command()(plot)  # loss curves of runs from their metrics.jsonl: weightstream/training/plot.py
app.command("tokenizer-train")(tokenizer_train)  # the data pipeline: weightstream/data/
app.command("data-preprocess")(data_preprocess)
add_role_commands(app)  # health and the four roles: weightstream/role_cli.py


if __name__ == "__main__":  # pragma: no cover
    app()
