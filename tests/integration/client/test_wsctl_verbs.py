"""csctl's verbs in `wsctl`, run as a user runs them (a subprocess, stdout a pipe) against the real REST API
on loopback, over a JobService whose jobs start and end when the test says (``Fleet``)."""

from __future__ import annotations

import copy
import getpass
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.fleet import Fleet
from tests.integration.appliance import TINY
from tests.integration.jobs.live_api import TOKEN, LiveApi, ServeProcess
from tests.waiting import wait_until
from weightstream.numerics.sparse_masks import kept_count
from weightstream_client import Client
from weightstream_client._format import JOB_COLUMNS, cell, human_duration, table
from weightstream_client.cli import app

USER = "alice"


class Served(LiveApi):
    """The API over ``Fleet`` runners: a job named ``name`` blocks until ``finish(name)``."""

    def __init__(self, data_dir: Path, slots: int = 1) -> None:
        self.fleet = Fleet()
        super().__init__(data_dir, slots, runners=self.fleet, user_name=USER)

    def submit(self, name: str, priority: int = 2, **labels: str) -> str:
        return self.service.submit(copy.deepcopy(TINY), 1, {"name": name, **labels}, priority).id

    def finish(self, name: str) -> None:
        self.fleet.runners[name].finish()

    def wait_started(self, *names: str) -> None:
        wait_until(
            lambda: self.fleet.started == list(names), lambda: f"{names} started ({self.fleet.started})"
        )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    with Served(tmp_path / "data") as s:
        yield s
        for runner in s.fleet.runners.values():  # nothing left blocking the service's shutdown
            runner.finish()


