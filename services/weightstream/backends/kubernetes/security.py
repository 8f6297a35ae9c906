"""How a job's role pods are locked down, as plain manifest fragments (pure functions, no cluster).

- The job's role credential reaches each role as a file from a per-job Secret, mounted read-only: never
  a command-line argument (visible in ``ps`` and in the pod spec) nor an environment variable (inherited
  by every child, printed by ``kubectl describe``).
- Pods run as the image's non-root user with the container runtime's default seccomp profile, no
  capabilities, no privilege escalation, a read-only root filesystem (scratch space is an ``emptyDir`` at
  ``/tmp``), no service-account token (roles never talk to the Kubernetes API) and no service links (the
  namespace's services stay out of the roles' environment).

Together these meet the Kubernetes "restricted" Pod Security Standard (except a ``hostPath`` data volume,
which only single-node setups use).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "RUN_AS",
    "SCRATCH_DIR",
    "TOKEN_DIR",
    "TOKEN_FILE",
    "TOKEN_PLACEHOLDER",
    "container_security",
    "pod_security",
    "role_token_secret",
    "role_token_secret_name",
    "security_mounts",
    "security_volumes",
]

RUN_AS = 10001  # the image's user (Dockerfile: useradd --uid 10001)
TOKEN_DIR = "/var/run/weightstream/role-token"
TOKEN_FILE = f"{TOKEN_DIR}/token"
TOKEN_PLACEHOLDER = "<generated per job run>"  # what `weightstream plan` shows instead of a credential
SCRATCH_DIR = "/tmp"
# Nothing in a role writes temporary files (logs go to stdout, checkpoints to the job's directory); the
# limit only bounds what a misbehaving library could write before the kubelet evicts the pod.
_SCRATCH_LIMIT = "128Mi"
_TOKEN_VOLUME, _SCRATCH_VOLUME = "role-token", "scratch"


def role_token_secret_name(object_name: str) -> str:
    """The per-job Secret holding the role credential, named after the job's objects (``ws-<job>``)."""
    return f"{object_name}-role-token"


def role_token_secret(
    object_name: str,
    namespace: str,
    labels: dict[str, str],
    owner: dict[str, Any],
    credential: str | None,
) -> dict[str, Any]:
    """The job's role-token Secret (key ``token``). Without ``credential`` (``weightstream plan``) it
    holds a placeholder: a real token exists only once the coordinator starts the job's roles, and a new
    one for every start."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": role_token_secret_name(object_name),
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner],
        },
        "type": "Opaque",
        "immutable": True,  # a run's credential never changes; a restart makes a new Secret
        "stringData": {"token": credential if credential is not None else TOKEN_PLACEHOLDER},
    }


def pod_security() -> dict[str, Any]:
    """The pod-level securityContext. ``fsGroup`` makes the token file and the data volume's files
    readable (and the job's directory writable) by the pod's user."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security() -> dict[str, Any]:
    """The container-level securityContext of every role."""
    return {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def security_volumes(object_name: str) -> list[dict[str, Any]]:
    """The token Secret's volume (0440: owner root, group ``fsGroup``, nobody else) and the scratch
    ``emptyDir``."""
    return [
        {
            "name": _TOKEN_VOLUME,
            "secret": {
                "secretName": role_token_secret_name(object_name),
                "defaultMode": 0o440,
                "items": [{"key": "token", "path": "token"}],
            },
        },
        {"name": _SCRATCH_VOLUME, "emptyDir": {"sizeLimit": _SCRATCH_LIMIT}},
    ]


def security_mounts() -> list[dict[str, Any]]:
    return [
        {"name": _TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
        {"name": _SCRATCH_VOLUME, "mountPath": SCRATCH_DIR},
    ]
