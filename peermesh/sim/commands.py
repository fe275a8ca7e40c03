"""``peermesh simulate``: many nodes on a simulated LAN, with progress and a report."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable

from ..cli.session import HubSignals
from ..config import NodeConfig
from .simulation import Simulation

__all__ = ["add_commands"]


def _partition(text: str) -> tuple[float, float, int]:
    parts = text.split(":")
    try:
        at, duration = float(parts[0]), float(parts[1])
        islands = int(parts[2]) if len(parts) > 2 else 2
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not AT:DURATION[:ISLANDS] (seconds, seconds, count)") from None
    if at < 0 or duration <= 0 or islands < 2 or len(parts) > 3:
        raise argparse.ArgumentTypeError(f"{text!r}: need AT >= 0, DURATION > 0, ISLANDS >= 2")
    return at, duration, islands


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``simulate`` to the ``peermesh`` command."""
    p = command(
        "simulate", "run many nodes on a simulated LAN and report",
        "Start --nodes real peermesh nodes in this process on a simulated network with "
        "virtual time (beacons, mailboxes and timers run unchanged; no real socket is "
        "used), inject latency, jitter, beacon loss and partitions, and report time to a "
        "full mesh, traffic, ENTER/EXIT churn and memory per node. --interval, --evasive "
        "and --expired set the nodes' timers.",
        "  peermesh simulate --nodes 200\n"
        "  peermesh simulate --nodes 50 --latency 2 --jitter 1 --loss 0.05 --duration 20\n"
        "  peermesh simulate --nodes 40 --partition 5:40 --duration 60 --json",
        run, node_options="timers")
    p.add_argument("--nodes", "-N", type=int, default=100, help="how many nodes (default: 100)")
    p.add_argument("--latency", type=float, default=0.0, metavar="MS",
                   help="one-way latency of every link in milliseconds (default: 0)")
    p.add_argument("--jitter", type=float, default=0.0, metavar="MS",
                   help="random extra latency, up to this many milliseconds (default: 0)")
    p.add_argument("--loss", type=float, default=0.0, metavar="P",
                   help="probability that one beacon copy is lost, 0..1 (default: 0); "
                        "mailbox traffic is TCP and is lost only across partitions")
    p.add_argument("--partition", type=_partition, action="append", default=[],
                   metavar="AT:DURATION[:ISLANDS]",
                   help="split the LAN into ISLANDS (default 2) at virtual second AT for "
                        "DURATION seconds, then heal; repeatable")
    p.add_argument("--duration", type=float, default=10.0, metavar="S",
                   help="virtual seconds to run (default: 10)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace, config: NodeConfig) -> int:
    if args.nodes < 1:
        raise ValueError("--nodes must be at least 1")
    if args.latency < 0 or args.jitter < 0 or not 0 <= args.loss <= 1 or args.duration <= 0:
        raise ValueError("--latency/--jitter must be >= 0, --loss within 0..1, --duration > 0")
    with HubSignals():  # a signal interrupts the run where it is, not one node's greenlet
        return _simulate(args, config)


def _simulate(args: argparse.Namespace, config: NodeConfig) -> int:
    sim = Simulation(args.nodes, latency=args.latency / 1000, jitter=args.jitter / 1000,
                     loss=args.loss, seed=args.seed, config=config.replace(groups=()))
    began = time.perf_counter()
    _progress_line(f"starting {args.nodes} nodes")
    sim.start()
    events = sorted([(at, "split", islands) for at, _, islands in args.partition]
                    + [(at + duration, "heal", 0) for at, duration, _ in args.partition])

    def progress(s: Simulation) -> None:
        _progress_line(f"t={s.clock.now():6.1f}s  full view: {s.complete()}/{s.size} nodes  "
                       f"ENTERs {s.entered}  wall {time.perf_counter() - began:6.1f}s")

    sim.watch(progress, every=5.0)  # also during a long first round of HELLOs

    for at, kind, islands in events:
        if at > sim.clock.now():
            sim.run(min(at, args.duration) - sim.clock.now(), progress=progress)
        if at >= args.duration:
            break
        if kind == "split":
            sim.partition(islands)
            _progress_line(f"t={sim.clock.now():6.1f}s  partition into {islands} islands")
        else:
            sim.heal()
            _progress_line(f"t={sim.clock.now():6.1f}s  healed")
    if sim.clock.now() < args.duration:
        sim.run(args.duration - sim.clock.now(), progress=progress)
    report: dict[str, Any] = sim.report()
    report["wall_seconds"] = round(time.perf_counter() - began, 3)
    sim.stop()
    if args.json:
        print(json.dumps(report))
    else:
        print(_human(report))
    return 0


def _progress_line(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _human(r: dict[str, Any]) -> str:
    converged = (f"{r['converged_after']:.3f} s (virtual)" if r["converged_after"] is not None
                 else "never")
    m, b, e = r["messages"], r["beacons"], r["events"]
    return "\n".join([
        f"nodes                 {r['nodes']}",
        f"virtual time          {r['virtual_seconds']} s   (wall {r['wall_seconds']} s)",
        f"full mesh reached     {converged}; full mesh now: {'yes' if r['full_mesh'] else 'no'}",
        f"mailbox messages      sent {m['sent']}, delivered {m['delivered']}, lost {m['lost']}",
        f"beacon copies         sent {b['sent']}, delivered {b['delivered']}, lost {b['lost']}",
        f"churn                 ENTER {e.get('ENTER', 0)}, EXIT {e.get('EXIT', 0)}, "
        f"EVASIVE {e.get('EVASIVE', 0)}, SILENT {e.get('SILENT', 0)}",
        f"memory per node       {r['memory_per_node_bytes'] / 1024:.1f} KiB",
    ])