def wsctl(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("wsctl")
    cmd = [exe] if exe else [sys.executable, "-c", "from weightstream_client.cli import main; main()"]
    environ = {**os.environ, "WEIGHTSTREAM_URL": url, "WEIGHTSTREAM_TOKEN": TOKEN, "COLUMNS": "80", **env}
    return subprocess.run([*cmd, *args], env=environ, capture_output=True, text=True, timeout=60, check=False)


def rows(stdout: str) -> list[list[str]]:
    """A `wsctl get` table as cells, split at the gaps between columns (three spaces or more)."""
    return [re.split(r" {3,}", line) for line in stdout.splitlines()]


def test_get_jobs_prints_every_job_on_one_line_with_its_full_id_when_piped(served: Served) -> None:
    served.fleet.instant.add("done")
    done = served.submit("done", team="a" * 60)  # a long label: the line is far wider than 80 columns
    served.wait_started("done")
    wait_until(lambda: served.service.is_terminal(done), lambda: "done to finish")
    running = served.submit("running")
    served.wait_started("done", "running")
    queued = served.submit("queued", team="b")
    r = wsctl(served.url, "get", "jobs")
    assert r.returncode == 0, r.stderr
    table_rows = rows(r.stdout)
    assert table_rows[0] == list(JOB_COLUMNS)
    assert [row[0] for row in table_rows[1:]] == [queued, running, done]  # newest first, ids whole
    by_id = {row[0]: dict(zip(JOB_COLUMNS, row, strict=True)) for row in table_rows[1:]}
    assert [by_id[j]["PHASE"] for j in (queued, running, done)] == ["QUEUED", "RUNNING", "SUCCEEDED"]
    assert {row["USER"] for row in by_id.values()} == {USER} and by_id[done]["SYSTEMS"] == "1"
    assert by_id[queued]["DURATION"] == "-" and by_id[running]["DURATION"].endswith("s")
    assert by_id[done]["LABELS"] == f"name=done,team={'a' * 60}"
    assert max(map(len, r.stdout.splitlines())) > 100  # not wrapped at the 80 columns of a pipe

    r = wsctl(served.url, "get", "jobs", "--active")
    assert [row[0] for row in rows(r.stdout)[1:]] == [queued, running]
    r = wsctl(served.url, "get", "jobs", "--label", "team=b")
    assert [row[0] for row in rows(r.stdout)[1:]] == [queued]
    listed = json.loads(wsctl(served.url, "get", "jobs", "-o", "json").stdout)
    assert [j["id"] for j in listed] == [queued, running, done] and listed[0]["user"] == USER
    listed = yaml.safe_load(wsctl(served.url, "get", "jobs", "-o", "yaml", "--active").stdout)
    assert [j["id"] for j in listed] == [queued, running]


def test_get_job_shows_one_job_or_everything_about_it(served: Served) -> None:
    job = served.submit("one")
    served.wait_started("one")
    r = wsctl(served.url, "get", "job", job)
    # the job's row, then what fault recovery has done in it
    assert r.returncode == 0 and [row[0] for row in rows(r.stdout)] == ["NAME", job, "RESTARTS", "WORKERS"], (
        r.stdout
    )
    assert "RESTARTS   0\nWORKERS    1 of 1\n" in r.stdout, r.stdout
    info = json.loads(wsctl(served.url, "get", "job", job, "-o", "json").stdout)
    assert info["id"] == job and info["user"] == USER and info["status"] == "running"
    assert info["duration_s"] >= 0 and [h["status"] for h in info["history"]] == ["queued", "running"]
    assert (
        yaml.safe_load(wsctl(served.url, "get", "job", job, "-o", "yaml").stdout)["params"] == info["params"]
    )
    r = wsctl(served.url, "get", "job", "nope")
    assert r.returncode == 2 and "no job 'nope'" in r.stderr and "404" in r.stderr


def test_cancel_job(served: Served) -> None:
    job = served.submit("a")
    served.wait_started("a")
    queued = served.submit("b")
    r = wsctl(served.url, "cancel", "job", queued)
    assert r.returncode == 0 and r.stdout.strip() == f"{queued} cancelled", r.stderr
    r = wsctl(served.url, "cancel", "job", queued)
    assert r.returncode == 2 and "cannot become cancelled" in r.stderr
    assert wsctl(served.url, "cancel", "job", job).returncode == 0
    wait_until(
        lambda: served.service.store.get(job).status == "cancelled", lambda: "the cancel of a running job"
    )


def test_label_job_sets_and_removes_labels_shown_in_the_labels_column(served: Served) -> None:
    job = served.submit("l")
    r = wsctl(served.url, "label", "job", job, "team=x", "note=two words")
    assert r.returncode == 0, r.stderr
    assert rows(r.stdout) == [["NAME", "LABELS"], [job, "name=l,note=two words,team=x"]]
    got = {row[0]: row[-1] for row in rows(wsctl(served.url, "get", "jobs").stdout)[1:]}
    assert got[job] == "name=l,note=two words,team=x"
    r = wsctl(served.url, "label", "job", job, "team-", "note-")
    assert r.returncode == 0 and rows(r.stdout)[1] == [job, "name=l"], r.stderr
    assert served.service.store.get(job).labels == {"name": "l"}
    # the service's rules, as at submission: a key of 257 characters is a 422, and nothing changes
    r = wsctl(served.url, "label", "job", job, f"{'k' * 257}=v")
    assert r.returncode == 2 and "invalid_request" in r.stderr and "422" in r.stderr
    r = wsctl(served.url, "label", "job", job, "nonsense")
    assert r.returncode == 2 and "is not key=value" in r.stderr
    assert served.service.store.get(job).labels == {"name": "l"}
    assert wsctl(served.url, "label", "job", "nope", "a=b").returncode == 2


def test_a_label_that_would_break_the_line_is_shown_escaped(served: Served) -> None:
    job = served.submit("esc", note="two\nlines\x1b[31m")
    out = wsctl(served.url, "get", "jobs").stdout
    assert len(out.splitlines()) == 2 and "note=two\\nlines\\x1b[31m" in out and "\x1b" not in out
    assert job in out


def test_job_set_priority_changes_the_order_of_queued_jobs(served: Served) -> None:
    served.submit("blocker")
    served.wait_started("blocker")
    first, second, third = (served.submit(n) for n in ("first", "second", "third"))
    assert [j.id for j in served.service.store.queue()] == [first, second, third]
    r = wsctl(served.url, "job", "set-priority", third, "p1")
    assert r.returncode == 0 and rows(r.stdout)[1] == [third, "QUEUED", "p1"], r.stderr
    assert wsctl(served.url, "job", "set-priority", first, "3").returncode == 0  # plain digits too
    assert [j.id for j in served.service.store.queue()] == [third, second, first]
    r = wsctl(served.url, "job", "set-priority", second, "p4")
    assert r.returncode == 2 and "is not p1, p2 or p3" in r.stderr
    served.fleet.instant |= {"first", "second", "third"}
    served.finish("blocker")
    served.wait_started("blocker", "third", "second", "first")
    wait_until(lambda: served.service.is_terminal(first), lambda: "the last job to end")
    r = wsctl(served.url, "job", "set-priority", first, "p1")
    assert r.returncode == 2 and "409" in r.stderr and "has finished" in r.stderr


def test_log_export_writes_an_archive_with_every_log(served: Served, tmp_path: Path) -> None:
    served.fleet.instant.add("logs")
    job = served.submit("logs")
    wait_until(lambda: served.service.is_terminal(job), lambda: "the job to end")
    model_dir = Path(served.service.store.get(job).model_dir)
    (model_dir / "logs").mkdir(parents=True, exist_ok=True)
    written = {
        "run.log": b"step 1 loss 4.1\n",
        "params.yaml": b"runconfig: {}\n",
        "metrics.jsonl": b'{"step": 1}\n',
        "logs/worker-0.log": b"worker says hi\n",
        "logs/memoryx-1.log": b"memoryx says hi\n",
    }
    for name, data in written.items():
        (model_dir / name).write_bytes(data)
    (model_dir / "logs" / "worker-0.ready.json").write_text("{}")  # not a log
    where = tmp_path / "out"
    where.mkdir()
    out = where / "logs.tar.gz"
    out.write_bytes(b"an older export")  # replaced whole
    r = wsctl(served.url, "log-export", job, "-o", str(out))
    assert r.returncode == 0 and r.stdout.strip() == str(out), r.stderr
    with tarfile.open(out) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert got == {f"{job}/{name}": data for name, data in written.items()}
    assert [p.name for p in where.iterdir()] == ["logs.tar.gz"]  # no temporary file left

    # into a directory: <id>-logs.tar.gz there; an unknown job: exit 2, and nothing written
    r = wsctl(served.url, "log-export", job, "-o", str(where))
    assert r.returncode == 0 and (where / f"{job}-logs.tar.gz").is_file(), r.stderr
    r = wsctl(served.url, "log-export", "nope", "-o", str(out))
    assert r.returncode == 2 and "no job 'nope'" in r.stderr
    assert sorted(p.name for p in where.iterdir()) == sorted(["logs.tar.gz", f"{job}-logs.tar.gz"])
    with tarfile.open(out) as tar:
        assert tar.getnames()[0] == f"{job}/run.log"  # the earlier export is intact


def test_log_export_of_a_job_that_never_started_says_so(served: Served, tmp_path: Path) -> None:
    served.submit("blocker")
    served.wait_started("blocker")
    queued = served.submit("waiting")
    (tmp_path / "out").mkdir()
    earlier = tmp_path / "out" / "x.tar.gz"
    earlier.write_bytes(b"an earlier export")
    r = wsctl(served.url, "log-export", queued, "-o", str(earlier))
    assert r.returncode == 2 and "has not started" in r.stderr
    # the file there is untouched (the answer went to a temporary file, removed): nothing else is left
    assert list((tmp_path / "out").iterdir()) == [earlier] and earlier.read_bytes() == b"an earlier export"


def test_config_view_names_each_source_and_never_shows_the_token() -> None:
    runner = CliRunner()
    env = {"WEIGHTSTREAM_URL": "http://svc:9000/", "WEIGHTSTREAM_TOKEN": TOKEN}
    r = runner.invoke(app, ["config", "view"], env=env)
    assert r.exit_code == 0, r.output
    assert "http://svc:9000  (from $WEIGHTSTREAM_URL)" in r.output
    assert f"({len(TOKEN)} characters, from $WEIGHTSTREAM_TOKEN)" in r.output
    assert TOKEN not in r.output and TOKEN[-4:] not in r.output
    r = runner.invoke(app, ["config", "view", "--url", "http://other:1"], env=env)
    assert "http://other:1  (from --url)" in r.output
    r = runner.invoke(app, ["config", "view"], env={"WEIGHTSTREAM_URL": "", "WEIGHTSTREAM_TOKEN": ""})
    assert "http://127.0.0.1:8080  (the default)" in r.output and "token:  not set" in r.output


def test_dashboard_prints_the_url_with_the_token_and_opens_it(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []

    def open_(url: str) -> bool:
        opened.append(url)
        return True

    monkeypatch.setattr("webbrowser.open", open_)
    env = {"WEIGHTSTREAM_URL": "http://svc:9000/", "WEIGHTSTREAM_TOKEN": "t/k+n"}
    r = CliRunner().invoke(app, ["dashboard"], env=env)
    assert r.exit_code == 0 and r.output == "http://svc:9000/#token=t%2Fk%2Bn\n" and opened == []
    r = CliRunner().invoke(app, ["dashboard", "--open"], env=env)
    assert r.exit_code == 0 and opened == ["http://svc:9000/#token=t%2Fk%2Bn"]
    r = CliRunner().invoke(app, ["dashboard", "0123abcd4567"], env=env)  # a job's own page
    assert r.exit_code == 0 and r.output == "http://svc:9000/jobs/0123abcd4567#token=t%2Fk%2Bn\n"
    r = CliRunner().invoke(app, ["dashboard"], env={"WEIGHTSTREAM_TOKEN": ""})
    assert r.exit_code == 2 and "no API token" in r.output


def test_the_library_changes_labels_and_priority_and_exports(served: Served, tmp_path: Path) -> None:
    served.submit("blocker")
    served.wait_started("blocker")
    job_id = served.submit("lib")
    with Client(served.url, TOKEN) as client:
        job = client.job(job_id)
        assert job.set_labels({"a": "1", "b": "2"})["labels"] == {"name": "lib", "a": "1", "b": "2"}
        assert job.set_labels(remove=["a", "never-there"])["labels"] == {"name": "lib", "b": "2"}
        assert job.set_priority(1)["priority"] == 1
        served.finish("blocker")
        served.wait_started("blocker", "lib")
        served.finish("lib")
        wait_until(lambda: served.service.is_terminal(job_id), lambda: "lib to end")
        Path(served.service.store.get(job_id).model_dir, "run.log").write_text("hello\n")
        path = job.export_logs(tmp_path / "lib.tar.gz")
    with tarfile.open(path) as tar:
        assert tar.extractfile(f"{job_id}/run.log").read() == b"hello\n"  # type: ignore[union-attr]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_serve_records_its_user_name_on_every_job(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve --user-name bob`, or WEIGHTSTREAM_USER_NAME=bob (how the Helm chart's userName arrives)."""
    if how == "env":
        monkeypatch.setenv("WEIGHTSTREAM_USER_NAME", "bob")  # the serve process inherits the environment
    args = ("--user-name", "bob") if how == "flag" else ()
    served = ServeProcess(tmp_path / "data", tmp_path / "serve.log", *args)
    try:
        with Client(served.url, TOKEN) as client:
            job = client.submit(copy.deepcopy(TINY), 1)
        row = dict(zip(JOB_COLUMNS, rows(wsctl(served.url, "get", "job", job.id).stdout)[1], strict=True))
        assert row["USER"] == "bob"
    finally:
        served.stop()


def test_the_default_user_is_the_os_user(tmp_path: Path) -> None:
    with LiveApi(tmp_path / "data") as live:
        assert live.finished_job().user == getpass.getuser()


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0s"),
        (119, "119s"),
        (130, "2m10s"),
        (600, "10m"),
        (3 * 3600 + 59, "3h"),
        (5 * 3600 + 120, "5h2m"),
        (20 * 3600, "20h"),
        (3 * 86400 + 4 * 3600, "3d4h"),
        (12 * 86400, "12d"),
        (-5, "0s"),
    ],
)
def test_ages_and_durations_read_as_kubectl_shows_them(seconds: float, shown: str) -> None:
    assert human_duration(seconds) == shown


