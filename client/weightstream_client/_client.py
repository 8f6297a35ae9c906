"""The library: ``Client().submit(params, num_csx=4).wait()``, from a script or a notebook."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any
from urllib.parse import quote

import httpx
import yaml

from weightstream_client._config import resolve_settings
from weightstream_client._download import install_checkpoint, refuse_to_merge, staging_dir
from weightstream_client._progress import ProgressBar

__all__ = ["ApiError", "Client", "Job", "JobFailedError"]

TERMINAL = ("succeeded", "failed", "cancelled")


class ApiError(RuntimeError):
    """The service said no: ``status`` (HTTP), ``code`` (machine-readable), message, details."""

    def __init__(
        self, status: int, code: str, message: str, details: list[dict[str, Any]] | None = None
    ) -> None:
        self.status, self.code, self.message, self.details = status, code, message, details or []
        problems = [f"{d.get('path', '')}: {d.get('message', '')}" for d in self.details]
        # the service's message may list the problems itself (invalid params do): each is said once
        said = "\n".join(line for line in message.splitlines() if not _lists_one_of(line, problems))
        lines = [f"{(said or message).rstrip(':')} [{code}, HTTP {status}]{':' if problems else ''}"]
        lines += [f"  - {p}{_got(d)}" for p, d in zip(problems, self.details, strict=True)]
        super().__init__("\n".join(lines))


def _lists_one_of(line: str, problems: list[str]) -> bool:
    """Whether ``line`` is one of ``problems`` as a message lists it (``  - path: message ...``)."""
    item = line.strip().removeprefix("- ")
    return line.lstrip().startswith("- ") and any(item.startswith(p) for p in problems)


def _got(detail: dict[str, Any]) -> str:
    return f" (got {detail['value']!r})" if "value" in detail else ""


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
        settings = resolve_settings(url, token)
        if not settings.token:
            raise ValueError("no API token: pass token=... or set WEIGHTSTREAM_TOKEN")
        self.url = settings.url
        self._http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {settings.token}"}, timeout=timeout_s
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
            raise _api_error(r)
        return r

    def submit(
        self,
        params: Mapping[str, Any] | str | Path,
        num_csx: int | None = None,
        labels: Mapping[str, str] | None = None,
        priority: int = 2,
    ) -> Job:
        """Submit a job: ``params`` a mapping, a YAML file's path or YAML text. ``num_csx`` overrides the
        params' ``runconfig.num_csx``; None (the default) runs on as many CS-2 as they say."""
        body: dict[str, Any] = {"params": load_params(params)}
        if num_csx is not None:  # left out: the service takes the params' own
            body["num_csx"] = num_csx
        body.update(labels=dict(labels or {}), priority=priority)
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


def _api_error(r: httpx.Response) -> ApiError:
    """The service's error answer (``{"error": {"code", "message", "details"?}}``) as an ApiError; any
    other answer (a proxy's page) by its status and text."""
    try:
        err = r.json()["error"]
        code, message, details = err.get("code", "error"), err.get("message", ""), err.get("details")
    except (ValueError, KeyError, TypeError, AttributeError):
        code, message, details = "http_error", r.text[:500] or r.reason_phrase, None
    return ApiError(r.status_code, code, message, details)


