#!/usr/bin/env python3
"""The agent's web view with many peers, in headless Chromium: time to first paint and
update latency.

    python scripts/bench_web.py                       # 1,000 simulated peers
    python scripts/bench_web.py --peers 200 --churn 5
    python scripts/bench_web.py --peers 20 --screenshot docs/img/web-view.png

A child process runs one observed node and N peers on the simulated network
(``peermesh.sim``, real ``Node`` objects) with the observed node's
``WebView`` on a loopback port; virtual time follows the wall clock. Peers
hear only the observed node's beacons (a star, so N peers cost N handshakes,
not N*N). Peers are spread over a few groups; a few are broker candidates
and members of a Flux instance. The parent opens the page in headless
Chromium (``scripts/chromium.py``) and reports:

* **first paint**: the browser's first contentful paint, and the moment the
  page drew the whole mesh (``mesh-drawn``), in ms after navigation start;
* **update latency**: during ``--churn`` seconds, peers join and leave a
  group at ``--rate`` events a second; for each, the time from the event at
  the node to the page having drawn it (median, p95, max);
* **responsiveness**: the round trip of a trivial script evaluation in the
  page during the churn (median, max): how long the page keeps its main
  thread busy.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import harness
from harness import Children, Parent, dump_json, percentile, progress, table

from chromium import Chromium

GROUPS = ("web", "db", "cache", "batch", "edge")
DRAWN = "document.querySelectorAll('#peers g[data-peer]').length"


def role_mesh(parent: Parent, peers: int, seed: int = 1) -> dict[str, Any]:
    """The simulated mesh and the observed node's web view; answers churn commands."""
    import random

    import gevent

    from peermesh.agent.web import WebView
    from peermesh.config import NodeConfig
    from peermesh.sim import SimNetwork
    from peermesh.zre.node import Node

    class StarNetwork(SimNetwork):
        """Peers hear only the observed node's beacons (and it hears all of theirs)."""

        hub = ""

        def _send_beacon(self, source: str, data: bytes, host: str, port: int) -> None:
            super()._send_beacon(source, data, host if source == self.hub else self.hub,
                                 port)

    network = StarNetwork(latency=0.001, seed=seed)
    # short liveness timeouts, so a peer cut off shows EVASIVE and SILENT within seconds
    base = NodeConfig(interface="sim0", interval=1.0, max_peers=peers + 10, evasive=1.0,
                      silent=2.5, expired=600.0)
    observed = Node("observer", config=base.replace(groups=("web",)),
                    transport=network.transport())
    network.hub = observed.transport.address
    rng = random.Random(seed)
    nodes = []
    for i in range(peers):
        headers = {"role": rng.choice(("api", "worker", "store"))}
        if i % 97 == 3:
            headers["X-PM-BROKER"] = f'{{"mode":"auto","priority":{i}}}'
        if i % 5 == 1 and i < 60:
            headers["X-PM-FLUX-TREE"] = f'{{"instance":"jobs","endpoint":"tcp://10.0.0.{i % 250}' \
                                        f':7000","priority":{i % 3}}}'
        groups = (GROUPS[i % len(GROUPS)],) + (("alerts",) if i % 7 == 0 else ())
        nodes.append(Node(f"{GROUPS[i % len(GROUPS)]}-{i:04d}",
                          config=base.replace(groups=groups, headers=headers),
                          transport=network.transport()))
    observed.start()
    web = WebView(observed, "127.0.0.1", 0).start()
    observed.add_listener(web.publish)
    for node in nodes:
        node.start()

    def clock() -> None:   # virtual time follows the wall clock
        last = time.monotonic()
        while True:
            gevent.sleep(0.005)
            now = time.monotonic()
            network.clock.advance(now - last)
            last = now

    ticker = gevent.spawn(clock)
    deadline = time.monotonic() + 120
    while len(observed.peers()) < peers and time.monotonic() < deadline:
        gevent.sleep(0.05)
    parent.send("ready", {"url": web.url, "peers": len(observed.peers())})

    def answer(command: dict[str, Any]) -> Any:
        if command.get("op") == "churn":
            sent = 0
            end = time.monotonic() + command["seconds"]
            step = 1.0 / command["rate"]
            while time.monotonic() < end:
                node = rng.choice(nodes)
                if "churn" in node.groups():
                    node.leave("churn")
                else:
                    node.join("churn")
                sent += 1
                gevent.sleep(step)
            return {"events": sent}
        if command.get("op") == "isolate":   # cut peers off: the observer sees them go quiet
            network.partition([[nodes[i].transport.address] for i in command["peers"]])
            return {}
        return {"peers": len(observed.peers())}

    parent.serve(answer, green=True)
    ticker.kill()
    web.close()
    return {}


