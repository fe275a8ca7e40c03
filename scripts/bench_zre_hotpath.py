#!/usr/bin/env python3
"""The cost of one received WHISPER inside a node: the session and what drives it, no sockets.

Two nodes meet on ``peermesh.sim``; then the receiver's mailbox handler (what its
mailbox's ``serve`` was given: the message handler, the batch fast path ``take`` where the
node has one, and the end-of-batch call) is fed WHISPERs of the sender directly, in
batches handed on as a real mailbox (``HubSocket.serve``) hands them, with the
node's event sink a no-op: what is measured is the session's ``delivery`` and the code
that serves it (CPU microseconds per message, the median of ``--repeat`` runs).

``--baseline REV`` measures an older commit's peermesh the same way, in the same run
(alternating), and prints the ratio. No network at all (the simulated one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import harness

PAYLOAD = b"x" * 100
BATCH = 256


def _measure(messages: int, batch: int) -> float:
    """Microseconds per WHISPER through this interpreter's peermesh (a child's job)."""
    from peermesh.sim import network as simnet
    from peermesh.sim.simulation import Simulation
    from peermesh.wire import zre

    handlers: dict[Any, tuple[Any, Any]] = {}
    serve = simnet.SimMailbox.serve

    def recording(self: Any, on_message: Any, *args: Any, **kwargs: Any) -> None:
        handlers[self] = (on_message, kwargs.get("after_batch"), kwargs.pop("take", None))
        serve(self, on_message, *args, **kwargs)

    simnet.SimMailbox.serve = recording  # type: ignore[method-assign]
    # offered the batch fast path a real mailbox serves (a peermesh that has one takes it)
    simnet.SimMailbox.takes_batches = True  # type: ignore[attr-defined]
    sim = Simulation(2, rtt_probe=0).start()
    if not sim.run_until(sim.is_full_mesh, limit=5.0):
        raise SystemExit("the two simulated nodes did not meet")
    sender, receiver = sim.nodes
    for listener in list(receiver._listeners):
        receiver.remove_listener(listener)   # events go to the (no-op) queue alone
    on_message, after_batch, take = handlers[receiver._mailbox]
    identity = b"\x01" + sender.uuid.bytes
    peer = receiver._session.peers[sender.uuid]
    best = []
    for _ in range(5):
        want = peer.want
        batches = [[(identity, [zre.whisper_header((want + b * batch + i) & 0xFFFF), PAYLOAD])
                    for i in range(batch)] for b in range(messages // batch)]
        before = receiver._session.received_whispers
        start = time.process_time()   # (CPU time: less noise from a loaded machine)
        for read in batches:
            if take is None:   # one handler call per message
                for first, rest in read:
                    on_message(first, rest)
            else:              # as ``HubSocket.serve`` hands a batch to ``take``
                at = 0
                while at < len(read):
                    at = take(read, at)
                    if at < len(read):
                        on_message(*read[at])
                        at += 1
            after_batch()
        elapsed = time.process_time() - start
        if receiver._session.received_whispers - before != len(batches) * batch:
            raise SystemExit("not every WHISPER was taken in")
        best.append(elapsed / (len(batches) * batch) * 1e6)
    sim.stop()
    return min(best)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=BATCH * 200)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--batch", type=int, default=BATCH,
                   help=f"messages per batch read (default: {BATCH}, a full one)")
    p.add_argument("--baseline", metavar="REV", help="also measure this commit's peermesh")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(_measure(args.messages, args.batch)))
        return 0
    trees = harness.trees(args.baseline)
    runs: dict[str, list[float]] = {label: [] for label in trees}
    for _ in range(args.repeat):
        for label, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": tree}
            out = subprocess.run([sys.executable, __file__, "--child",
                                  "--messages", str(args.messages),
                                  "--batch", str(args.batch)],
                                 env=env, capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                raise SystemExit(f"{label}: {out.stderr.strip()[-2000:]}")
            runs[label].append(json.loads(out.stdout))
    for label, values in runs.items():
        print(f"{label}: {statistics.median(values):.3f} us per WHISPER "
              f"(runs: {', '.join(f'{v:.3f}' for v in values)})")
    if "baseline" in runs:
        ratios = [a / b for a, b in zip(runs["peermesh"], runs["baseline"])]
        print(f"peermesh / baseline: {statistics.median(ratios):.3f} (median of the "
              f"per-round ratios; load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    harness.run(main)
