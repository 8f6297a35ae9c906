"""A job's progress as a person follows it: a live bar (rich), with evals and fault recovery printed above
it as lines."""

from __future__ import annotations

from typing import Any

__all__ = ["ProgressBar", "recovery_line"]


def recovery_line(e: dict[str, Any]) -> str | None:
    """A fault-recovery event as one line for a person, or None for any other event:
    ``step 21  restart 1/50: worker-1 (pid 123) was killed by SIGKILL; ...`` (``step``: the step that
    failed), ``step 21  retry: ...`` (every role alive: the step runs again once) and
    ``step 20  recovered in 0.4s (replaying 5 steps): replaced worker-1`` (``step``: the step every shard
    holds now; what was done, where the service says), ``step 21  workers 3 -> 2: no capacity to start
    worker-1 again within 30s`` (the job trains with fewer workers, or again with more, from ``step`` on)
    and ``step 30  straggler: worker-1 on h2 2.1x the other workers' median for 3 steps`` (a slow
    worker)."""
    kind = e.get("kind")
    if kind == "restart":
        budget = f"{e.get('restarts', '?')}/{e.get('max_role_restarts', '?')}"
        host = f" (host {e['host']})" if e.get("host") else ""
        return f"step {e.get('step')}  restart {budget}: {e.get('reason', e.get('role', ''))}{host}"
    if kind == "retry":
        return f"step {e.get('step')}  retry: {e.get('reason', '')}"
    if kind == "workers":
        change = f"{e.get('from_workers', '?')} -> {e.get('to_workers', '?')}"
        return f"step {e.get('step')}  workers {change}: {e.get('reason', '')}"
    if kind == "recovered":
        n = e.get("replay_steps", 0)
        took = e.get("recovery_s")
        took_s = f"{took:.1f}s" if isinstance(took, int | float) else "?"
        action = f": {e['action']}" if e.get("action") else ""
        return (
            f"step {e.get('step')}  recovered in {took_s} (replaying {n} step{'' if n == 1 else 's'}){action}"
        )
    if kind == "straggler":
        ratio = e.get("ratio")
        times = f"{ratio:.1f}x" if isinstance(ratio, int | float) else "?x"
        return (
            f"step {e.get('step')}  straggler: {e.get('worker')} on {e.get('host')} {times} the other "
            f"workers' median for {e.get('steps')} steps"
        )
    return None


class ProgressBar:
    def __init__(self, job_id: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.p = Progress(
            TextColumn(f"[bold]{job_id}"),
            TextColumn("{task.fields[status]}"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(),
            refresh_per_second=2,  # not rich's 10: the appliance may train on this machine's cores
        )
        self.task = self.p.add_task("job", total=None, status="", info="")
        self.p.start()

    def update(self, e: dict[str, Any]) -> None:
        if e.get("kind") == "status":
            self.p.update(self.task, status=e.get("status", ""))
        elif e.get("kind") == "step":
            info = f"loss {e['loss']:.4f}  {e['tokens_per_second']:,.0f} tok/s"
            self.p.update(
                self.task, total=e.get("max_steps"), completed=e["step"], status="running", info=info
            )
        elif e.get("kind") == "eval":
            self.p.console.print(f"step {e['step']}: eval_loss {e['eval_loss']:.4f}")
        elif (line := recovery_line(e)) is not None:
            # printed above the bar, plain: a reason holds paths and brackets that are no rich markup
            self.p.console.print(line, style="yellow", markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        self.p.stop()
