"""``AsyncNode``: the Node API as coroutines, inside a running asyncio loop.

Each test body is a coroutine run by ``asyncio.run``; it uses no gevent and
nothing is monkey-patched (checked). Every node runs on ``lo`` with a free
UDP beacon port and is stopped when the body ends, whatever happened.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Optional

import pytest

from peermesh import (AsyncNode, Event, EventType, InterfaceError, NodeConfig, NodeStateError,
                      UnknownPeerError)
from peermesh.overlay import ROLES_HEADER, Overlay
from peermesh.zre.node import Node
from waiting import seen_text

ENTER, EXIT, JOIN, LEAVE = EventType.ENTER, EventType.EXIT, EventType.JOIN, EventType.LEAVE
WHISPER, SHOUT, STOP = EventType.WHISPER, EventType.SHOUT, EventType.STOP

INTERVAL = 0.05
TIMEOUT = 5.0

Make = Callable[..., Awaitable[AsyncNode]]


@pytest.fixture
def run_async(free_udp_port: int) -> Callable[[Callable[[Make], Awaitable[None]]], None]:
    """``run_async(body)``: ``asyncio.run(body(make))``, where ``await make(name, start=True,
    **settings)`` gives a loopback AsyncNode that is stopped when the body ends."""

    def run(body: Callable[[Make], Awaitable[None]]) -> None:
        async def main() -> None:
            nodes: list[AsyncNode] = []

            async def make(name: str, *, start: bool = True, **settings: Any) -> AsyncNode:
                settings.setdefault("interface", "lo")
                settings.setdefault("port", free_udp_port)
                settings.setdefault("interval", INTERVAL)
                node = AsyncNode(name, config=NodeConfig(), **settings)
                nodes.append(node)
                return await node.start() if start else node

            try:
                await asyncio.wait_for(body(make), 60)
            finally:
                for node in reversed(nodes):
                    await node.stop(0.5)

        asyncio.run(main())
        assert socket.socket.__module__ == "socket" and time.sleep.__module__ == "time", \
            "something monkey-patched the standard library"

    return run


async def wait_for(node: AsyncNode, predicate: Callable[[Event], bool],
                   timeout: float = TIMEOUT) -> Event:
    """The first of ``node``'s events that matches; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    seen: list[Event] = []
    while True:
        remaining = deadline - time.monotonic()
        event = await node.recv(remaining) if remaining > 0 else None
        if event is None:
            pytest.fail(f"{node.name}: nothing matched {predicate.__name__} within {timeout}s; "
                        f"saw {seen_text(seen)}")
        seen.append(event)
        if predicate(event):
            return event


def match(type: EventType, peer: Optional[uuid.UUID] = None,
          group: Optional[str] = None) -> Callable[[Event], bool]:
    def predicate(event: Event) -> bool:
        return (event.type is type and (peer is None or event.peer == peer)
                and (group is None or event.group == group))
    predicate.__name__ = f"match({type.value}, {peer and peer.hex[:8]}, {group})"
    return predicate


async def meet(a: AsyncNode, b: AsyncNode) -> None:
    await wait_for(a, match(ENTER, b.uuid))
    await wait_for(b, match(ENTER, a.uuid))


