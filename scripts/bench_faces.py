"""Whisper rate of each face of the node: gevent ``Node``, ``ThreadedNode``, ``AsyncNode``.

One run, on loopback only (interface ``lo``, a free UDP beacon port), each
sender in a fresh process started by the shared harness (``harness.py``):

* **gevent**: a ``Node`` whispering in a tight loop on its own hub;
* **threaded**: a ``ThreadedNode`` whispered to from the plain main thread
  (no gevent in the caller);
* **asyncio**: an ``AsyncNode`` whispered to from a coroutine in
  ``asyncio.run`` (skipped where ``peermesh.aio`` does not exist).

The receiver is one gevent ``Node`` in its own process that counts WHISPER
events and checks the last one is the last one sent. A face's rate is
``messages / (last message received - first whisper called)``, both read
from the system-wide monotonic clock, so it counts what actually arrived.
The sender's CPU per message (all its threads, from the first whisper to the
end of a ``flush``) is shown too: it swings less with the machine's load.
The faces take turns for ``--rounds`` rounds; the table shows the median
round and each ratio is the median of the per-round ratios to gevent.

    python scripts/bench_faces.py                   # 50,000 messages, 3 rounds
    python scripts/bench_faces.py --messages 20000 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import time
from typing import Any, Callable, Optional
from uuid import UUID

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

COUNTER = struct.Struct(">Q")
PAD = b"x" * 92  # 100-byte payloads
FACES = ("gevent", "threaded", "asyncio")
WAIT = 30.0  # seconds: bound on every wait


def payload(i: int) -> bytes:
    return COUNTER.pack(i) + PAD


def settings(port: int) -> dict[str, Any]:
    from peermesh import NodeConfig
    return {"config": NodeConfig(), "interface": "lo", "port": port, "interval": 0.1}


# --- the receiver ------------------------------------------------------------------

def role_sink(parent: harness.Parent, port: int) -> None:
    """Count the WHISPERs of each round (the parent says how many); report when the last
    came, by the system-wide monotonic clock."""
    from peermesh import EventType, Node
    node = Node("sink", **settings(port)).start()
    try:
        parent.send("uuid", node.uuid.hex)
        for command in parent.commands(green=True):
            count, last = 0, -1
            while count < command["expect"]:
                event = node.recv(WAIT)
                if event is None:
                    break
                if event.type is EventType.WHISPER:
                    count += 1
                    last = COUNTER.unpack_from(event.frames[0])[0]
            parent.send("counted", [count, last, time.monotonic()])
    finally:
        node.stop(0.5)


# --- the senders -------------------------------------------------------------------

def wait_enter(recv: Callable[[float], Any], peer: str) -> None:
    from peermesh import EventType
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        event = recv(max(0.0, deadline - time.monotonic()))
        if event is not None and event.type is EventType.ENTER and event.peer.hex == peer:
            return
    raise TimeoutError("the receiver did not enter")


def whisper_all(node: Any, peer: str, n: int) -> tuple[float, float]:
    """Whisper ``n`` messages from a started ``Node`` or ``ThreadedNode`` (same API)."""
    wait_enter(node.recv, peer)
    whisper, target = node.whisper, UUID(peer)
    started, cpu = time.monotonic(), time.process_time()
    for i in range(n):
        whisper(target, payload(i))
    node.flush(WAIT)
    return started, time.process_time() - cpu


def send_gevent(port: int, peer: str, n: int) -> tuple[float, float]:
    from peermesh import Node
    with Node("gevent", **settings(port)) as node:
        return whisper_all(node, peer, n)


def send_threaded(port: int, peer: str, n: int) -> tuple[float, float]:
    from peermesh import ThreadedNode
    with ThreadedNode("threaded", **settings(port)) as node:
        return whisper_all(node, peer, n)


def send_asyncio(port: int, peer: str, n: int) -> tuple[float, float]:
    import asyncio

    from peermesh.aio import AsyncNode

    async def main() -> tuple[float, float]:
        async with AsyncNode("asyncio", **settings(port)) as node:
            deadline = time.monotonic() + WAIT
            while time.monotonic() < deadline:
                event = await node.recv(max(0.0, deadline - time.monotonic()))
                if event is not None and event.type.value == "ENTER" and event.peer.hex == peer:
                    break
            else:
                raise TimeoutError("the receiver did not enter")
            whisper, target = node.whisper, UUID(peer)
            started, cpu = time.monotonic(), time.process_time()
            for i in range(n):
                await whisper(target, payload(i))
            await node.flush(WAIT)
            return started, time.process_time() - cpu

    return asyncio.run(main())


SENDERS = {"gevent": send_gevent, "threaded": send_threaded, "asyncio": send_asyncio}


def role_sender(parent: harness.Parent, face: str, port: int, peer: str, n: int) -> None:
    """Whisper ``n`` messages through ``face``; report when it began and its CPU."""
    parent.send("sent", SENDERS[face](port, peer, n))


# --- the run -----------------------------------------------------------------------

def available(face: str) -> bool:
    if face != "asyncio":
        return True
    try:
        import peermesh.aio  # noqa: F401
    except ImportError:
        return False
    return True


def one_round(children: harness.Children, sink: harness.Child, port: int, peer: str,
              face: str, n: int) -> tuple[float, float]:
    """The rate of ``face`` (messages per second, as the receiver counted them) and the
    sender's CPU per message in microseconds (all its threads)."""
    sink.send({"expect": n})
    sender = children.start("bench_faces", "sender", face=face, port=port, peer=peer, n=n)
    started, cpu = sender.expect("sent", WAIT + 60)
    count, last, finished = sink.expect("counted", WAIT)
    if count != n or last != n - 1:
        raise RuntimeError(f"{face}: received {count} of {n}, last {last}")
    return n / (finished - started), cpu / n * 1e6


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=50_000, help="per face and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    faces = [face for face in FACES if available(face)]
    port = harness.free_udp_port()
    rates: dict[str, list[float]] = {face: [] for face in faces}
    cpus: dict[str, list[float]] = {face: [] for face in faces}
    with harness.Children() as children:
        sink = children.start("bench_faces", "sink", port=port)
        peer = sink.expect("uuid", WAIT)
        for r in range(args.rounds):
            for face in faces:
                rate, cpu = one_round(children, sink, port, peer, face, args.messages)
                rates[face].append(rate)
                cpus[face].append(cpu)
                harness.progress(f"round {r + 1} {face:9s} {rate:10,.0f} msg/s "
                                 f"{cpu:6.2f} us/msg")
    print(f"\n{args.messages:,} 100-byte WHISPERs per face and round, {args.rounds} rounds "
          "(median round; ratio = median of per-round ratios to gevent)")
    rows = [[face, statistics.median(rates[face]),
             statistics.median(a / g for a, g in zip(rates[face], rates["gevent"])),
             statistics.median(cpus[face])] for face in faces]
    print("\n".join(harness.table(["face", "msg/s", "ratio", "sender CPU us/msg"], rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
