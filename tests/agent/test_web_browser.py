"""The web view in a real headless Chromium (Debian's ``chromium``): the page loads,
shows the peers as they ENTER (how soon is measured by ``scripts/bench_web.py``),
removes one after its EXIT, shows a peer's details, draws a Flux instance's tree, and
logs no console error. Skipped, with the reason, where Chromium is missing."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from childprocs import in_group
from cliprocess import WAIT

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "scripts"))

from chromium import Chromium  # noqa: E402
from test_web import Agent, flux_instance  # noqa: E402

PEERS = 4
DRAWN = "document.querySelectorAll('#peers g[data-peer]').length"


def test_a_closed_browser_leaves_no_process_and_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chromium's helpers and its files in the temporary directory (its profile, its
    singleton socket's directory) are gone once ``close`` returns."""
    reason = Chromium.available()
    if reason is not None:
        pytest.skip(reason)
    # a short path: Chromium's singleton socket lives under it (108 octets for its path)
    scratch = Path(tempfile.mkdtemp(prefix="pm-chromium-test-"))
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(scratch))
        with Chromium() as chromium:
            assert chromium.evaluate("1 + 1") == 2
            assert len(in_group(chromium.proc.pid)) > 1  # the browser and its helpers
        assert in_group(chromium.proc.pid) == [] and list(scratch.iterdir()) == []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def browser() -> Any:
    reason = Chromium.available()
    if reason is not None:
        pytest.skip(reason)
    with Chromium() as chromium:
        yield chromium


@pytest.mark.slow
def test_page_follows_the_mesh(browser: Chromium, free_udp_port: int, tmp_path: Path) -> None:
    agent = Agent(free_udp_port, tmp_path, "127.0.0.1:0")
    try:
        browser.open(agent.base + "/")
        browser.wait_for("window.peermeshView && peermeshView.snapshots > 0", WAIT)
        assert browser.evaluate("document.getElementById('node-name').textContent") == "alice"
        assert browser.evaluate(DRAWN) == 0

        peers = []
        for i in range(PEERS):   # one by one: a starting interpreter takes a core
            peers.append(agent.peer(f"p{i}"))
            browser.wait_for(f"{DRAWN} === {i + 1}", WAIT)
        labels = browser.evaluate(
            "Array.from(document.querySelectorAll('#peers g[data-peer] text'))"
            ".map(t => t.textContent).filter(Boolean).sort()")
        assert labels == [f"p{i}" for i in range(PEERS)]
        lags = browser.evaluate("Object.values(peermeshView.enterLag)")
        print(f"ENTER at the agent to drawn in the page: {sorted(round(x) for x in lags)} ms")
        assert len(lags) == PEERS and max(lags) < 1000, lags

        gone = peers[0]
        assert gone.stop(signal.SIGTERM) == 0
        browser.wait_for(f"{DRAWN} === {PEERS - 1}", WAIT)
        labels = browser.evaluate(
            "Array.from(document.querySelectorAll('#peers g[data-peer] text'))"
            ".map(t => t.textContent)")
        assert "p0" not in labels
        assert browser.evaluate("document.querySelector('#events .kind.EXIT') !== null")

        browser.evaluate("document.querySelector('#peers g[data-peer]')"
                         ".dispatchEvent(new MouseEvent('click', {bubbles: true}))")
        details = browser.evaluate("document.getElementById('details').textContent")
        assert "UUID" in details and "chat" in details
        browser.pump(0.2)
        assert browser.errors == []
    finally:
        agent.close()


@pytest.mark.slow
def test_page_draws_the_flux_tree(browser: Chromium, free_udp_port: int,
                                  tmp_path: Path) -> None:
    agent = Agent(free_udp_port, tmp_path, "127.0.0.1:0")
    try:
        with flux_instance(free_udp_port, 3):
            browser.open(agent.base + "/")
            browser.wait_for("document.querySelectorAll('#flux-trees g.rank.online')"
                             ".length === 3", WAIT)
            edges = browser.evaluate(
                "Array.from(document.querySelectorAll('#flux-trees line.tree-edge'))"
                ".map(l => [+l.dataset.parent, +l.dataset.child]).sort()")
            assert edges == [[0, 1], [0, 2]]
            assert not browser.evaluate("document.getElementById('flux-pane').hidden")
            assert browser.evaluate("peermeshView.trees.webtree.length") == 3
            browser.pump(0.2)
            assert browser.errors == []
    finally:
        agent.close()