def test_two_async_nodes_meet_whisper_shout_and_stop(run_async):
    async def body(make: Make) -> None:
        before = set(threading.enumerate())
        alice = await make("alice", groups=["g"], headers={"role": "a"})
        bob = await make("bob", groups=["g"])
        async for event in bob:  # ``async for`` reads the event stream
            if event.type is JOIN and event.peer == alice.uuid:
                break
        await wait_for(alice, match(JOIN, bob.uuid, "g"))

        assert await alice.peers() == [bob.uuid]
        assert await bob.peer_name(alice.uuid) == "alice"
        assert await bob.peer_address(alice.uuid) == alice.endpoint
        assert await bob.peer_headers(alice.uuid) == {"role": "a"}
        assert await bob.peer_header_value(alice.uuid, "role") == "a"
        assert await bob.peer_groups(alice.uuid) == ["g"]
        assert await bob.peers_by_group("g") == [alice.uuid]
        assert await bob.known_groups() == ["g"]
        assert await bob.find_peer("alice") == alice.uuid
        assert (await bob.peer_info(alice.uuid)).name == "alice"
        (info,) = await bob.peer_infos()
        assert (info.uuid, info.state) == (alice.uuid, "alive") and info.last_heard >= 0
        assert await bob.call(lambda node: node.name) == "bob"

        await bob.shout("g", b"hello", b"", b"world")
        assert (await wait_for(alice, match(SHOUT, bob.uuid, "g"))).frames == \
            (b"hello", b"", b"world")
        await alice.whisper(bob.uuid, b"psst")
        await alice.whisper(bob.uuid.hex, b"by hex")
        await alice.whisper_packed(bob.uuid, {"k": [1, 2]})
        await bob.shout_packed("g", "packed")
        got = []
        async for event in bob:
            if event.type is WHISPER:
                got.append(event.frames)
                if len(got) == 3:
                    break
        assert got[:2] == [(b"psst",), (b"by hex",)]
        assert Event(WHISPER, frames=got[2]).unpack() == {"k": [1, 2]}
        assert (await wait_for(alice, match(SHOUT, bob.uuid))).unpack() == "packed"

        await alice.join("more")
        assert (await wait_for(bob, match(JOIN, alice.uuid))).group == "more"
        await alice.leave("more")
        assert (await wait_for(bob, match(LEAVE, alice.uuid))).group == "more"
        assert await alice.groups() == ["g"]
        assert await alice.flush(TIMEOUT)

        await alice.stop()
        assert not alice.running
        assert (await wait_for(bob, match(EXIT, alice.uuid))).reason == "left"
        rest = [event async for event in alice]  # ends at STOP
        assert rest and rest[-1].type is STOP, rest
        assert await alice.recv(0.05) is None
        with pytest.raises(NodeStateError):
            await alice.whisper(bob.uuid, b"after stop")
        with pytest.raises(NodeStateError):
            await alice.peers()
        await alice.stop()  # again: nothing happens
        await bob.stop()
        assert set(threading.enumerate()) - before == set()

    run_async(body)


def test_errors_raise_in_the_awaiting_coroutine(run_async):
    async def body(make: Make) -> None:
        fresh = await make("fresh", start=False)
        with pytest.raises(NodeStateError):
            await fresh.whisper(uuid.uuid4(), b"x")
        with pytest.raises(NodeStateError):
            await fresh.peers()
        with pytest.raises(NodeStateError):
            await fresh.recv(0)
        lost = await make("lost", interface="no-such-if0", start=False)
        with pytest.raises(InterfaceError):
            await lost.start()
        assert not lost.running

        alice = await make("alice")
        bob = await make("bob")
        with pytest.raises(NodeStateError):
            await alice.start()
        await meet(alice, bob)
        with pytest.raises(UnknownPeerError):
            await alice.whisper(uuid.uuid4(), b"nobody")
        with pytest.raises(UnknownPeerError, match="not a peer UUID"):
            await alice.whisper("bob", b"x")
        with pytest.raises(TypeError):
            await alice.whisper(bob.uuid, 42)
        with pytest.raises(ValueError):
            await alice.shout("g" * 300, b"x")
        with pytest.raises(ValueError):
            await alice.join("x" * 256)
        with pytest.raises(UnknownPeerError, match="no peer"):
            await alice.find_peer("carol")
        with pytest.raises(UnknownPeerError):
            await alice.peer_name(uuid.uuid4())  # raised on the hub, in this coroutine

        def fails(node: Node) -> None:
            raise KeyError("from the hub")

        with pytest.raises(KeyError, match="from the hub"):
            await alice.call(fails)
        await alice.whisper(bob.uuid, b"still fine")
        assert (await wait_for(bob, match(WHISPER, alice.uuid))).frames == (b"still fine",)

    run_async(body)


def test_recv_times_out_with_none(run_async):
    async def body(make: Make) -> None:
        lone = await make("lone")
        assert await lone.recv(timeout=0.1) is None
        assert [event async for event in lone.events(timeout=0.05)] == []

    run_async(body)