def test_a_table_is_fixed_columns_without_trailing_spaces() -> None:
    text = table(("A", "BB"), [["xxxx", "y"], ["z", cell("")]])
    assert text == "A      BB\nxxxx   y\nz      -\n"
    assert cell("a\tb\x07") == "a\\tb\\x07"


@pytest.mark.parametrize("verb", ["get", "cancel"])
def test_the_earlier_verb_forms_say_what_to_type_now(verb: str) -> None:
    """`wsctl get ID` and `wsctl cancel ID` were the verbs before csctl's nouns: exit 2 with the new form
    (nothing is sent: no server is listening on that port)."""
    r = wsctl("http://127.0.0.1:9", verb, "abc123")
    assert r.returncode == 2, r.stderr
    assert f"wsctl {verb} job abc123" in r.stderr


def test_get_shows_the_model_density_of_sparse_and_dense_jobs(served: Served) -> None:
    """DENSITY (and ``density``/``num_parameters`` in the JSON): what the params' sparsity block makes
    of the model, 100% for a dense one."""
    served.fleet.instant.add("dense")
    dense = served.submit("dense")
    sparse_params = {
        **copy.deepcopy(TINY),
        "sparsity": {"sparsity": 0.9, "param_filter": "*.mlp.c_fc.weight"},
    }
    served.fleet.instant.add("sparse")
    sparse = served.service.submit(sparse_params, 1, {"name": "sparse"}, 2).id
    table_rows = rows(wsctl(served.url, "get", "jobs").stdout)
    by_id = {row[0]: dict(zip(JOB_COLUMNS, row, strict=True)) for row in table_rows[1:]}
    listed = {j["id"]: j for j in json.loads(wsctl(served.url, "get", "jobs", "-o", "json").stdout)}
    assert listed[dense]["density"] == 1.0 and by_id[dense]["DENSITY"] == "100%"
    n = listed[sparse]["num_parameters"]
    assert n == listed[dense]["num_parameters"] and n == 19_712  # TINY's weights
    pruned = 2 * (32 * 64 - kept_count(32 * 64, 0.9))  # two c_fc weights [32, 64], 10% kept each
    assert listed[sparse]["density"] == pytest.approx(1 - pruned / n)
    assert by_id[sparse]["DENSITY"] == f"{100 * (1 - pruned / n):.3g}%"


