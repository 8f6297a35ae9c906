"""The commands that run a role process (``weightstream memoryx|swarmx|worker|activation``) and probe one
(``weightstream health``): what containers, pods and the local backend start."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["add_role_commands", "health"]

err = Console(stderr=True)
out = Console()


def health(
    address: Annotated[
        str,
        typer.Option(
            # role pods set the variable to $(POD_IP):50051: a role listens on its pod's IP only, and
            # Kubernetes does not expand $(VAR) in a probe's command
            envvar="WEIGHTSTREAM_ROLE_ADDRESS",
            help="a role's gRPC address",
        ),
    ] = "127.0.0.1:50051",
    timeout: Annotated[float, typer.Option(help="seconds")] = 3.0,
) -> None:
    """Ask a role for its health over gRPC (exit 0 if it answers): the probe of role pods and containers."""
    import grpc

    from weightstream.proto import weightstream_pb2 as pb
    from weightstream.proto import weightstream_pb2_grpc as rpc

    try:
        with grpc.insecure_channel(address) as channel:
            reply = rpc.ControlStub(channel).Health(pb.Empty(), timeout=timeout)
    except grpc.RpcError as e:
        err.print(f"unhealthy: {address}: {e.code().name}")
        raise typer.Exit(1) from None
    if not reply.role:  # asked without the job's credential: the role says only that it serves
        out.print(f"serving: {address}")
        return
    out.print(f"{reply.role} pid {reply.pid} {'configured' if reply.configured else 'waiting for its job'}")


def _role_command(app: typer.Typer, kind: str, what: str) -> None:
    def command(
        host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="port; 0 picks a free one")] = 50051,
        ready_file: Annotated[
            Path | None, typer.Option(help="write {address, host, pid} here once listening")
        ] = None,
        parent_pid: Annotated[
            int | None, typer.Option(help="exit when this process is no longer the parent")
        ] = None,
        until_stdin_closes: Annotated[
            bool,
            typer.Option(
                "--until-stdin-closes",
                help="exit when standard input closes (its starter holds it open while it lives)",
            ),
        ] = False,
        bulk_port: Annotated[
            int,
            typer.Option(
                help="port of its bulk transfers on the same interface (the network plane's tensor bytes);"
                " 0 picks a free one, -1 sends every byte over gRPC instead",
                min=-1,
                max=65535,
            ),
        ] = 0,
        token_file: Annotated[
            str,
            typer.Option(
                "--token-file",
                help="file holding the job's role credential (- reads it from standard input)",
                show_default=False,
            ),
        ] = "",
    ) -> None:
        import logging

        from weightstream.role import serve_role
        from weightstream.role_kinds import role_kind
        from weightstream.transport.auth import read_token

        if not token_file:
            err.print(
                "[red]error:[/red] --token-file is required: a role serves only callers with the job's token"
            )
            raise typer.Exit(2)
        try:
            token = read_token(token_file)
        except (OSError, ValueError) as e:
            err.print(f"[red]error:[/red] --token-file: {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {kind} %(levelname)s %(message)s")
        role = role_kind(kind)
        serve_role(
            kind,
            role.build,
            role.add_servicer,
            host,
            port,
            ready_file,
            parent_pid,
            token=token,
            lifeline=until_stdin_closes,
            reconfigure=role.reconfigure,
            bulk_port=None if bulk_port < 0 else bulk_port,
            warm=role.warm,
        )

    article = "an" if what[0].lower() in "aeiou" else "a"
    command.__doc__ = f"Run {article} {what} (configured by the coordinator over gRPC)."
    app.command(kind, rich_help_panel="Roles (for containers and the coordinator)")(command)


def add_role_commands(app: typer.Typer) -> None:
    """``health`` (the probe of role pods and containers) and one command per role kind."""
    app.command()(health)
    from weightstream.role_kinds import KINDS  # the list alone: no role's code is imported here

    for kind, listed in KINDS.items():
        _role_command(app, kind, listed.what)
