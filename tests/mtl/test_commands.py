"""``peermesh mtl user add|remove|list`` through the command's entry point and as a process."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peermesh.cli.commands import main
from peermesh.mtl.credentials import Authenticator, CredentialsFile

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    """``run(*args, stdin="")``: (exit code, stdout, stderr) of ``peermesh ARGS`` run in this
    process, with a private data directory and no terminal."""
    for key in list(os.environ):
        if key.startswith("PEERMESH_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("PEERMESH_DATA_DIR", str(tmp_path / "data"))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def call(*args: str, stdin: str = "") -> tuple[int, str, str]:
        import io

        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        try:
            code = main(list(args))
        except SystemExit as exc:     # argparse's usage errors
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        return code, out, err

    try:
        yield call
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_add_list_remove(run: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "data" / "mtl-credentials.json"
    code, _, err = run("mtl", "user", "add", "alice", "--read", "chat", "--read", "sensors.*",
                       "--write", "chat", "--password-file", "-", stdin="s3cret\n")
    assert code == 0 and f"added user alice in {path}" in err
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and "s3cret" not in path.read_text()
    monkeypatch.setenv("BOT_PASSWORD", "bot pw")
    assert run("mtl", "user", "add", "bot", "-w", "jobs.*", "--expires", "2999-01-01",
               "--password-env", "BOT_PASSWORD")[0] == 0
    monkeypatch.setenv("PEERMESH_MTL_PASSWORD", "new")
    code, _, err = run("mtl", "user", "add", "alice", "--replace", "--read", "*")
    assert code == 0 and "replaced user alice" in err

    code, out, _ = run("mtl", "user", "list", "--json")
    assert code == 0 and json.loads(out) == [
        {"name": "alice", "read": ["*"], "write": [], "expires": None, "expired": False,
         "iterations": 4096},
        {"name": "bot", "read": [], "write": ["jobs.*"], "expires": "2999-01-01T00:00:00Z",
         "expired": False, "iterations": 4096}]
    code, out, _ = run("mtl", "user", "list")
    assert out.splitlines() == ["USER   READ  WRITE   EXPIRES",
                                "alice  *     -       never",
                                "bot    -     jobs.*  2999-01-01T00:00:00Z"]

    # what the command wrote authenticates
    auth = Authenticator(CredentialsFile(path), mechanisms=("PLAIN",))
    step = auth.begin("PLAIN", "cli", 0.0).respond(b"\0alice\0new", 0.0)
    assert step.user is not None and step.user.may_read("anything")

    code, _, err = run("mtl", "user", "remove", "bot")
    assert code == 0 and "removed user bot" in err
    assert list(CredentialsFile(path).users) == ["alice"]


def test_an_empty_or_missing_file_lists_no_users(run: Any, tmp_path: Path) -> None:
    code, out, err = run("mtl", "user", "list")
    assert code == 0 and out == "" and "no users in" in err
    code, out, _ = run("mtl", "user", "list", "--json", "-c", str(tmp_path / "none.json"))
    assert code == 0 and json.loads(out) == []


@pytest.mark.parametrize("args, stdin, code, message", [
    (("mtl", "user", "add", "carol"), "", 2, "no password: standard input is not a terminal"),
    (("mtl", "user", "add", "carol", "--password-file", "-"), "\n", 2,
     "the first line of standard input is empty"),
    (("mtl", "user", "add", "carol", "--password-file", "/nonexistent/pw"), "", 2,
     "cannot read the password file /nonexistent/pw"),
    (("mtl", "user", "add", "carol", "--password-env", "UNSET_VARIABLE"), "", 2,
     "$UNSET_VARIABLE is not set or empty"),
    (("mtl", "user", "add", "carol", "--password-file", "-", "--password-env", "X"), "", 2,
     "not allowed with argument"),
    (("mtl", "user", "add", "a\tb", "--password-file", "-"), "pw\n", 2,
     "must be 1..255 printable characters"),
    (("mtl", "user", "add", "carol", "--read", "", "--password-file", "-"), "pw\n", 2,
     "must not be empty"),
    (("mtl", "user", "add", "carol", "--iterations", "10", "--password-file", "-"), "pw\n",
     2, "--iterations must be 4096..10000000"),
    (("mtl", "user", "add", "carol", "--expires", "2001-01-01"), "", 2, "has passed already"),
    (("mtl", "user", "add", "carol", "--expires", "soon"), "", 2, "is not an ISO 8601 time"),
    (("mtl", "user", "remove", "nobody"), "", 1, "no user 'nobody' in"),
    (("mtl", "user"), "", 2, "required: ACTION"),
])
def test_misuse_gets_a_clear_message(run: Any, args: tuple[str, ...], stdin: str, code: int,
                                     message: str) -> None:
    got, _, err = run(*args, stdin=stdin)
    assert got == code and message in err, err


def test_adding_an_existing_user_needs_replace(run: Any) -> None:
    assert run("mtl", "user", "add", "dave", "--password-file", "-", stdin="one\n")[0] == 0
    code, _, err = run("mtl", "user", "add", "dave", "--password-file", "-", stdin="two\n")
    assert code == 2 and "user 'dave' exists" in err and "--replace" in err


def test_a_broken_credentials_file_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"peermesh-mtl-credentials": 1, "users": {"x": {"read": "all"}}}')
    broken.chmod(0o600)      # (else a warning that others may read it comes first)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PEERMESH_")},
           "PYTHONPATH": str(REPO), "PEERMESH_MTL_CREDENTIALS": str(broken)}
    for args in (["list"], ["remove", "x"]):
        done = subprocess.run([sys.executable, "-m", "peermesh", "mtl", "user", *args],
                              capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 1, done.stderr
        assert done.stderr.startswith(f"peermesh: error: credentials file {broken}: user 'x':")
        assert "Traceback" not in done.stderr
    done = subprocess.run([sys.executable, "-m", "peermesh", "mtl", "user", "add", "eve",
                           "--password-file", "-", "--credentials", str(tmp_path / "ok.json")],
                          input="pw\n", capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0 and "added user eve" in done.stderr
