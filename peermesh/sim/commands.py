"""``peermesh simulate``: many nodes on a simulated LAN, with progress and a report."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any, Callable

from ..cli.progress import Progress
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
    if not (0 <= at < math.inf and 0 < duration < math.inf) or islands < 2 or len(parts) > 3:
        raise argparse.ArgumentTypeError(
            f"{text!r}: need finite AT >= 0 and DURATION > 0, ISLANDS >= 2")
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


#: above this many nodes, the run starts with an estimate of what it will cost
LARGE_RUN = 5000
# Measured costs per ordered pair of nodes (each node holds every other as a peer):
# resident memory, wall time to reach the full mesh, and wall time per beacon copy.
_BYTES_PER_PAIR = 1400
_MESH_SECONDS_PER_PAIR = 20e-6
_SECONDS_PER_BEACON_COPY = 6e-6


def _check(args: argparse.Namespace) -> None:
    """Refuse option values the simulation cannot use, naming the option."""
    if args.nodes < 1:
        raise ValueError(f"--nodes must be at least 1, not {args.nodes}")
    for option, value in (("--latency", args.latency), ("--jitter", args.jitter)):
        if not 0 <= value < math.inf:
            raise ValueError(f"{option} must be a finite number of milliseconds >= 0, "
                             f"not {value}")
    if not 0 <= args.loss <= 1:
        raise ValueError(f"--loss must be a probability within 0..1, not {args.loss}")
    if not 0 < args.duration < math.inf:
        raise ValueError(f"--duration must be a finite number of seconds > 0, "
                         f"not {args.duration}")


def large_run_estimate(nodes: int, duration: float, interval: float) -> str | None:
    """What a run of more than ``LARGE_RUN`` nodes will likely cost, or None for a smaller one."""
    if nodes <= LARGE_RUN:
        return None
    pairs = nodes * (nodes - 1)
    memory = pairs * _BYTES_PER_PAIR
    wall = pairs * (_MESH_SECONDS_PER_PAIR + _SECONDS_PER_BEACON_COPY * duration / interval)
    return (f"{nodes} nodes: expect about {memory / 2**30:,.1f} GiB of memory and "
            f"{_duration(wall)} of wall time (both grow with the square of --nodes)")


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.0f} {unit}"
    return f"{seconds:.0f} seconds"


def run(args: argparse.Namespace, config: NodeConfig) -> int:
    _check(args)
    estimate = large_run_estimate(args.nodes, args.duration, config.interval)
    if estimate is not None:
        _progress_line(estimate)
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

    bar = Progress("simulating", total=args.duration, unit="s")
    progress = _progress_bar(bar) if bar.active else _progress_printer(began)
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
    bar.close()
    report: dict[str, Any] = sim.report()
    report["wall_seconds"] = round(time.perf_counter() - began, 3)
    sim.stop()
    if args.json:
        print(json.dumps(report))
    else:
        print(_human(report))
    return 0


def _progress_printer(began: float) -> Callable[[Simulation], None]:
    """A progress callback that prints each state once (it is called per virtual
    second and per 5 s of wall time, often at the same instant)."""
    shown = ""

    def progress(s: Simulation) -> None:
        nonlocal shown
        state = (f"t={s.clock.now():6.1f}s  full view: {s.complete()}/{s.size} nodes  "
                 f"ENTERs {s.entered}")
        if state != shown:
            shown = state
            _progress_line(f"{state}  wall {time.perf_counter() - began:6.1f}s")
    return progress


def _progress_bar(bar: Progress) -> Callable[[Simulation], None]:
    """A progress callback that moves a terminal's bar over the virtual seconds."""
    def progress(s: Simulation) -> None:
        bar.advance_to(s.clock.now(), f"full view {s.complete()}/{s.size}, ENTERs {s.entered}")
    return progress


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
        f"mailbox messages      sent {m['sent']}, delivered {m['delivered']}, lost {m['lost']}, "
        f"in flight {m['in_flight']}",
        f"beacon copies         sent {b['sent']}, delivered {b['delivered']}, lost {b['lost']}, "
        f"in flight {b['in_flight']}",
        f"churn                 ENTER {e.get('ENTER', 0)}, EXIT {e.get('EXIT', 0)}, "
        f"EVASIVE {e.get('EVASIVE', 0)}, SILENT {e.get('SILENT', 0)}",
        f"memory per node       {r['memory_per_node_bytes'] / 1024:.1f} KiB",
    ])
