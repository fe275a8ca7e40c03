"""``peermesh mtl gateway`` as a real process, with ``peermesh mtl write``/``read`` through it."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from cliprocess import Cli
from peermesh.mtl.commands import MTL_KEYS, load_mtl_table

REPO = Path(__file__).resolve().parents[2]


def test_write_and_read_through_a_gateway_the_command_started(cli: Cli, tmp_path: Path) -> None:
    credentials, password = tmp_path / "users.json", tmp_path / "pw"
    password.write_text("wonderland\n")
    added = cli.call("mtl", "user", "add", "alice", "--read", "chat", "--write", "chat",
                     "--password-file", str(password), "--credentials", str(credentials),
                     net=False)
    assert added.returncode == 0, added.stderr

    gateway = cli.start("mtl", "gateway", "--run", "always", "--credentials", str(credentials),
                        "--data-dir", str(tmp_path / "data"))
    ready = gateway.expect_event(event="ready")
    assert ready["control"].startswith("tcp://127.0.0.1:") and ready["run"] == "always"
    assert Path(ready["store"]).parent == tmp_path / "data"
    client = ["-g", ready["control"], "-u", "alice", "--password-file", str(password),
              "--confirm", "full"]

    wrote = cli.call("mtl", "write", "chat", "hello from afar", *client, net=False)
    assert wrote.returncode == 0 and "all stored" in wrote.stderr, wrote.stderr
    read = cli.call("mtl", "read", "chat", "--count", "1", "--json", *client, net=False)
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout)["body"] == "hello from afar"

    assert gateway.stop(signal.SIGTERM) == 0
    assert "Traceback" not in "\n".join(gateway.err)


def test_an_elected_gateway_says_when_it_serves(cli: Cli, tmp_path: Path) -> None:
    gateway = cli.start("mtl", "gateway", "--credentials", str(tmp_path / "none.json"),
                        "--data-dir", str(tmp_path))
    ready = gateway.expect_event(event="ready")
    assert ready["run"] == "elected"
    assert gateway.expect_event(event="serving")["control"] == ready["control"]
    gateway.expect_line(lambda line: "no users in" in line, "the warning", "err")
    assert gateway.stop(signal.SIGINT) == 0


@pytest.mark.parametrize("args, message", [
    (("--control-port", "70000"), "'70000' is not a port"),
    (("--vhost", "noequals"), "is not NAME=PREFIX"),
    (("--run", "sometimes"), "invalid choice: 'sometimes'"),
    (("--address", "192.0.2.1"), "cannot bind an ephemeral port on 192.0.2.1"),
])
def test_misuse_gets_a_clear_message(cli: Cli, tmp_path: Path, args: tuple[str, ...],
                                     message: str) -> None:
    done = cli.call("mtl", "gateway", "--credentials", str(tmp_path / "u.json"),
                    "--data-dir", str(tmp_path), *args)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_the_mtl_table_is_checked_and_documented(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[mtl]\nrun = "sometimes"\n')
    done = cli.call("mtl", "gateway", "--config", str(bad))
    assert done.returncode == 2 and "[mtl] run must be always or elected" in done.stderr
    bad.write_text('[mtl]\nport = 1\n')
    done = cli.call("mtl", "gateway", "--config", str(bad))
    assert done.returncode == 2 and "[mtl] has unknown key(s) port" in done.stderr

    text = (REPO / "deploy" / "peermesh.example.toml").read_text()
    section = text[text.index("# [mtl]"):text.index("# NFP jobs")]
    lines = [line[2:] for line in section.splitlines()
             if line == "# [mtl]" or any(line.startswith(f"# {key} = ") for key in MTL_KEYS)]
    enabled = tmp_path / "enabled.toml"
    enabled.write_text("\n".join(lines) + "\n")
    assert set(load_mtl_table(enabled)) == set(MTL_KEYS)
