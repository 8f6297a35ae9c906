"""The key report: every key a params file sets, its value, and what weightstream does with it.

``weightstream validate`` and the start of ``weightstream run`` print it, so a user arriving with a
ModelZoo file sees at once which keys train as they expect, which change nothing here (and why), and
(as errors, before this) which are refused. Keys are named as the user wrote them, in either layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from weightstream.params.layout import KeyUse, Origin, leaves

__all__ = ["key_report"]


def _note(path: str, value: Any) -> str:
    """What weightstream does with a used key, where there is more to say than "as ModelZoo does"."""
    if path == "model.fp16_type" and value == "cbfloat16":
        return "runs as bfloat16 (cbfloat16 is the CS-2's own format; weightstream has no such type)"
    if path == "model.fp16_type":
        return "bfloat16 on the wire; master weights and optimizer state stay fp32"
    if path.endswith(".data_processor") and value == "GptHDF5DataProcessor":
        return "read as GptHDF5MapDataProcessor: the same files"
    if path == "model.name" and value == "gpt3":
        return "GPT-2's architecture (learned positions, LayerNorm), as in ModelZoo"
    if path == "runconfig.checkpoint_path":
        return "weights start from this Hugging Face directory; optimizer state and step start fresh"
    if path == "optimizer.optimizer_type" and isinstance(value, str) and value.lower() == "adam":
        return "Adam: weight_decay is L2 added to the gradient (torch.optim.Adam)"
    return ""


def key_report(
    legacy: Mapping[str, Any],
    origin: Origin,
    reported: list[KeyUse],
    written: Mapping[str, Any],
    overrides: Mapping[str, Any],
    also: Mapping[str, list[str]] | None = None,
) -> list[KeyUse]:
    """One ``KeyUse`` per key: ``legacy`` is the validated file in the legacy layout with the
    not-applicable keys already taken out (they are in ``reported``), ``written`` the file as the user
    wrote it (for the order of the lines), ``overrides`` the command line's runconfig keys, ``also`` the
    keys that repeated a setting with the same value (legacy path -> the repeats), named on the line of
    the setting's first key."""
    uses = [KeyUse(origin(p), v, "used", _note(p, v)) for p, v in leaves(dict(legacy)) if p]
    for key, value in overrides.items():  # replaced where the file set them, shown once
        uses = [u for u in uses if u.path != origin(f"runconfig.{key}")]
        uses.append(
            KeyUse(origin(f"runconfig.{key}"), value, "used", f"runconfig.{key}, given apart from the file")
        )
    order = {p: i for i, (p, _) in enumerate(leaves(dict(written)))}

    def rank(u: KeyUse) -> tuple[int, str]:
        # a reported key may be a whole subtree (a callback): place it at its first leaf
        at = order.get(u.path)
        if at is None:
            at = min((i for p, i in order.items() if p.startswith(u.path)), default=len(order))
        return at, u.path

    notes = {origin(c): f"also written as {', '.join(at)}, the same value" for c, at in (also or {}).items()}

    def noted(u: KeyUse) -> KeyUse:
        more = notes.get(u.path)
        return replace(u, note=f"{u.note}; {more}" if u.note else more) if more else u

    return sorted(map(noted, [*uses, *reported]), key=rank)
