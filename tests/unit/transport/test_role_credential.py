"""The pieces of the role plane's protection, without processes: tokens, confinement, inherited secrets."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from weightstream.backends.environment import without_secrets
from weightstream.checkpoint_layout import checkpoint_dir, confine_checkpoint, partial_dir_path
from weightstream.plan import JobSpec
from weightstream.transport.auth import RoleAuthInterceptor, has_credential, new_role_token, read_token


def test_tokens_are_fresh_256_bit_hex() -> None:
    a, b = new_role_token(), new_role_token()
    assert a != b and len(a) == 64 and int(a, 16) >= 0


def test_read_token_from_a_file_or_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = new_role_token()
    f = tmp_path / "token"
    f.write_text(token + "\n")
    assert read_token(str(f)) == token
    monkeypatch.setattr("sys.stdin", io.StringIO(token + "\n"))
    assert read_token("-") == token
    f.write_text("not-a-token")
    with pytest.raises(ValueError, match="64 hex digits"):
        read_token(str(f))


def test_credential_check_is_exact_and_never_accepts_an_empty_token() -> None:
    token = new_role_token()
    assert has_credential([("x-weightstream-role-token", token)], token)
    assert not has_credential([("x-weightstream-role-token", token[:-1])], token)
    assert not has_credential([("authorization", token)], token)
    assert not has_credential(None, token)
    with pytest.raises(ValueError):
        RoleAuthInterceptor("")  # an empty token would accept a call that sends none


def test_the_credential_never_travels_in_the_job_json() -> None:
    job = JobSpec({}, {}, {}, "worker", 0, credential=new_role_token())
    text = job.to_json()
    assert job.credential not in text and "credential" not in text
    assert JobSpec.from_json(text).credential == ""
    assert job.credential not in repr(job)


def test_checkpoints_are_confined_to_the_jobs_own_directory(tmp_path: Path) -> None:
    model_dir = tmp_path / "jobs" / "a"
    other = tmp_path / "jobs" / "b"
    for d in (partial_dir_path(model_dir, 5), checkpoint_dir(model_dir, 4), checkpoint_dir(other, 4)):
        d.mkdir(parents=True)
    assert (
        confine_checkpoint(model_dir, partial_dir_path(model_dir, 5), 5)
        == partial_dir_path(model_dir, 5).resolve()
    )
    assert (
        confine_checkpoint(model_dir, checkpoint_dir(model_dir, 4)) == checkpoint_dir(model_dir, 4).resolve()
    )
    refused = [
        (partial_dir_path(model_dir, 5), 6),  # another step's
        (model_dir, 5),
        (tmp_path, 5),
        (model_dir / ".." / "b" / ".checkpoint_5.partial", 5),
        (checkpoint_dir(other, 4), None),  # another job's checkpoint
        (model_dir / "checkpoint_4" / "..", None),
        (Path("/etc"), None),
    ]
    for directory, step in refused:
        with pytest.raises(PermissionError, match="is not"):
            confine_checkpoint(model_dir, directory, step)
    link = model_dir / "checkpoint_9"  # looks like one, leads out
    os.symlink(checkpoint_dir(other, 4), link)
    with pytest.raises(PermissionError):
        confine_checkpoint(model_dir, link)


def test_roles_inherit_no_secrets() -> None:
    env = {
        "PATH": "/bin",
        "HOME": "/root",
        "WEIGHTSTREAM_TOKEN": "t",
        "AWS_SECRET_ACCESS_KEY": "s",
        "GITHUB_TOKEN": "g",
        "DB_PASSWORD": "p",
        "OPENAI_API_KEY": "k",
        "OMP_NUM_THREADS": "1",
    }
    assert without_secrets(env) == {"PATH": "/bin", "HOME": "/root", "OMP_NUM_THREADS": "1"}
