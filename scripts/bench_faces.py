"""Whisper rate of each face of the node: gevent ``Node``, ``ThreadedNode``, ``AsyncNode``.

One run, on loopback only (interface ``lo``, a free UDP beacon port), each
sender in a fresh process (multiprocessing ``spawn``):

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
import multiprocessing as mp
import socket
import statistics
import struct
import sys
import time
from typing import Any, Callable, Optional
from uuid import UUID

COUNTER = struct.Struct(">Q")
PAD = b"x" * 92  # 100-byte payloads
FACES = ("gevent", "threaded", "asyncio")
WAIT = 30.0  # seconds: bound on every wait


def payload(i: int) -> bytes:
    return COUNTER.pack(i) + PAD


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def settings(port: int) -> dict[str, Any]:
    from peermesh import NodeConfig
    return {"config": NodeConfig(), "interface": "lo", "port": port, "interval": 0.1}


# --- the receiver ------------------------------------------------------------------

def sink(conn: Any, port: int) -> None:
    """Count the WHISPERs of each round (``conn`` says how many); report when the last came."""
    from peermesh import EventType, Node
    node = Node("sink", **settings(port)).start()
    try:
        conn.send(node.uuid.hex)
        while True:
            while not conn.poll():
                node.recv(0.02)  # keep the hub serving between rounds
            expected = conn.recv()
            if expected is None:
                return
            count, last = 0, -1
            while count < expected:
                event = node.recv(WAIT)
                if event is None:
                    break
                if event.type is EventType.WHISPER:
                    count += 1
                    last = COUNTER.unpack_from(event.frames[0])[0]
            conn.send((count, last, time.monotonic()))
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


def send_gevent(port: int, peer: str, n: int) -> tuple[float, float]:
    from peermesh import Node
    node = Node("gevent", **settings(port)).start()
    try:
        wait_enter(node.recv, peer)
        whisper, target = node.whisper, UUID(peer)
        started, cpu = time.monotonic(), time.process_time()
        for i in range(n):
            whisper(target, payload(i))
        node.flush(WAIT)
        return started, time.process_time() - cpu
    finally:
        node.stop(0.5)


def send_threaded(port: int, peer: str, n: int) -> tuple[float, float]:
    from peermesh import ThreadedNode
    with ThreadedNode("threaded", **settings(port)) as node:
        wait_enter(node.recv, peer)
        whisper, target = node.whisper, UUID(peer)
        started, cpu = time.monotonic(), time.process_time()
        for i in range(n):
            whisper(target, payload(i))
        node.flush(WAIT)
        return started, time.process_time() - cpu


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


def sender(conn: Any, face: str, port: int, peer: str, n: int) -> None:
    try:
        conn.send(("ok", SENDERS[face](port, peer, n)))
    except BaseException as exc:  # reported by the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


# --- the run -----------------------------------------------------------------------

def available(face: str) -> bool:
    if face != "asyncio":
        return True
    try:
        import peermesh.aio  # noqa: F401
    except ImportError:
        return False
    return True


def one_round(ctx: Any, sink_conn: Any, port: int, peer: str, face: str,
              n: int) -> tuple[float, float]:
    """The rate of ``face`` (messages per second, as the receiver counted them) and the
    sender's CPU per message in microseconds (all its threads)."""
    sink_conn.send(n)
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=sender, args=(child, face, port, peer, n), daemon=True)
    proc.start()
    try:
        if not parent.poll(WAIT + 60):
            raise RuntimeError(f"{face}: the sender did not finish")
        status, outcome = parent.recv()
        if status != "ok":
            raise RuntimeError(f"{face}: {outcome}")
        started, cpu = outcome
        if not sink_conn.poll(WAIT):
            raise RuntimeError(f"{face}: the receiver did not report")
        count, last, finished = sink_conn.recv()
        if count != n or last != n - 1:
            raise RuntimeError(f"{face}: received {count} of {n}, last {last}")
        return n / (finished - started), cpu / n * 1e6
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=50_000, help="per face and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    faces = [face for face in FACES if available(face)]
    ctx = mp.get_context("spawn")
    port = free_udp_port()
    sink_conn, child = ctx.Pipe()
    receiver = ctx.Process(target=sink, args=(child, port), daemon=True)
    receiver.start()
    rates: dict[str, list[float]] = {face: [] for face in faces}
    cpus: dict[str, list[float]] = {face: [] for face in faces}
    try:
        if not sink_conn.poll(WAIT):
            raise RuntimeError("the receiver did not start")
        peer = sink_conn.recv()
        for r in range(args.rounds):
            for face in faces:
                rate, cpu = one_round(ctx, sink_conn, port, peer, face, args.messages)
                rates[face].append(rate)
                cpus[face].append(cpu)
                print(f"round {r + 1} {face:9s} {rate:10,.0f} msg/s {cpu:6.2f} us/msg",
                      file=sys.stderr)
        sink_conn.send(None)
    finally:
        receiver.join(10)
        if receiver.is_alive():
            receiver.kill()
    print(f"\n{args.messages:,} 100-byte WHISPERs per face and round, {args.rounds} rounds "
          "(median round; ratio = median of per-round ratios to gevent)")
    print(f"{'face':10s} {'msg/s':>10s} {'ratio':>7s} {'sender CPU us/msg':>18s}")
    for face in faces:
        ratio = statistics.median(a / g for a, g in zip(rates[face], rates["gevent"]))
        print(f"{face:10s} {statistics.median(rates[face]):10,.0f} {ratio:7.2f} "
              f"{statistics.median(cpus[face]):18.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
