"""The library: ``Client().submit(params, num_csx=4).wait()``, from a script or a notebook."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any
from urllib.parse import quote

import httpx
import yaml

__all__ = ["ApiError", "Client", "Job", "JobFailedError"]

TERMINAL = ("succeeded", "failed", "cancelled")


class ApiError(RuntimeError):
    """The service said no: ``status`` (HTTP), ``code`` (machine-readable), message, details."""

    def __init__(
        self, status: int, code: str, message: str, details: list[dict[str, Any]] | None = None
    ) -> None:
        self.status, self.code, self.message, self.details = status, code, message, details or []
        lines = [f"{message} [{code}, HTTP {status}]"] + [
            f"  - {d.get('path', '')}: {d.get('message', '')}" for d in self.details
        ]
        super().__init__("\n".join(lines))


class JobFailedError(RuntimeError):
    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        super().__init__(f"job {job['id']} {job['status']}: {job.get('error') or _last_reason(job)}")


def _last_reason(job: dict[str, Any]) -> str:
    return next((h["reason"] for h in reversed(job.get("history", [])) if h.get("reason")), "no reason given")


def _is_file(params: str | Path) -> bool:
    try:
        return Path(params).is_file()
    except OSError:  # e.g. YAML text with a line longer than a file name may be: then it is no path
        return False


def load_params(params: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """A params mapping, or a path to a YAML file, or YAML text. Raises ValueError naming the file (and
    the line, for a YAML syntax error) when it is not a YAML mapping."""
    if isinstance(params, Mapping):
        return dict(params)
    is_file = _is_file(params)
    source = str(params) if is_file else "the params text"
    try:
        text = Path(params).read_text(encoding="utf-8") if is_file else str(params)
        loaded = yaml.safe_load(text)
    except UnicodeDecodeError as e:
        raise ValueError(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}, line {mark.line + 1}, column {mark.column + 1}" if mark else source
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ValueError(f"{where}: not valid YAML: {problem}") from e
    if not isinstance(loaded, dict):
        got = type(loaded).__name__
        raise ValueError(f"{source}: params must be a mapping (YAML with sections), got {got}")
    return loaded


def _plain_file_name(name: object) -> str:
    """``name`` if it is a plain file name, safe to join to a directory on any OS: a non-empty string
    with no separator ('/' or '\\'), no drive, no NUL, and neither '.' nor '..'. Raises ValueError."""
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "\x00" in name
        or PurePosixPath(name).name != name
        or PureWindowsPath(name).name != name
    ):
        raise ValueError(f"{name!r} is not a plain file name")
    return name


class Client:
    """A weightstream service. ``url`` and ``token`` default to WEIGHTSTREAM_URL and WEIGHTSTREAM_TOKEN."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.url = (url or os.environ.get("WEIGHTSTREAM_URL") or "http://127.0.0.1:8080").rstrip("/")
        token = token or os.environ.get("WEIGHTSTREAM_TOKEN")
        if not token:
            raise ValueError("no API token: pass token=... or set WEIGHTSTREAM_TOKEN")
        self._http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise ApiError(0, "unreachable", f"cannot reach {self.url}: {e}") from e
        if r.status_code >= 400:
            try:
                err = r.json()["error"]
            except (ValueError, KeyError, TypeError):
                err = {"code": "http_error", "message": r.text[:500] or r.reason_phrase}
            raise ApiError(
                r.status_code, err.get("code", "error"), err.get("message", ""), err.get("details")
            )
        return r

    def submit(
        self,
        params: Mapping[str, Any] | str | Path,
        num_csx: int,
        labels: Mapping[str, str] | None = None,
        priority: int = 2,
    ) -> Job:
        body = {
            "params": load_params(params),
            "num_csx": num_csx,
            "labels": dict(labels or {}),
            "priority": priority,
        }
        return Job(self, self.request("POST", "/v1/jobs", json=body).json()["id"])

    def jobs(
        self, status: str | None = None, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        query: list[tuple[str, str]] = [("status", status)] if status else []
        query += [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        return self.request("GET", "/v1/jobs", params=query).json()["jobs"]

    def job(self, job_id: str) -> Job:
        job = Job(self, job_id)
        job.info()  # raises ApiError 404 for an unknown id
        return job


class Job:
    """A handle on one job of a service."""

    def __init__(self, client: Client, job_id: str) -> None:
        self.client, self.id = client, job_id

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def info(self) -> dict[str, Any]:
        return self.client.request("GET", f"/v1/jobs/{self.id}").json()

    def status(self) -> str:
        return self.info()["status"]

    def metrics(self) -> dict[str, list[dict[str, Any]]]:
        return self.client.request("GET", f"/v1/jobs/{self.id}/metrics").json()

    def logs(self, tail: int | None = None) -> str:
        return self.client.request(
            "GET", f"/v1/jobs/{self.id}/logs", params={"tail": tail} if tail else {}
        ).text

    def cancel(self) -> dict[str, Any]:
        return self.client.request("DELETE", f"/v1/jobs/{self.id}").json()

    def checkpoints(self) -> list[dict[str, Any]]:
        return self.client.request("GET", f"/v1/jobs/{self.id}/checkpoints").json()["checkpoints"]

    def events(self, after: int = 0, follow: bool = True) -> Iterator[dict[str, Any]]:
        """Server-sent events as dicts ``{"seq", "kind", **data}``; with ``follow`` until the job ends.
        A ``{"kind": "keepalive"}`` comes at least every few seconds while nothing happens."""
        params = {"after": after, "follow": follow}
        with self.client._http.stream("GET", f"/v1/jobs/{self.id}/events", params=params, timeout=None) as r:
            if r.status_code >= 400:
                r.read()
                raise ApiError(r.status_code, "http_error", r.text[:500])
            event: dict[str, Any] = {}
            for line in r.iter_lines():
                if line.startswith(":"):  # the server's keepalive: no event, but time to check deadlines
                    yield {"kind": "keepalive"}
                elif not line:
                    if event:
                        yield event
                    event = {}
                elif line.startswith("id: "):
                    event["seq"] = int(line[4:])
                elif line.startswith("event: "):
                    event["kind"] = line[7:]
                elif line.startswith("data: "):
                    event.update(json.loads(line[6:]))

    def wait(
        self,
        progress: bool = True,
        timeout_s: float | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Follow the job until it ends; show a progress bar (rich) unless ``progress=False``.
        Returns the final record; raises JobFailedError if it failed or was cancelled."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        bar = _ProgressBar(self.id) if progress else None
        try:
            for e in self.events():
                if on_event and e["kind"] != "keepalive":
                    on_event(e)
                if bar:
                    bar.update(e)
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {self.id} still running after {timeout_s}s")
                if e.get("kind") == "status" and e.get("status") in TERMINAL:
                    break
        finally:
            if bar:
                bar.close()
        info = self.info()
        if info["status"] != "succeeded":
            raise JobFailedError(info)
        return info

    def download(self, directory: str | Path, step: int | None = None) -> Path:
        """Download a checkpoint (the last one unless ``step``) into ``directory``; returns its path.
        Files are written to a temporary name and renamed when complete."""
        cps = self.checkpoints()
        if not cps:
            raise ApiError(404, "not_found", f"job {self.id} has no checkpoint yet")
        cp = cps[-1] if step is None else next((c for c in cps if c["step"] == step), None)
        if cp is None:
            raise ApiError(
                404,
                "not_found",
                f"job {self.id} has no checkpoint at step {step}; has {[c['step'] for c in cps]}",
            )
        step_, files = _checked_listing(self.id, cp)  # before anything is written
        out = Path(directory) / f"checkpoint_{step_}"
        out.mkdir(parents=True, exist_ok=True)
        for name, size in files:
            tmp = out / (name + ".partial")
            url = f"/v1/jobs/{quote(self.id, safe='')}/checkpoints/{step_}/files/{quote(name, safe='')}"
            with self.client._http.stream("GET", url, timeout=None) as r, open(tmp, "wb") as fh:
                if r.status_code >= 400:
                    raise ApiError(r.status_code, "http_error", f"download of {name} failed")
                for chunk in r.iter_bytes(1 << 20):
                    fh.write(chunk)
            if tmp.stat().st_size != size:
                raise ApiError(0, "incomplete", f"{name}: got {tmp.stat().st_size} of {size} bytes")
            tmp.replace(out / name)
        return out


def _checked_listing(job_id: str, cp: dict[str, Any]) -> tuple[int, list[tuple[str, int]]]:
    """A checkpoint as the server listed it, as (step, [(file name, size)]), once every part of it is
    safe to use in a local path: the client writes where the server's names say, so a name such as
    '../../.bashrc' from a broken or hostile server must stop the download, not be followed."""
    step, files = cp.get("step"), cp.get("files")
    if type(step) is not int or step < 0 or not isinstance(files, list):
        raise ApiError(0, "bad_listing", f"job {job_id}: the server listed a malformed checkpoint {cp!r}")
    checked = []
    for f in files:
        name, size = (f.get("name"), f.get("size")) if isinstance(f, dict) else (None, None)
        try:
            _plain_file_name(name)
        except ValueError as e:
            raise ApiError(
                0,
                "unsafe_name",
                f"job {job_id}, checkpoint {step}: the server listed a file {name!r}, which is not a plain "
                "file name; nothing was downloaded",
            ) from e
        if type(size) is not int or size < 0:
            bad = f"job {job_id}, checkpoint {step}: file {name!r} has size {size!r}"
            raise ApiError(0, "bad_listing", bad)
        checked.append((str(name), size))
    return step, checked


def _recovery_line(e: dict[str, Any]) -> str | None:
    """A fault-recovery event as one line for a person, or None for any other event:
    ``step 21  restart 1/50: worker-1 (pid 123) was killed by SIGKILL; ...`` (``step``: the step that
    failed), ``step 21  retry: ...`` (every role alive: the step runs again once) and
    ``step 20  recovered in 0.4s (replaying 5 steps)`` (``step``: the step every shard holds now)."""
    kind = e.get("kind")
    if kind == "restart":
        budget = f"{e.get('restarts', '?')}/{e.get('max_role_restarts', '?')}"
        return f"step {e.get('step')}  restart {budget}: {e.get('reason', e.get('role', ''))}"
    if kind == "retry":
        return f"step {e.get('step')}  retry: {e.get('reason', '')}"
    if kind == "recovered":
        n = e.get("replay_steps", 0)
        took = e.get("recovery_s")
        took_s = f"{took:.1f}s" if isinstance(took, int | float) else "?"
        return f"step {e.get('step')}  recovered in {took_s} (replaying {n} step{'' if n == 1 else 's'})"
    return None


class _ProgressBar:
    def __init__(self, job_id: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.p = Progress(
            TextColumn(f"[bold]{job_id}"),
            TextColumn("{task.fields[status]}"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(),
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
        elif (line := _recovery_line(e)) is not None:
            # printed above the bar, plain: a reason holds paths and brackets that are no rich markup
            self.p.console.print(line, style="yellow", markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        self.p.stop()
