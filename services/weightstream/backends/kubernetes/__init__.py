"""The Kubernetes backend: a job's roles as pods.

``manifests`` turns a job into plain Kubernetes objects with pure functions (no cluster, no client: it
works without the ``kubernetes`` extra, for ``weightstream plan``). ``backend`` creates and watches them
through the official client, installed with ``pip install "weightstream[kubernetes]"``; it is the only
module of weightstream that imports ``kubernetes`` (an import-linter contract keeps it so), and nothing
imports it until a Kubernetes backend is asked for.
"""

from __future__ import annotations

import importlib.util

__all__ = ["INSTALL_HINT", "client_available"]

INSTALL_HINT = 'pip install "weightstream[kubernetes]"'


def client_available() -> bool:
    """Whether the ``kubernetes`` client package is installed here (looked up, not imported)."""
    try:
        return importlib.util.find_spec("kubernetes") is not None
    except (ImportError, ValueError):
        return False