def test_a_task_waiting_on_a_slow_peer_holds_up_no_other_task(run_async):
    async def body(make: Make) -> None:
        alice = await make("alice")
        slow = await make("slow", event_queue=20)  # nobody reads it until the end
        await meet(alice, slow)
        carol = await make("carol")  # now: meet() skips the events before the one it waits for
        await meet(alice, carol)
        for i in range(1000):  # more than slow takes in: its mailbox pauses
            await alice.whisper(slow.uuid, b"%d" % i)
        loop = asyncio.get_running_loop()
        flushing = asyncio.Event()

        def flush_on_hub(node: Node) -> bool:
            loop.call_soon_threadsafe(flushing.set)
            return node.flush(TIMEOUT * 2)  # waits for slow's PING-OK

        flush = asyncio.ensure_future(alice.call(flush_on_hub))
        await asyncio.wait_for(flushing.wait(), TIMEOUT)
        await alice.whisper(carol.uuid, b"not held up")
        assert (await wait_for(carol, match(WHISPER, alice.uuid))).frames == (b"not held up",)
        assert sorted(await alice.peers()) == sorted([slow.uuid, carol.uuid])
        assert not flush.done()

        got = [(await wait_for(slow, match(WHISPER, alice.uuid))).message for _ in range(1000)]
        assert got == [b"%d" % i for i in range(1000)]
        assert await asyncio.wait_for(flush, TIMEOUT) is True

    run_async(body)


def test_sends_of_each_task_arrive_in_order_through_a_small_event_queue(run_async):
    """The receiver pauses its mailbox whenever 50 events wait and resumes as the loop
    takes them; each task's sends (several marks' worth) arrive, all, in order."""
    async def body(make: Make) -> None:
        receiver = await make("receiver", event_queue=50)
        sender = await make("sender")
        await meet(receiver, sender)
        tasks, per_task = 3, 1500

        async def send(t: int) -> None:
            for i in range(per_task):
                await sender.whisper(receiver.uuid, b"%d:%d" % (t, i) + b"x" * 500)

        senders = asyncio.gather(*(send(t) for t in range(tasks)))
        got: dict[int, list[int]] = {t: [] for t in range(tasks)}
        count = 0
        async for event in receiver.events(timeout=TIMEOUT):
            assert event.type is WHISPER, event
            t, i = map(int, event.message.rstrip(b"x").split(b":"))
            got[t].append(i)
            count += 1
            if count == tasks * per_task:
                break
            if count % 100 == 0:
                await asyncio.sleep(0.001)  # a slow reader
        await asyncio.wait_for(senders, TIMEOUT)
        assert got == {t: list(range(per_task)) for t in range(tasks)}

    run_async(body)


class Greeter(Overlay):
    """An overlay that advertises one header and notes when it runs."""

    roles = ("test-greeter",)

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, bool]] = []

    def headers(self) -> dict[str, str]:
        return {"X-TEST-GREETER": "hi"}

    def on_start(self) -> None:
        assert self.node is not None
        self.log.append(("start", self.node.running))

    def on_stop(self, timeout: float) -> None:
        assert self.node is not None
        self.log.append(("stop", self.node.running))


def test_overlays_on_an_async_node(run_async):
    async def body(make: Make) -> None:
        greeter = Greeter()
        alice = await make("alice", overlays=[greeter])
        bob = await make("bob")
        entered = await wait_for(bob, match(ENTER, alice.uuid))
        assert entered.headers == {"X-TEST-GREETER": "hi", ROLES_HEADER: "test-greeter"}
        assert await alice.call(lambda node: greeter.running) is True
        await alice.stop()
        assert greeter.log == [("start", True), ("stop", True)]

    run_async(body)


def test_zyre_election_on_the_asyncio_face(run_async):
    async def body(make: Make) -> None:
        alice = await make("alice", groups=["ops"])
        bob = await make("bob", groups=["ops"])
        await meet(alice, bob)
        await wait_for(alice, match(EventType.JOIN, bob.uuid, "ops"))
        await wait_for(bob, match(EventType.JOIN, alice.uuid, "ops"))
        assert await alice.leader("ops") is None
        await bob.contest("ops")  # in the group with a peer: an election starts now
        assert await bob.contested() == ["ops"]
        for node in (alice, bob):
            event = await wait_for(node, match(EventType.LEADER, bob.uuid, "ops"))
            assert event.name == "bob"
        assert await alice.leader("ops") == bob.uuid
        assert await bob.leader("ops") == bob.uuid
        assert (await alice.peer_info(bob.uuid)).leads == ["ops"]
    run_async(body)