def measure(url: str, peers: int, churn: float, rate: float, kid: Any,
            screenshot: str = "") -> dict[str, Any]:
    with Chromium() as browser:
        began = time.perf_counter()
        browser.open(url)
        browser.wait_for(f"{DRAWN} === {peers}", 60)
        load_ms = (time.perf_counter() - began) * 1000
        paint = browser.evaluate(
            "(performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime")
        drawn = browser.evaluate("(performance.getEntriesByName('mesh-drawn')[0] || {})"
                                 ".startTime")
        result: dict[str, Any] = {"peers": peers, "first_paint_ms": paint,
                                  "mesh_drawn_ms": drawn, "open_to_drawn_ms": load_ms}
        if screenshot:   # two peers cut off: one silent, one evasive by the time it is taken
            kid.ask(op="isolate", peers=[2])
            time.sleep(1.5)
            kid.ask(op="isolate", peers=[2, 11])
            time.sleep(1.4)
            browser.evaluate("document.querySelector('#peers g[data-peer]')"
                             ".dispatchEvent(new MouseEvent('click', {bubbles: true}))")
            browser.pump(0.5)
            browser.screenshot(screenshot)
            result["screenshot"] = screenshot
        if churn > 0:
            browser.evaluate("peermeshView.latencies = []; true")
            kid.send({"op": "churn", "seconds": churn, "rate": rate})
            rtts = []
            end = time.monotonic() + churn
            while time.monotonic() < end:
                t0 = time.perf_counter()
                browser.evaluate("1")
                rtts.append((time.perf_counter() - t0) * 1000)
                browser.pump(0.05)
            sent = kid.expect("answer", churn + 30)["events"]
            browser.pump(0.5)
            lat = sorted(browser.evaluate("peermeshView.latencies"))
            rtts.sort()
            result.update({
                "events": sent, "updates_seen": len(lat),
                "latency_median_ms": percentile(lat, 50) if lat else None,
                "latency_p95_ms": percentile(lat, 95) if lat else None,
                "latency_max_ms": lat[-1] if lat else None,
                "eval_median_ms": percentile(rtts, 50), "eval_max_ms": rtts[-1]})
        result["console_errors"] = browser.errors
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=1000, help="simulated peers (default 1000)")
    parser.add_argument("--churn", type=float, default=10.0,
                        help="seconds of group changes while measuring latency (default 10)")
    parser.add_argument("--rate", type=float, default=20.0,
                        help="group changes a second during the churn (default 20)")
    parser.add_argument("--screenshot", default="", metavar="PNG",
                        help="also save the page as PNG, with one peer selected and two cut "
                             "off (one silent, one evasive)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    reason = Chromium.available()
    if reason is not None:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 1
    with Children() as kids:
        progress(f"starting {args.peers} simulated peers ...")
        kid = kids.start("bench_web", "mesh", peers=args.peers)
        ready = kid.expect("ready", 180)
        if ready["peers"] < args.peers:
            print(f"only {ready['peers']} of {args.peers} peers entered", file=sys.stderr)
            return 1
        progress("opening the page in headless Chromium ...")
        result = measure(ready["url"], args.peers, args.churn, args.rate, kid,
                         os.path.abspath(args.screenshot) if args.screenshot else "")
    if args.json:
        print(dump_json(result))
        return 0
    rows = [[key, harness.fmt(value)] for key, value in result.items()
            if key != "console_errors"]
    rows.append(["console errors", str(len(result["console_errors"]))])
    print("\n".join(table(["measure", "value"], rows)))
    return 0


if __name__ == "__main__":
    harness.run(main)
