"""Lint the Helm chart with the real Helm engine (helm-sdkpy, Python >= 3.12), optionally with other values,
and optionally install it into an API server (the tests' fake one) so its rendered objects can be read.

    python3.12 tests/helm_lint.py helm/weightstream ['{"slots": 8}' [KUBECONFIG]]

Helm's lint reads the chart's own values.yaml, so other values are merged into a copy of the chart. Prints
{"errors": N, "messages": [[severity, path], ...]} (severity 3 is an error) and exits 0; with KUBECONFIG,
also installs the chart as release "ws" into that cluster's namespace "default" and adds "installed":
the release's status. An install needs HELM_DRIVER=memory in the environment: Helm then keeps its
release record in memory instead of in a Secret, which its client would send as protobuf.
"""

import asyncio
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import helm_sdkpy
import yaml


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def main() -> None:
    chart = Path(sys.argv[1])
    overrides = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    kubeconfig = sys.argv[3] if len(sys.argv) > 3 else None
    if kubeconfig and os.environ.get("HELM_DRIVER") != "memory":
        sys.exit("an install needs HELM_DRIVER=memory in the environment")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / chart.name
        shutil.copytree(chart, copy)
        values = yaml.safe_load((copy / "values.yaml").read_text())
        (copy / "values.yaml").write_text(yaml.safe_dump(merge(values, overrides)))
        result = asyncio.run(helm_sdkpy.Lint(helm_sdkpy.Configuration()).run(str(copy)))
        messages = [[m["Severity"], m["Path"]] for m in result.get("Messages") or []]
        report = {"errors": sum(1 for s, _ in messages if s >= 3), "messages": messages}
        if kubeconfig:
            config = helm_sdkpy.Configuration(namespace="default", kubeconfig=kubeconfig)
            release = asyncio.run(helm_sdkpy.Install(config).run("ws", str(copy), wait=False, timeout=60))
            report["installed"] = release["info"]["status"]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
