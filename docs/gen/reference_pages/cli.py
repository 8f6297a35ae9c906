"""The CLI reference pages: every command of a Typer app's click tree, its usage, help, arguments and
options.

Typer builds a click command tree (``typer.main.get_command(app)``); this module reads only what click
itself shows in ``--help`` (names, types, defaults, the help text), through click's public methods, so a
page says exactly what the command line accepts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from reference_pages._markdown import code, paragraphs, table, text

__all__ = ["cli_page", "commands", "help_text"]


def _context(command: Any, name: str, parent: Any = None) -> Any:
    return command.context_class(command, info_name=name, parent=parent)


def commands(root: Any, name: str) -> Iterator[tuple[Any, Any]]:
    """(command, its click context) of ``root`` and every command under it, depth first, in the order
    ``--help`` lists them; hidden commands are left out, as ``--help`` leaves them out."""

    def walk(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
        yield command, ctx
        if hasattr(command, "list_commands"):  # a group
            for sub_name in command.list_commands(ctx):
                sub = command.get_command(ctx, sub_name)
                if sub is not None and not sub.hidden:
                    yield from walk(sub, _context(sub, sub_name, ctx))

    yield from walk(root, _context(root, name))


def help_text(command: Any) -> str:
    """The command's help as ``--help`` shows it: up to click's ``\\f`` (the rest is for the code)."""
    return (command.help or "").split("\f")[0].strip()


def _first_line(command: Any) -> str:
    """The one-line summary a group's ``--help`` shows for a subcommand."""
    return command.short_help or help_text(command).split("\n\n")[0]


def _names(param: Any) -> str:
    if param.param_type_name == "argument":
        return code(param.name)  # as the usage line names it
    return ", ".join(code(o) for o in [*param.opts, *param.secondary_opts])


def _default(param: Any, ctx: Any) -> str:
    if param.required:
        return "required"
    if getattr(param, "is_flag", False) and not param.secondary_opts:
        return "off"
    value = param.get_default(ctx, call=False)
    if value is None or param.show_default is False or callable(value):
        return ""
    if isinstance(value, list | tuple):
        return ", ".join(code(v) for v in value) if value else ""
    return code(getattr(value, "value", value))  # an enum member: its value, as typed


def _type(param: Any, ctx: Any) -> str:
    if getattr(param, "is_flag", False):
        return "flag"
    shown = code((param.display_type(ctx) or "").strip("<>").removesuffix(" range"))
    if param.min is not None or param.max is not None:
        low = "" if param.min is None else f"{param.min} ≤ "
        high = "" if param.max is None else f" ≤ {param.max}"
        shown += f" ({low}x{high})"
    if param.multiple or (param.param_type_name == "argument" and param.nargs != 1):
        shown += ", repeatable"
    return shown


def _help(param: Any) -> str:
    """The option's help, and the environment variable it also reads, as ``--help`` shows it."""
    out = text(getattr(param, "help", None) or "", cell=True)
    envvars = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or [])
    if envvars and getattr(param, "show_envvar", True):
        out += f" (env: {', '.join(code(e) for e in envvars)})"
    return out.strip()


def _param_rows(command: Any, ctx: Any) -> list[list[str]]:
    return [
        [_names(p), _type(p, ctx), _default(p, ctx), _help(p)]
        for p in command.params
        if not getattr(p, "hidden", False)
    ]


def _usage(command: Any, ctx: Any) -> str:
    pieces = " ".join(command.collect_usage_pieces(ctx))
    return f"{ctx.command_path} {pieces}".strip()


def _anchor(ctx: Any) -> str:
    """The heading id the toc extension gives ``## <command path>``."""
    return "-".join(ctx.command_path.lower().split())


def cli_page(root: Any, name: str, title: str, intro: str = "") -> str:
    """The markdown page of the click command ``root`` invoked as ``name``: one section per command,
    each with its help, usage, subcommands and a table of its arguments and options."""
    out = [f"# {title}\n", text(intro) + "\n" if intro else "", "Every command also takes `--help`.\n"]
    for command, ctx in commands(root, name):
        out.append(f"## {ctx.command_path}\n")
        if help_text(command):
            out.append(paragraphs(help_text(command)) + "\n")
        out.append(f"```\n{_usage(command, ctx)}\n```\n")
        if hasattr(command, "list_commands"):
            subs = []
            for sub_name in command.list_commands(ctx):
                sub = command.get_command(ctx, sub_name)
                if sub is None or sub.hidden:
                    continue
                sub_ctx = _context(sub, sub_name, ctx)
                link = f"[{code(sub_ctx.command_path)}](#{_anchor(sub_ctx)})"
                subs.append([link, text(_first_line(sub), cell=True)])
            out.append(table(["Command", "What it does"], subs))
        rows = _param_rows(command, ctx)
        if rows:
            out.append(table(["Argument or option", "Type", "Default", "Help"], rows))
    return "\n".join(part for part in out if part)
