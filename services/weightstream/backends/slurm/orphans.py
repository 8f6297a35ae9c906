"""Steps of replaced roles that Slurm still lists, cancelled again until they are gone.

A role whose node stops answering (the node died, or its link is cut) is replaced on another node; Slurm
cannot end its step meanwhile, and its srun waits for the node until slurmctld marks it down (about
twice SlurmdTimeout), so the backend kills that srun and moves on. Once the link is back, the old role
could run on beside its replacement: it does no harm (every role refuses calls of an older generation,
``transport.fencing``), but it holds the node's cores and memory. Its lifeline does not end it either:
the srun that fed its standard input died while the link was down, so no connection reset ever reaches
its node, and the step's standard input stays open.

So each such step is kept here, and a thread cancels it again every ``interval_s`` until Slurm lists it no
more. A step whose node has left the job is Slurm's to end: with ``--no-kill``, a node marked down leaves
the job while the job goes on, and when that node's slurmd registers again it ends every step of a job the
node no longer belongs to (measured: about 20 s after the link came back); a node that died runs nothing.

The Slurm calls are handed in (``steps``, ``nodes``, ``cancel``): ``commands`` stays the backend's alone,
and a test drives the sweep without a cluster.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection

from weightstream.backends.base import BackendError

__all__ = ["OrphanSteps"]

REAP_INTERVAL_S = 2.0  # a few Slurm commands a round, and only while a step is left


class OrphanSteps:
    """Steps (ids such as "12.3") of roles already replaced, each with its node, cancelled until Slurm lists
    them no more. ``steps()``: the ids of the job's steps Slurm lists; ``nodes()``: the job's nodes now;
    ``cancel(ids)``: scancel --signal=KILL."""

    def __init__(
        self,
        steps: Callable[[], Collection[str]],
        nodes: Callable[[], Collection[str]],
        cancel: Callable[[list[str]], None],
        interval_s: float = REAP_INTERVAL_S,
    ) -> None:
        self._steps, self._nodes, self._cancel, self.interval_s = steps, nodes, cancel, interval_s
        self._left: dict[str, str] = {}  # step id -> its node
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def left(self) -> dict[str, str]:
        """The steps still followed, by id, each with its node."""
        with self._lock:
            return dict(self._left)

    def add(self, step: str, node: str) -> None:
        """Follow ``step`` of ``node`` until it is gone (a thread sweeps every ``interval_s``)."""
        with self._lock:
            if self._closed.is_set():
                return
            self._left[step] = node
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="slurm-orphans", daemon=True)
                self._thread.start()

    def sweep(self) -> list[str]:
        """One round: forget the steps Slurm lists no more and those whose node has left the job; cancel the
        others again. Returns the ids cancelled."""
        with self._lock:
            left = dict(self._left)
        if not left:
            return []
        listed, in_job = set(self._steps()), set(self._nodes())
        gone = {step for step, node in left.items() if step not in listed or node not in in_job}
        again = sorted(set(left) - gone)
        if again:
            self._cancel(again)
        with self._lock:
            for step in gone:
                self._left.pop(step, None)
        return again

    def _run(self) -> None:
        while not self._closed.wait(self.interval_s):
            try:
                self.sweep()
            except BackendError:  # slurmctld busy or away a moment: the next round asks again
                continue
            with self._lock:
                if not self._left:
                    self._thread = None
                    return

    def close(self) -> None:
        """Stop following (the backend is stopping: it cancels every step of its own then)."""
        self._closed.set()
        with self._lock:
            thread, self._left = self._thread, {}
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
