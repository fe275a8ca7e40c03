"""The CLI with CURVE keys: ``run --key-file --allowed-keys`` and SIGHUP re-reading the keys."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path
from uuid import UUID

import pytest

from cliprocess import Cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zre"))
from curvemesh import KeyRing, Nodes, hear_beacons  # noqa: E402


def test_sighup_rereads_the_allowed_keys(free_udp_port: int, tmp_path: Path) -> None:
    ring = KeyRing(tmp_path)
    allowed = ring.allow("allowed", "alice")
    cli = Cli(free_udp_port)
    nodes = Nodes(free_udp_port, ring)
    try:
        alice = cli.start("run", "--name", "alice", "--json", "--key-file",
                          ring.secret("alice"), "--allowed-keys", allowed, "--evasive", "0.5")
        _, alice_uuid = alice.started()
        bob = nodes.start("bob", evasive=0.5)
        stamp = os.stat(allowed).st_mtime_ns
        shutil.copy(tmp_path / "bob.key", Path(allowed) / "bob.key")
        os.utime(allowed, ns=(stamp, stamp))  # unnoticed until the signal
        hear_beacons(free_udp_port, [bob.uuid])
        assert UUID(alice_uuid) not in bob.peers()  # alice refused bob's key so far
        alice.popen.send_signal(signal.SIGHUP)
        alice.expect_event(event="ENTER", name="bob")
        assert alice.stop(signal.SIGTERM) == 0
    finally:
        nodes.stop()
        cli.close()


def test_run_with_a_missing_key_file_says_so(free_udp_port: int, tmp_path: Path) -> None:
    result = Cli(free_udp_port).call("run", "--key-file", str(tmp_path / "none_secret"))
    assert result.returncode != 0
    assert f"no key file at {tmp_path / 'none_secret'}" in result.stderr


def test_sighup_to_a_plain_node_is_harmless(free_udp_port: int) -> None:
    cli = Cli(free_udp_port)
    try:
        node = cli.start("run", "--name", "plain", "-v")
        node.started()
        node.popen.send_signal(signal.SIGHUP)
        node.expect_line(lambda line: "no allowed keys to reload" in line, "the SIGHUP note",
                         "err")
        assert node.stop(signal.SIGTERM) == 0
    finally:
        cli.close()