class Job:
    """A handle on one job of a service."""

    def __init__(self, client: Client, job_id: str) -> None:
        self.client, self.id = client, job_id
        self._path = f"/v1/jobs/{quote(job_id, safe='')}"  # an id is one path segment, whatever it holds

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def info(self) -> dict[str, Any]:
        return self.client.request("GET", self._path).json()

    def status(self) -> str:
        return self.info()["status"]

    def metrics(self) -> dict[str, list[dict[str, Any]]]:
        return self.client.request("GET", f"{self._path}/metrics").json()

    def logs(self, tail: int | None = None) -> str:
        return self.client.request("GET", f"{self._path}/logs", params={"tail": tail} if tail else {}).text

    def cancel(self) -> dict[str, Any]:
        return self.client.request("DELETE", self._path).json()

    def set_labels(
        self, labels: Mapping[str, str] | None = None, remove: Iterable[str] = ()
    ) -> dict[str, Any]:
        """Set ``labels`` and remove the keys ``remove`` (one the job lacks is no error), whatever the job's
        status; returns the job as it is then. ApiError 422 beyond the service's label limits."""
        body = {"set": dict(labels or {}), "remove": list(remove)}
        return self.client.request("PATCH", f"{self._path}/labels", json=body).json()

    def set_priority(self, priority: int) -> dict[str, Any]:
        """1, 2 or 3 (1 runs first): a queued job takes its new place in the queue at once. Returns the job;
        ApiError 409 if it has finished."""
        return self.client.request("PUT", f"{self._path}/priority", json={"priority": priority}).json()

    def export_logs(self, path: str | Path) -> Path:
        """The job's logs as one tar.gz (run.log, every role's log, params.yaml, metrics.jsonl, under
        ``<id>/``) written to ``path`` (or ``<id>-logs.tar.gz`` in it, if it is a directory); returns the
        file's path. Written to a temporary file beside it and renamed when complete: ``path`` is never
        left half-written, and an earlier file there stays whole until the new one replaces it."""
        path = Path(path)
        if path.is_dir():
            path = path / _plain_file_name(f"{self.id}-logs.tar.gz")
        self._stream_to_file(f"{self._path}/logs/export", path, "log export")
        return path

    def checkpoints(self) -> list[dict[str, Any]]:
        return self.client.request("GET", f"{self._path}/checkpoints").json()["checkpoints"]

    def events(self, after: int = 0, follow: bool = True) -> Iterator[dict[str, Any]]:
        """Server-sent events as dicts ``{"seq", "kind", **data}``; with ``follow`` until the job ends.
        A ``{"kind": "keepalive"}`` comes at least every few seconds while nothing happens."""
        params = {"after": after, "follow": follow}
        with self.client._http.stream("GET", f"{self._path}/events", params=params, timeout=None) as r:
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
        bar = ProgressBar(self.id) if progress else None
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

    def download(self, directory: str | Path, step: int | None = None, overwrite: bool = False) -> Path:
        """Download a checkpoint (the last one unless ``step``) into ``directory/checkpoint_<step>/``;
        returns that path. Raises CheckpointExistsError (a FileExistsError) if that directory already
        holds files, unless ``overwrite``: then the checkpoint's files there are replaced as a set (every
        weights, index, config, optimizer or trainer-state file the new checkpoint lacks is removed, so
        no old file is loaded instead of a new one); other files stay. The files arrive in a hidden
        directory beside it and move in once all are complete: a failed download changes nothing."""
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
        refuse_to_merge(out, overwrite)  # before anything is fetched
        staged = staging_dir(out)
        try:
            for name, size in files:
                url = f"{self._path}/checkpoints/{step_}/files/{quote(name, safe='')}"
                self._stream_to_file(url, staged / name, f"download of {name}", size, timeout=None)
            install_checkpoint(staged, out)
        finally:
            shutil.rmtree(staged, ignore_errors=True)  # gone already once installed
        return out

    def _stream_to_file(
        self,
        url: str,
        path: Path,
        what: str,
        size: int | None = None,
        timeout: Any = httpx.USE_CLIENT_DEFAULT,
    ) -> None:
        """GET ``url`` into ``path`` through a temporary file beside it, fsynced and renamed when complete
        (and ``size`` bytes long, if given): ``path`` is never left half-written, an earlier file there
        stays whole until the new one replaces it, and a failed transfer leaves nothing behind. The
        service's error answer is raised as its ApiError."""
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                try:
                    with self.client._http.stream("GET", url, timeout=timeout) as r:
                        if r.status_code >= 400:
                            r.read()
                            raise _api_error(r)
                        for chunk in r.iter_bytes(1 << 20):
                            fh.write(chunk)
                except httpx.HTTPError as e:
                    raise ApiError(0, "unreachable", f"{what} from {self.client.url} failed: {e}") from e
                got = fh.tell()
                if size is not None and got != size:
                    raise ApiError(0, "incomplete", f"{what}: got {got} of {size} bytes")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


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
