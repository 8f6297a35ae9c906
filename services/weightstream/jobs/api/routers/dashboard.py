"""``/``, ``/jobs/{job_id}`` and ``/dashboard/{name}``: the live web dashboard, plain files shipped in
the package. ``/jobs/{job_id}`` is the same page, opened on that job: an address to share or bookmark
(the page reads the id from its address; whether the job exists is for /v1, with the reader's token).

The page and its scripts hold no data and no secret: the scripts read /v1 with the bearer token the user
gives them, so these routes need none (``edge.is_protected`` covers /v1 only). What keeps them tight:

- Only the files shipped in ``jobs/api/dashboard/`` with a known type are served, read once at import
  into a table keyed by file name. A request names a key, never a path: nothing else on disk is
  reachable (no ``..``, no symlink, no listing) and nothing is read from disk per request.
- The page gets a strict Content-Security-Policy: scripts and styles only from this origin (no inline
  script, no eval), fetches only to this origin, no plugins, no framing, trusted types (the scripts never
  parse strings as HTML, so the job labels and logs they show cannot become markup), and
  ``form-action 'none'``: the token form cannot submit itself, so a token typed before the scripts ran
  never becomes a query string in some access log.
- ``Cache-Control: no-cache`` with an ``ETag``: the names carry no version, so the browser revalidates on
  every load (a 304 without a body) and an upgraded service never runs old scripts against a new API.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import PurePath

from fastapi import APIRouter, Request, Response

from weightstream.jobs.api.errors import ApiError

__all__ = ["ASSETS", "CONTENT_SECURITY_POLICY", "PAGE", "Asset", "load_assets", "router"]

PAGE = "index.html"  # served at / and /jobs/{job_id} only
MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",  # ES modules: browsers refuse other types for them
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    ]
)
_EVERY_FILE = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
_PAGE_ONLY = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers without CSP level 2
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str
    etag: str  # quoted, as the header carries it


def load_assets(directory: Traversable) -> dict[str, Asset]:
    """The plain files of ``directory`` with a type in ``MEDIA_TYPES``, by name (none when it is
    missing: a package installed without its data serves a 404 that says so, the API still works)."""
    assets = {}
    if directory.is_dir():
        for entry in directory.iterdir():
            suffix = PurePath(entry.name).suffix
            if entry.is_file() and suffix in MEDIA_TYPES:
                body = entry.read_bytes()
                etag = f'"{hashlib.sha256(body).hexdigest()[:32]}"'
                assets[entry.name] = Asset(body, MEDIA_TYPES[suffix], etag)
    return assets


ASSETS = load_assets(files("weightstream.jobs.api") / "dashboard")

router = APIRouter(include_in_schema=False)  # not part of the API: OpenAPI documents /v1


@router.get("/")
def page(request: Request) -> Response:
    return _serve(request, PAGE, {**_EVERY_FILE, **_PAGE_ONLY})


@router.get("/jobs/{job_id}")
def job_page(request: Request, job_id: str) -> Response:
    return page(request)


@router.get("/dashboard/{name}")
def asset(request: Request, name: str) -> Response:
    if name == PAGE:  # the page (and its headers) only at its own addresses
        raise ApiError(404, "not_found", f"no dashboard file {name!r}")
    return _serve(request, name, _EVERY_FILE)


def _serve(request: Request, name: str, headers: dict[str, str]) -> Response:
    found = ASSETS.get(name)
    if found is None:
        why = "" if ASSETS else " (the dashboard's files are not installed: package data is missing)"
        raise ApiError(404, "not_found", f"no dashboard file {name!r}{why}")
    headers = {**headers, "ETag": found.etag}
    given = request.headers.get("if-none-match", "")
    if found.etag in (tag.strip().removeprefix("W/") for tag in given.split(",")):
        return Response(status_code=304, headers=headers)
    return Response(found.body, media_type=found.media_type, headers=headers)