def test_jobs_and_get_jobs_are_one_listing_with_times_in_iso_utc(served: Served) -> None:
    """`wsctl jobs` is `wsctl get jobs` (one code path, the same columns and filters), and -o yaml|json
    shows a job's times as ISO 8601 UTC while the REST API keeps its seconds since the epoch."""
    served.fleet.instant.add("done")
    done = served.submit("done")
    served.wait_started("done")
    wait_until(lambda: served.service.is_terminal(done), lambda: "done to finish")
    served.submit("running", team="b")
    served.wait_started("done", "running")

    def without_times(stdout: str) -> list[list[str]]:  # AGE and DURATION move on between two calls
        return [[c for i, c in enumerate(row) if i not in (1, 2)] for row in rows(stdout)]

    for args in ([], ["--label", "team=b"], ["--status", "succeeded"], ["--active"]):
        short, long = wsctl(served.url, "jobs", *args), wsctl(served.url, "get", "jobs", *args)
        assert short.returncode == long.returncode == 0, short.stderr + long.stderr
        assert without_times(short.stdout) == without_times(long.stdout), args
    assert [r[0] for r in rows(wsctl(served.url, "jobs", "--status", "succeeded").stdout)[1:]] == [done]
    assert rows(wsctl(served.url, "jobs").stdout)[0] == list(JOB_COLUMNS)

    with served.http() as http:
        api = http.get(f"/v1/jobs/{done}").json()
    assert isinstance(api["created_at"], float)  # the API's schema: seconds since the epoch
    for fmt, load in (("yaml", yaml.safe_load), ("json", json.loads)):
        shown = load(wsctl(served.url, "get", "job", done, "-o", fmt).stdout)
        for got, want in [
            (shown["created_at"], api["created_at"]),
            (shown["updated_at"], api["updated_at"]),
            *((h["at"], a["at"]) for h, a in zip(shown["history"], api["history"], strict=True)),
        ]:
            assert isinstance(got, str) and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", got), got
            parsed = datetime.fromisoformat(got.replace("Z", "+00:00"))
            assert parsed.tzinfo == UTC and abs(parsed.timestamp() - want) < 1e-3
        listed = load(wsctl(served.url, "get", "jobs", "-o", fmt).stdout)
        assert {j["id"]: j["created_at"] for j in listed}[done] == shown["created_at"]
