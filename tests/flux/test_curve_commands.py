"""``peermesh flux`` through ``--parent`` on an instance on keys: ``--key-file`` (the command's
or member's own keypair) and ``--server-key`` (the public certificate of each member given),
as real processes on loopback."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from cliprocess import Cli, _report

from .test_commands import member

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zre"))
from curvemesh import KeyRing  # noqa: E402


def test_commands_and_members_reach_a_keyed_instance_through_parent(
        tmp_path: Path, free_udp_port: int) -> None:
    ring = KeyRing(tmp_path)
    allowed = ring.allow("allowed", "root", "one", "tool")
    ring.make("stranger")
    root_key = str(tmp_path / "root.key")
    cli = Cli(free_udp_port)

    def keyed(name: str) -> tuple[str, ...]:
        return ("--key-file", ring.secret(name), "--allowed-keys", allowed)

    def flux(*args: str) -> Any:
        return cli.call("flux", *args, "--parent", endpoint, "--wait", "2", "--timeout", "2")

    try:
        _, endpoint = member(cli, "--root", *keyed("root"))
        one, _ = member(cli, "--parent", endpoint, "--server-key", root_key, *keyed("one"))

        result = cli.call("flux", "ping", "-c", "1", "1", "--parent", endpoint, "--server-key",
                          root_key, "--key-file", ring.secret("tool"), "--json")
        assert result.returncode == 0, _report(result)
        assert [p["rank"] for p in json.loads(result.stdout)["pings"]] == [1]
        result = cli.call("flux", "tree", "--json", "--parent", endpoint, "--server-key",
                          root_key, "--key-file", ring.secret("tool"))
        assert [row["rank"] for row in json.loads(result.stdout)] == [0, 1], _report(result)

        # a key the instance does not admit gets no answer
        result = flux("ping", "-c", "1", "0", "--server-key", root_key, "--key-file",
                      ring.secret("stranger"))
        assert result.returncode == 1 and "could not connect" in result.stderr, _report(result)

        # misuse is named
        for args, code, message in [
                (("--key-file", ring.secret("tool")), 2, "needs --server-key"),
                (("--server-key", root_key, "--server-key", root_key), 2,
                 "once per --parent"),
                (("--server-key", str(tmp_path / "missing.key")), 2, "no key file at"),
                (("--server-key", str(tmp_path / "allowed")), 2, "is a directory")]:
            result = flux("ping", "-c", "1", "0", *args)
            assert result.returncode == code and message in result.stderr, _report(result)
        (tmp_path / "junk.key").write_text("not a certificate\n")
        result = flux("ping", "-c", "1", "0", "--server-key", str(tmp_path / "junk.key"))
        assert result.returncode == 2 and "is not a certificate" in result.stderr, \
            _report(result)
        result = cli.call("flux", "ping", "-c", "1", "0", "--server-key", root_key,
                          "--wait", "1")
        assert result.returncode == 2 and "--server-key goes with --parent" in result.stderr, \
            _report(result)
        result = cli.call("flux", "run", "--parent", endpoint, "--server-key", root_key)
        assert result.returncode == 2 and "needs --key-file" in result.stderr, _report(result)
    finally:
        cli.close()
