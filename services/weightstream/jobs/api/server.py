"""Running the REST API in the foreground until SIGTERM or Ctrl-C, with the service stopping its jobs at once.

uvicorn answers a signal by closing its listener, draining open connections, then raising the signal
again. Two things go wrong with that alone: the running jobs would keep training through the drain, and
SIGTERM raised again with its default action kills the process before the caller's ``finally`` runs (so
nothing would be requeued or closed). Here the drain is bounded, jobs start winding down at the signal,
and the SIGTERM raised again becomes an ordinary exit.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import uvicorn

__all__ = ["DRAIN_S", "run_until_signalled"]

DRAIN_S = 5  # an event stream followed until its job ends would otherwise hold the shutdown up forever


def run_until_signalled(
    app: Any,
    host: str,
    port: int,
    on_signal: Callable[[str], None],
    on_ready: Callable[[int], None] | None = None,
) -> None:
    """Serve ``app`` until SIGTERM or SIGINT. ``on_ready(port)`` runs once it listens (``port``: the one
    bound, which ``port=0`` leaves to the system); ``on_signal(name)`` ("SIGTERM", "SIGINT") runs at the
    first signal, in a thread of its own, while connections drain. Returns normally after SIGTERM; raises
    KeyboardInterrupt after Ctrl-C."""
    signalled = threading.Event()

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started and on_ready is not None:
                on_ready(self.servers[0].sockets[0].getsockname()[1] if self.servers else port)

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not signalled.is_set():  # a second Ctrl-C only hurries uvicorn along
                signalled.set()
                name = signal.Signals(sig).name
                threading.Thread(target=on_signal, args=(name,), name="on-signal", daemon=True).start()
            super().handle_exit(sig, frame)

    terminated = threading.Event()

    def exit_quietly(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        terminated.set()
        sys.exit(0)

    previous = signal.signal(signal.SIGTERM, exit_quietly)
    try:
        config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=DRAIN_S
        )
        Server(config).run()
    except SystemExit:
        if not terminated.is_set():  # uvicorn's own exit (a port in use): not ours to swallow
            raise
    finally:
        if signal.getsignal(signal.SIGTERM) is exit_quietly:
            signal.signal(signal.SIGTERM, previous)
