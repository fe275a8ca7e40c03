"""A node with CURVE keys and a Zyre node with CURVE (zyre_set_zcert) on a simulated LAN.

The Zyre side is ``zpinger --curve`` from Zyre's own source, built with its
draft API (``cmake -DENABLE_DRAFTS=ON``, against libczmq-dev): it admits
any key, whispers "Hello" to every peer that ENTERs and shouts "Hello" to
GLOBAL for every whisper it gets. Zyre does not beacon on ``lo``, so both
run in network namespaces (``tests/netlab.py``: root and ``ip``). Skipped
with the reason when either is missing; name the binary with
``PEERMESH_ZPINGER`` when it is not on ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

try:
    from . import lanpeers, netlab
except ImportError:
    import lanpeers
    import netlab

sys.path.insert(0, str(Path(__file__).resolve().parent))
from curvemesh import KeyRing  # noqa: E402

pytestmark = pytest.mark.lan

ZPINGER = os.environ.get("PEERMESH_ZPINGER") or shutil.which("zpinger")
ZYRE_WAIT = 20.0  # Zyre beacons once a second; its HELLO follows the first one heard


@pytest.fixture
def fleet(lan_factory: Callable[..., netlab.Lan]) -> Iterator[lanpeers.Fleet]:
    fleet = lanpeers.Fleet()
    try:
        yield fleet
    finally:
        fleet.close()


@pytest.mark.skipif(ZPINGER is None, reason="Zyre's zpinger (built with -DENABLE_DRAFTS=ON for "
                    "CURVE) is not on PATH and PEERMESH_ZPINGER is not set")
def test_zyre_with_curve_and_a_node_with_keys_talk(lan_factory: Callable[..., netlab.Lan],
                                                   fleet: lanpeers.Fleet,
                                                   tmp_path: Path) -> None:
    assert ZPINGER is not None
    lan = lan_factory(2)
    ours, theirs = lan.hosts
    ring = KeyRing(tmp_path)
    node = fleet.start(ours, name="pm", groups=["GLOBAL"],
                       env={"PEERMESH_KEY_FILE": ring.secret("pm")})
    with open(tmp_path / "zpinger.log", "wb") as log:
        theirs.popen([ZPINGER, "--curve", "--verbose", "--interface", theirs.interface],
                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        enter = node.wait(lanpeers.match("ENTER"), ZYRE_WAIT)
        zyre = enter["peer"]
        assert enter["address"].startswith(f"tcp://{theirs.address}:")
        assert len(enter["headers"]["X-PUBLICKEY"]) == 40
        hello = node.wait(lanpeers.match("WHISPER", peer=zyre), ZYRE_WAIT)
        assert hello["message"] == "Hello"
        node.call("whisper", peer=zyre, msg="ping")
        shout = node.wait(lanpeers.match("SHOUT", peer=zyre, group="GLOBAL"), ZYRE_WAIT)
        assert shout["message"] == "Hello"
    except lanpeers.DriverError:
        print((tmp_path / "zpinger.log").read_text(errors="replace")[-4000:])
        raise
