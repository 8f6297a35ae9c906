"""The web dashboard at /, in a real headless Chromium, against a real `weightstream serve` running real jobs.

The browser is the system's Chromium (Debian: `apt install chromium`; or WEIGHTSTREAM_CHROMIUM=path)
driven by playwright's Python API; playwright's own browser downloads are never used. Without either,
the browser tests skip with the reason; the test of the open static files runs anyway. A screenshot goes
under the test's tmp dir, and to docs/dashboard.png when WEIGHTSTREAM_SCREENSHOT is set.
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import re
import shutil
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.appliance import TINY
from tests.integration.jobs.live_api import TOKEN, ServeProcess
from tests.waiting import wait_until
from weightstream.jobs.api.routers.dashboard import ASSETS
from weightstream.jobs.store import JobStore

ROOT = Path(__file__).parents[3]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REFUSED = "the service refused this token"
# this origin only, nothing inline, no eval, no plugins, no framing, no form posts, no HTML from strings
STRICT_CSP = [
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


@dataclass
class Served:
    proc: ServeProcess
    data_dir: Path

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.proc.url, headers=AUTH, timeout=30)

    def submit(self, max_steps: int, labels: dict[str, str], num_csx: int = 1, **runconfig: Any) -> str:
        params = copy.deepcopy(TINY)
        params["runconfig"].update(max_steps=max_steps, log_steps=1, **runconfig)
        with self.http() as c:
            r = c.post("/v1/jobs", json={"params": params, "num_csx": num_csx, "labels": labels})
        assert r.status_code == 201, r.text
        job_id: str = r.json()["id"]
        return job_id

    def job(self, job_id: str) -> dict[str, Any]:
        with self.http() as c:
            body: dict[str, Any] = c.get(f"/v1/jobs/{job_id}").raise_for_status().json()
            return body

    def wait_status(self, job_id: str, status: str, timeout_s: float = 180) -> None:
        _until(lambda: self.job(job_id)["status"] == status, timeout_s, f"job {job_id} never {status}")


@dataclass
class Browsed:
    """What the page did: every request it sent, and every error it logged (CSP violations included)."""

    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def check(self, served: Served) -> None:
        """The token went into Authorization headers only: into no URL, no Referer, and no line the server
        wrote (`serve` keeps no access log at its log level; a proxy's would hold these URLs)."""
        for url, headers in self.requests:
            assert TOKEN not in url and "token=" not in url, url
            assert TOKEN not in headers.get("referer", ""), headers
            if "/v1/" in url:  # every data request carries a token, in the header
                assert headers.get("authorization", "").startswith("Bearer "), url
            else:  # the page and its files: loaded with no token at all
                assert "authorization" not in headers, url
        assert TOKEN not in served.proc.log.read_text()
        # a 401 is the wrong-token test's own doing; anything else logged is a fault of the page
        assert [e for e in self.errors if "status of 401" not in e] == [], self.errors


def _until(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    """``cond`` within ``timeout_s``, or fail saying ``what`` went wrong; looked at every 0.05 s (each look
    is a round trip to the browser)."""
    try:
        wait_until(cond, what, timeout_s, poll_s=0.05)
    except AssertionError:
        pytest.fail(f"{what} within {timeout_s} s")


def _chromium() -> str | None:
    for candidate in (os.environ.get("WEIGHTSTREAM_CHROMIUM"), "chromium", "chromium-browser"):
        if candidate and (path := shutil.which(candidate)):
            return path
    return None


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    d = tmp_path_factory.mktemp("dashboard")
    proc = ServeProcess(d / "data", d / "serve.log")  # one CS-2 slot: the tests' jobs run one at a time
    yield Served(proc, d / "data")
    proc.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is a test extra: pip install -e .[test]"
    )
    exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium found: apt install chromium (or set WEIGHTSTREAM_CHROMIUM to one)")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[tuple[Any, Browsed]]:
    context = browser.new_context(viewport={"width": 1280, "height": 1000}, accept_downloads=True)
    p = context.new_page()
    seen = Browsed()

    def logged(message: Any) -> None:
        if message.type == "error":  # a CSP violation is one
            seen.errors.append(message.text)

    p.on("request", lambda r: seen.requests.append((r.url, r.all_headers())))
    p.on("console", logged)
    p.on("pageerror", lambda e: seen.errors.append(str(e)))
    yield p, seen
    context.close()


def _text(p: Any, selector: str) -> str:
    text: str = p.inner_text(selector)
    return text


def _drawn(p: Any, series: str) -> int:
    """Points of the chart's ``series`` polyline as drawn (0 before there is one)."""
    n: int = p.evaluate(
        """s => {
            const line = document.querySelector(`#loss-chart polyline.${s}`);
            return line ? line.getAttribute("points").trim().split(/\\s+/).filter(Boolean).length : 0;
        }""",
        series,
    )
    return n


def _open(p: Any, served: Served, job_id: str) -> None:
    p.goto(f"{served.proc.url}/#token={TOKEN}")
    _until(lambda: job_id in p.inner_text("body"), 5, f"the page did not list job {job_id}")
    p.click(f"#job-rows tr[data-id='{job_id}']")
    assert p.url == f"{served.proc.url}/jobs/{job_id}"  # the job's own address, to share


def _shown(p: Any, job_id: str) -> bool:
    """Whether the page has ``job_id`` open: its details, and its row marked in the list."""
    selected = p.locator("#job-rows tr.selected")
    return (
        p.locator("#detail").is_visible()
        and _text(p, "#d-id") == job_id
        and selected.count() == 1
        and selected.get_attribute("data-id") == job_id
    )


def _chart_size(p: Any) -> dict[str, float]:
    """The chart's drawn width, the width of the job's section it sits in, and its viewBox's width."""
    size: dict[str, float] = p.evaluate(
        """() => {
            const chart = document.querySelector("#loss-chart");
            return {
                chart: chart.getBoundingClientRect().width,
                container: document.querySelector("#detail").getBoundingClientRect().width,
                content: chart.clientWidth,
                viewbox: chart.viewBox.baseVal.width,
            };
        }"""
    )
    return size


def _fills_its_container(p: Any) -> bool:
    """The chart spans at least 90% of the job's section, and its viewBox is its size in CSS pixels
    (drawn for that width, not a small drawing scaled up: text stays at its size)."""
    size = _chart_size(p)
    return size["chart"] >= 0.9 * size["container"] and abs(size["viewbox"] - size["content"]) <= 1


def _screenshot(p: Any, tmp_path: Path, name: str, readme: bool = False) -> None:
    """A full-page screenshot under the test's tmp dir; the README's too with WEIGHTSTREAM_SCREENSHOT set."""
    shot = tmp_path / name
    p.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    if readme and os.environ.get("WEIGHTSTREAM_SCREENSHOT"):
        (ROOT / "docs").mkdir(exist_ok=True)
        shutil.copyfile(shot, ROOT / "docs" / "dashboard.png")
        print(f"screenshot: {ROOT / 'docs' / 'dashboard.png'}")


def test_every_dashboard_file_is_served_and_is_package_data() -> None:
    """A plain `pip install .` ships what the router serves: every file of the folder has a served type,
    and matches a package-data glob of pyproject.toml (else a wheel would serve a 404 at /)."""
    folder = ROOT / "services" / "weightstream" / "jobs" / "api" / "dashboard"
    assert set(ASSETS) == {f.name for f in folder.iterdir()}, "a file the router does not serve"
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["weightstream"]
    unshipped = [n for n in ASSETS if not any(fnmatch(f"jobs/api/dashboard/{n}", g) for g in globs)]
    assert not unshipped, f"add to [tool.setuptools.package-data] weightstream: {unshipped}"


def test_the_page_and_its_files_are_open_and_strict_and_v1_is_not(served: Served) -> None:
    url = served.proc.url
    page = httpx.get(f"{url}/")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    csp = [d.strip() for d in page.headers["content-security-policy"].split(";")]
    assert csp == STRICT_CSP, csp
    assert page.headers["x-frame-options"] == "DENY" and page.headers["referrer-policy"] == "no-referrer"
    # no inline script or style for the CSP to forbid: every script is a file
    assert all(not body.strip() for body in re.findall(r"<script[^>]*>(.*?)</script>", page.text, re.S))
    assert "<style" not in page.text and " style=" not in page.text
    # a job's own address is the same page with the same headers (the page opens the job itself)
    job_page = httpx.get(f"{url}/jobs/0123abcd4567")
    assert job_page.status_code == 200 and job_page.content == page.content
    assert {k: job_page.headers[k] for k in ("content-security-policy", "x-frame-options")} == {
        k: page.headers[k] for k in ("content-security-policy", "x-frame-options")
    }

    # every file the page and its modules name: open, typed, revalidated
    types = {
        ".js": "text/javascript; charset=utf-8",
        ".css": "text/css; charset=utf-8",
        ".svg": "image/svg+xml",
    }
    todo, loaded = re.findall(r'"/dashboard/([\w.-]+)"', page.text), set()
    while todo:
        name = todo.pop()
        r = httpx.get(f"{url}/dashboard/{name}")
        assert r.status_code == 200, name
        assert r.headers["content-type"] == types[Path(name).suffix], name
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["cache-control"] == "no-cache"
        loaded.add(name)
        todo += [m for m in re.findall(r'from "\./([\w.-]+)"', r.text) if m not in loaded]
    assert loaded == {"dashboard.js", "api.js", "chart.js", "dashboard.css", "favicon.svg"}
    again = httpx.get(f"{url}/", headers={"If-None-Match": page.headers["etag"]})
    assert again.status_code == 304 and again.content == b""

    # only the shipped files, by name: no listing, no other file, no way out of the folder
    conn = http.client.HTTPConnection("127.0.0.1", served.proc.port, timeout=10)
    for raw in (
        "/dashboard/../routers/dashboard.py",
        "/dashboard/..%2frouters%2fdashboard.py",
        "/dashboard/%2e%2e/app.py",
        "/dashboard/..%2f..%2f..%2f..%2fpyproject.toml",
        "/dashboard/",
        "/dashboard",
        "/dashboard/index.html",
        "/dashboard/missing.js",
        "/jobs/",
        "/jobs/0123abcd4567/logs",
    ):
        conn.request("GET", raw)
        answer = conn.getresponse()
        assert answer.status == 404, (raw, answer.status, answer.read()[:200])
        answer.read()
    conn.close()

    # the API is as closed as before; the dashboard is no part of its OpenAPI document
    assert httpx.get(f"{url}/v1/jobs").status_code == 401
    assert httpx.get(f"{url}/v1/jobs", headers=AUTH).status_code == 200
    documented = httpx.get(f"{url}/openapi.json").json()["paths"]
    assert "/" not in documented and not [p for p in documented if p.startswith("/dashboard")]


# What the event stream can hold: a keepalive comment, data over several lines, characters of several bytes.
STREAM = (
    'id: 1\nevent: status\ndata: {"status": "running", "at": 1.5}\n\n'
    ": keepalive\n\n"
    'id: 2\nevent: step\ndata: {"step": 1, "loss": 4.25, "note": "é ✓ 步"}\n\n'
    'id: 3\nevent: eval\ndata: {"step": 1,\ndata: "eval_loss": null}\n\n'
)
PARSED = [
    {"seq": 1, "kind": "status", "data": {"status": "running", "at": 1.5}},
    {"seq": 2, "kind": "step", "data": {"step": 1, "loss": 4.25, "note": "é ✓ 步"}},
    {"seq": 3, "kind": "eval", "data": {"step": 1, "eval_loss": None}},
]


def test_the_event_reader_gets_every_event_however_the_stream_is_cut(
    page: tuple[Any, Browsed], served: Served
) -> None:
    """The page's own SSE reader (fetch + ReadableStream) on a stream delivered in pieces of every size:
    frames and UTF-8 characters cut anywhere still give the same events."""
    p, seen = page
    p.goto(f"{served.proc.url}/")  # no token: the login form, nothing polling
    got = p.evaluate(
        """async ([text, sizes]) => {
            const api = await import("/dashboard/api.js");
            const bytes = new TextEncoder().encode(text);
            const results = [];
            for (const size of sizes) {
                window.fetch = async () => new Response(new ReadableStream({
                    start(stream) {
                        for (let i = 0; i < bytes.length; i += size) stream.enqueue(bytes.slice(i, i + size));
                        stream.close();
                    },
                }));
                const events = [];
                await api.readEvents("/v1/jobs/x/events", (e) => events.push(e), undefined);
                results.push(events);
            }
            return results;
        }""",
        [STREAM, [1, 2, 3, 5, 7, 64, len(STREAM.encode())]],
    )
    assert got == [PARSED] * 7
    seen.check(served)


def test_a_running_job_is_followed_live_and_cancelled_from_the_page(
    page: tuple[Any, Browsed], served: Served, tmp_path: Path
) -> None:
    p, seen = page
    job_id = served.submit(5000, {"dashboard": "live"})  # minutes of steps: it is cancelled long before
    _open(p, served, job_id)
    assert "token" not in p.url  # the fragment left the address bar at once

    # the loss chart is drawn at a real size and grows while the job runs
    _until(lambda: _drawn(p, "loss") >= 3, 90, "no loss point was drawn")
    box = p.locator("#loss-chart").bounding_box()
    assert box["width"] > 100 and box["height"] > 50, box
    first = _drawn(p, "loss")
    _until(lambda: _drawn(p, "loss") >= first + 5, 60, "the chart got no new points")
    assert served.job(job_id)["status"] == "running"
    assert float(_text(p, "#d-tps").replace(",", "")) > 0 and _text(p, "#d-eta") != "—"
    assert _text(p, "#d-step").endswith("/ 5000")

    # every role with its address and state, as the job's events tell them
    with served.http() as c:
        stream = c.get(f"/v1/jobs/{job_id}/events", params={"follow": "false"}).text
    events = [json.loads(line[len("data: ") :]) for line in stream.splitlines() if line.startswith("data: ")]
    started = next(e["addresses"] for e in events if "addresses" in e)
    addresses = [a for kind in started.values() for a in kind]
    roles = _text(p, "#role-rows")
    assert len(addresses) == 5 and all(a in roles for a in addresses), (addresses, roles)
    assert re.search(r"worker-0\s+running\s+127\.0\.0\.1:\d+\s+0", roles), roles
    _until(lambda: "INFO step" in _text(p, "#log"), 10, "the log tail showed no step")
    _screenshot(p, tmp_path, "dashboard-running.png")

    # one click arms the button, the second cancels
    p.click("#cancel")
    assert _text(p, "#cancel") == "click again to cancel" and served.job(job_id)["status"] == "running"
    p.click("#cancel")
    served.wait_status(job_id, "cancelled", 30)
    _until(lambda: _text(p, "#d-phase") == "cancelled", 10, "the page did not show the job cancelled")
    _until(lambda: not p.locator("#cancel").is_visible(), 10, "a cancelled job still offers to cancel")
    _until(
        lambda: "stopped" in _text(p, "#role-rows") and "running" not in _text(p, "#role-rows"), 10, "roles"
    )
    seen.check(served)


def test_a_finished_job_shows_every_step_its_checkpoints_and_downloads_them(
    page: tuple[Any, Browsed], served: Served, tmp_path: Path
) -> None:
    p, seen = page
    job_id = served.submit(30, {"dashboard": "done", "team": "nlp"}, checkpoint_steps=10)
    served.wait_status(job_id, "succeeded")
    _open(p, served, job_id)
    _until(lambda: _drawn(p, "loss") == 30 and _drawn(p, "eval") == 1, 10, "the chart is not whole")
    assert p.locator("#loss-chart circle.eval").count() == 1
    assert p.get_attribute("#loss-chart", "data-points") == "30"
    assert _text(p, "#d-step") == "30 / 30" and _text(p, "#d-phase") == "succeeded"
    _until(lambda: _text(p, "#d-workers") == "1", 10, "the job's header")  # from the job, not its events
    assert not p.locator("#cancel").is_visible()  # a finished job has nothing to cancel

    # the chart names its axes, and takes the width there is, at this window's size and another
    titles = p.eval_on_selector_all("#loss-chart text.title", "ts => ts.map(t => t.textContent)")
    assert titles == ["step", "loss"]
    assert _fills_its_container(p), _chart_size(p)
    wide = _chart_size(p)["chart"]
    p.set_viewport_size({"width": 800, "height": 1000})
    _until(lambda: _chart_size(p)["chart"] < wide - 300 and _fills_its_container(p), 5, "no resize")
    assert _drawn(p, "loss") == 30  # drawn again at the new size
    p.set_viewport_size({"width": 1280, "height": 1000})
    _until(lambda: _chart_size(p)["chart"] == wide, 5, "the chart did not grow back")
    _until(lambda: "step 30" in _text(p, "#log"), 10, "the log tail lacks the last step")
    _until(lambda: _text(p, "#checkpoints").count("step ") == 3, 10, "the checkpoints are not listed")

    # a download carries the bearer header and gives the file's bytes
    button = p.locator("#checkpoints li", has_text="step 30").locator("button", has_text="config.json")
    with p.expect_download() as got:
        button.click()
    download = got.value
    assert download.suggested_filename == "config.json"
    on_disk = served.data_dir / "jobs" / job_id / "checkpoint_30" / "config.json"
    assert Path(download.path()).read_bytes() == on_disk.read_bytes()
    fetched = [h for u, h in seen.requests if u.endswith("/checkpoints/30/files/config.json")]
    assert fetched and fetched[0]["authorization"] == f"Bearer {TOKEN}"
    _screenshot(p, tmp_path, "dashboard.png", readme=True)
    seen.check(served)


def test_a_wrong_token_is_refused_clearly_and_another_asked_for(
    page: tuple[Any, Browsed], served: Served
) -> None:
    p, seen = page
    p.goto(f"{served.proc.url}/#token=not-the-token")
    _until(lambda: p.locator("#login").is_visible(), 5, "no token form")
    _until(lambda: _text(p, "#login-message") == REFUSED, 5, "no clear message")
    assert not p.locator("#app").is_visible() and "token" not in p.url
    assert p.evaluate("sessionStorage.length") == 0  # the refused token is forgotten

    p.fill("#token-input", TOKEN)
    p.click("#token-form button[type=submit]")
    _until(
        lambda: p.locator("#job-table").is_visible() and not p.locator("#login").is_visible(), 5, "no list"
    )
    _until(lambda: "live" in _text(p, "#connection"), 5, "the list did not load")
    kept = p.evaluate("[sessionStorage.getItem('weightstream.token'), localStorage.length]")
    assert kept == [TOKEN, 0]  # this tab only: gone with it, never on disk for other tabs
    p.reload()  # the token stays with the tab
    _until(lambda: "live" in _text(p, "#connection"), 5, "the token was not kept for the tab")
    p.click("#forget")
    assert p.locator("#login").is_visible() and _text(p, "#login-message") == ""
    assert p.evaluate("sessionStorage.length") == 0
    seen.check(served)


def test_filters_and_the_newer_fields_only_when_present(page: tuple[Any, Browsed], served: Served) -> None:
    """`user` and `duration_s` (newer fields of a job) are shown when the service sends them, and not
    needed: without them the duration comes from the status history and the user column hides."""
    p, seen = page
    job_id = served.submit(2, {"dashboard": "filters"})
    served.wait_status(job_id, "succeeded")

    def service_sending(fields: dict[str, Any]) -> Callable[[Any], None]:
        def answer(route: Any) -> None:
            body = route.fetch().json()
            for job in body.get("jobs", [body]):
                for newer in ("user", "duration_s"):  # whatever this service sends of them...
                    job.pop(newer, None)
                job.update(fields)  # ...then what the test wants
            route.fulfill(json=body)

        return answer

    jobs_api = re.compile(r".*/v1/jobs(\?.*|/[0-9a-f]+)?$")  # the list and one job, not its events
    p.route(jobs_api, service_sending({}))
    p.goto(f"{served.proc.url}/#token={TOKEN}")
    row = p.locator(f"#job-rows tr[data-id='{job_id}']")
    _until(lambda: row.count() == 1, 5, "the job is not listed")
    cells = row.locator("td").all_inner_texts()
    assert re.fullmatch(r"\d+s", cells[4]), cells  # the run's duration, from its history
    assert not p.locator("#job-table th.user").is_visible()

    p.unroute(jobs_api)
    p.route(jobs_api, service_sending({"user": "ada", "duration_s": 1234.0}))
    _until(lambda: p.locator("#job-table th.user").is_visible(), 5, "no user column")
    cells = row.locator("td").all_inner_texts()
    assert cells[4] == "20m 34s" and cells[7] == "ada", cells

    p.select_option("#phase-filter", "failed")
    _until(lambda: row.count() == 0 and p.locator("#no-jobs").is_visible(), 5, "the phase filter")
    p.select_option("#phase-filter", "succeeded")
    _until(lambda: row.count() == 1, 5, "the phase filter")
    p.fill("#label-filter", "dashboard=other")
    _until(lambda: row.count() == 0, 5, "the label filter")
    p.fill("#label-filter", "dashboard=filters")
    _until(lambda: row.count() == 1, 5, "the label filter")
    p.fill("#label-filter", "dashboard")
    _until(lambda: "key=value" in _text(p, "#filter-message"), 5, "no word on a bad label filter")
    p.unroute_all(behavior="ignoreErrors")  # a poll in flight as the page closes is no failure
    seen.check(served)


# two jobs and a browser (~12 s)
@pytest.mark.slow
def test_a_job_has_an_address_that_opens_it_and_back_and_forward_move_between_jobs(
    page: tuple[Any, Browsed], served: Served
) -> None:
    p, seen = page
    first = served.submit(2, {"dashboard": "address"})
    second = served.submit(2, {"dashboard": "address"})
    served.wait_status(second, "succeeded")
    url = served.proc.url

    # the address opens the page on the job, the token given alongside as usual
    p.goto(f"{url}/jobs/{first}#token={TOKEN}")
    _until(lambda: _shown(p, first), 10, f"the address did not open job {first}")
    assert p.url == f"{url}/jobs/{first}"  # the token left, the job's address stayed
    _until(lambda: _text(p, "#d-workers") == "1", 10, "the job's header")
    assert _text(p, "#d-phase") == "succeeded" and not p.locator("#cancel").is_visible()

    # choosing another job gives it its own address; back and forward move between them, then the list
    p.click(f"#job-rows tr[data-id='{second}']")
    assert p.url == f"{url}/jobs/{second}"
    _until(lambda: _shown(p, second), 10, "the chosen job")
    p.go_back()
    assert p.url == f"{url}/jobs/{first}"
    _until(lambda: _shown(p, first), 10, "back did not reopen the first job")
    p.go_forward()
    _until(lambda: _shown(p, second), 10, "forward did not reopen the second job")
    p.reload()  # a bookmark, in effect: the token is kept for the tab
    _until(lambda: _shown(p, second), 10, "the address did not survive a reload")

    p.goto(f"{url}/")
    _until(lambda: p.locator(f"#job-rows tr[data-id='{first}']").count() == 1, 5, "the list")
    assert not p.locator("#detail").is_visible() and p.locator("#job-rows tr.selected").count() == 0
    p.go_back()
    _until(lambda: _shown(p, second), 10, "back to the job's address")
    seen.check(served)


def test_fewer_workers_and_a_straggler_show_as_the_events_say(
    page: tuple[Any, Browsed], tmp_path: Path
) -> None:
    """A 2-worker job's page after its stored events say it went on with 1 worker and that a worker was
    a straggler (written into the service's store as the runner writes them: the runs that make them are
    tests/integration/test_elastic_workers.py and the straggler tests)."""
    p, seen = page
    proc = ServeProcess(tmp_path / "data", tmp_path / "serve.log", "--slots", "2")
    try:
        served = Served(proc, tmp_path / "data")
        job_id = served.submit(3, {"dashboard": "elastic"}, num_csx=2)
        served.wait_status(job_id, "succeeded")
        store = JobStore(served.data_dir / "jobs.sqlite")
        try:
            why = "no capacity to start worker-1 again within 30s"
            store.add_event(job_id, "workers", {"step": 3, "from_workers": 2, "to_workers": 1, "reason": why})
            store.add_event(job_id, "step", {"step": 3, "loss": 4.0, "tokens_per_second": 9.0, "workers": 1})
            slow = {"step": 3, "worker": "worker-0", "host": "h2", "ratio": 4.31, "steps": 3}
            store.add_event(job_id, "straggler", slow)
        finally:
            store.close()
        _open(p, served, job_id)
        _until(lambda: _text(p, "#d-workers") == "1 of 2", 10, "the page did not show 1 of 2 workers")
        assert _text(p, "#role-note") == f"step 3: workers 2 → 1: {why}"
        note = "step 3: straggler: worker-0 on h2 4.3x the other workers' median for 3 steps"
        _until(lambda: _text(p, "#straggler-note") == note, 10, "the page did not show the straggler")
        seen.check(served)
    finally:
        proc.stop()
