"""Bounds on what a remote sender controls, on the session core (no sockets, no clock).

Each test is a flood from the hostile-network report made small: the same
shape, fewer inputs. Live versions on loopback are in test_bounds_live.py.
"""

from __future__ import annotations

import logging
import threading
import uuid as uuid_module

import pytest

from peermesh.config import NodeConfig
from peermesh.events import Event, EventType
from peermesh.wire import zre
from peermesh.zre.eventqueue import GreenEventQueue, ThreadEventQueue

from sessionharness import CONFIG, OWN_ENDPOINT, Harness, Remote, entered

ENTER, EXIT, JOIN, WHISPER = EventType.ENTER, EventType.EXIT, EventType.JOIN, EventType.WHISPER


def harness(**limits: object) -> Harness:
    return Harness(CONFIG.replace(**limits))


# --- peers found by discovery: pending, capped, timed out --------------------------------


def test_beacons_from_random_uuids_open_at_most_max_pending_links() -> None:
    # 30,000 beacons with random UUIDs at closed ports made 3,679 peers and fds.
    h = harness(max_pending=8)
    for i in range(300):
        h.appeared(uuid_module.uuid4(), f"tcp://10.0.0.9:{1000 + i}", i / 1000)
    assert sum(map(len, h.links.values())) == 8
    assert len(h.session.pending) == len(h.session.peers) == 8
    assert h.session.counters.get("pending_refused") == 292
    assert h.taken() == []


def test_a_pending_peer_that_had_an_interval_to_answer_makes_room() -> None:
    h = harness(max_pending=8)
    fakes = [uuid_module.uuid4() for _ in range(8)]
    for i, fake in enumerate(fakes):
        h.appeared(fake, f"tcp://10.0.0.9:{1000 + i}", i / 10)
    newcomer = Remote("new", 7000)
    h.appeared(newcomer.uuid, newcomer.endpoint, 0.9)  # the oldest waited 0.9 s
    assert newcomer.uuid not in h.session.peers
    h.appeared(newcomer.uuid, newcomer.endpoint, 1.0)  # its next beacon
    assert newcomer.uuid in h.session.pending and fakes[0] not in h.session.peers
    assert h.link(newcomer.endpoint).kinds() == ["Hello"]
    assert h.session.counters.get("pending_shed") == 1


def test_pending_peers_without_hello_time_out() -> None:
    h = harness(max_pending=4, hello_timeout=2.0)
    for i in range(4):
        h.appeared(uuid_module.uuid4(), f"tcp://10.0.0.9:{1000 + i}", float(i))
    h.timer(2.5)  # the first two are 2.5 and 1.5 s old
    assert len(h.session.pending) == 3
    h.timer(5.0)
    assert not h.session.pending and not h.session.peers
    assert all(link.closed for links in h.links.values() for link in links)
    assert h.session.counters.get("pending_timed_out") == 4
    assert h.taken() == []  # they never said HELLO: no EXIT
    # Room again for a newcomer found by discovery.
    newcomer = Remote("new", 7000)
    h.appeared(newcomer.uuid, newcomer.endpoint, 5.0)
    assert newcomer.uuid in h.session.pending


def test_fakes_never_crowd_out_a_newcomer_that_says_hello() -> None:
    # The table is full of peers found by beacons that never answer; a real
    # node says HELLO (it heard our beacon): it gets in, shedding the oldest fake.
    h = harness(max_pending=4, max_peers=4)
    fakes = [uuid_module.uuid4() for _ in range(4)]
    for i, fake in enumerate(fakes):
        h.appeared(fake, f"tcp://10.0.0.9:{1000 + i}", 0.0)
    newcomer = Remote("new", 7000)
    h.appeared(newcomer.uuid, newcomer.endpoint, 0.5)  # its beacon: no room
    assert newcomer.uuid not in h.session.peers
    entered(h, newcomer, 0.6)
    assert newcomer.uuid in h.session.peers and fakes[0] not in h.session.peers
    assert h.session.counters.get("pending_shed") == 1


def test_hellos_past_max_peers_are_refused() -> None:
    # 5,000 HELLOs from distinct identities made 4,298 ready peers.
    h = harness(max_peers=10)
    for i in range(50):
        h.send(Remote(f"fake{i}", 2000 + i), Remote(f"fake{i}", 2000 + i).hello(), 0.0)
    assert len(h.session.peers) == 10
    assert [kind for kind, _ in h.taken()].count(ENTER) == 10
    assert h.session.counters.get("peers_refused") == 40


def test_hellos_that_nothing_proves_wait_at_most_max_unproven() -> None:
    # 5,000 fake HELLOs from one host, each naming an endpoint where nobody listens, made
    # 5,000 peers (max_peers followed the descriptors) and grew the node to 271 MB.
    h = harness(max_unproven=4)
    fakes = [Remote(f"fake{i}", 2000 + i) for i in range(4)]
    for fake in fakes:
        h.send(fake, fake.hello(), 0.0)
    assert list(h.session.unproven) == [f.uuid for f in fakes]
    real, other, third = Remote("real", 3000), Remote("other", 3001), Remote("third", 3002)
    links = sum(map(len, h.links.values()))
    h.send(real, real.hello(), 0.1)  # full: its HELLO waits, and each fake is PINGed
    assert real.uuid not in h.session.peers and sum(map(len, h.links.values())) == links
    assert all(h.link(f.endpoint).kinds() == ["Hello", "Ping"] for f in fakes)
    h.taken()
    h.appeared(real.uuid, real.endpoint, 0.2)  # its beacon: in at once, proven
    assert h.taken() == [(ENTER, "real")] and real.uuid not in h.session.unproven
    h.send(other, other.hello(), 0.3)  # the fakes were asked 0.2 s ago: it waits
    h.send(fakes[1], zre.PingOk(fakes[1].next()), 0.6)  # one answers: proven
    entered(h, other, 0.7)  # it said HELLO again: room now
    h.send(third, third.hello(), 5.0)  # full, and fake0 was asked 4.9 s ago
    assert third.uuid not in h.session.peers
    h.send(third, third.hello(), 5.1)  # fake0 had hello_timeout to answer its PING: shed
    assert h.taken() == [(EXIT, "shed for a newer peer: no PING-OK or beacon within "
                                "hello_timeout"), (ENTER, "third")]
    assert h.session.counters.get("unproven_shed") == 1
    assert set(h.session.peers) == {f.uuid for f in fakes[1:]} | {real.uuid, other.uuid,
                                                                   third.uuid}
    assert list(h.session.unproven) == [fakes[2].uuid, fakes[3].uuid, other.uuid, third.uuid]
    assert h.session.counters.get("unproven_refused") == 0  # each held HELLO got in
    # A held HELLO that nothing proves within hello_timeout is refused.
    h = harness(max_unproven=1, hello_timeout=2.0, interval=0.1)  # (a timer every 0.1 s)
    h.send(fakes[0], fakes[0].hello(), 0.0)
    h.send(fakes[1], fakes[1].hello(), 0.1)
    h.timer(2.0)
    assert h.session.counters.get("unproven_refused") == 0
    h.timer(2.2)
    assert h.session.counters.get("unproven_refused") == 1
    h.appeared(fakes[1].uuid, fakes[1].endpoint, 2.3)  # too late: found only
    assert fakes[1].uuid in h.session.pending


def test_a_hello_from_the_host_its_endpoint_names_is_proof_enough_but_the_cap_holds() -> None:
    # Where the driver tells each message's source address, a HELLO from the host whose
    # endpoint it names needs no PING or beacon; one host still makes at most
    # max_peers_per_address peers. Other sources, loopback and this node's own address
    # (any local process can connect from any 127.x.y.z) prove nothing.
    h = harness(max_unproven=2, max_peers_per_address=4)
    sources: dict[bytes, str] = {}
    h.session.source = sources.get
    own = OWN_ENDPOINT[6:].rpartition(":")[0]

    def hello(name: str, endpoint: str, source: str, now: float) -> Remote:
        remote = Remote(name, 0)
        remote.endpoint = endpoint
        sources[remote.identity] = source
        h.send(remote, remote.hello(), now)
        return remote

    hosts = [hello(f"host{i}", f"tcp://10.0.0.2:{2000 + i}", "10.0.0.2", 0.0)
             for i in range(10)]
    assert [h.session.peers[r.uuid].ready for r in hosts[:4]] == [True] * 4
    assert not any(r.uuid in h.session.peers for r in hosts[4:])
    assert h.session.counters.get("address_refused") == 6
    assert not h.session.unproven and all(h.link(r.endpoint).kinds() == ["Hello"]
                                          for r in hosts[:4])
    elsewhere = hello("elsewhere", "tcp://10.0.0.7:3000", "10.0.0.2", 0.1)
    loopback = hello("loopback", "tcp://127.0.0.9:3001", "127.0.0.9", 0.1)
    local = hello("local", f"tcp://{own}:3002", own, 0.1)
    assert list(h.session.unproven) == [elsewhere.uuid, loopback.uuid]
    assert local.uuid not in h.session.peers  # unproven is full: its HELLO waits
    assert h.session.counters.get("unproven_refused") == 0
    unknown = Remote("unknown", 0)  # the driver cannot tell where it came from
    unknown.endpoint = "tcp://10.0.0.8:3003"
    h.send(unknown, unknown.hello(), 0.2)
    assert unknown.uuid not in h.session.peers
    assert all(h.link(r.endpoint).kinds() == ["Hello", "Ping"] for r in (elsewhere, loopback))
    other = hello("other", "tcp://10.0.0.3:4000", "10.0.0.3", 0.3)  # another host: in
    assert h.session.peers[other.uuid].ready and other.uuid not in h.session.unproven


def test_a_node_at_a_cap_says_so_once_naming_the_setting(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    h = harness(max_peers=10, max_pending=4, max_unproven=4)
    with caplog.at_level(logging.WARNING, logger="peermesh.zre.session"):
        for i in range(8):  # beacons faster than pending peers may be replaced
            h.appeared(uuid_module.uuid4(), f"tcp://10.0.0.9:{4000 + i}", 0.0)
        for i in range(1, 50):
            fake = Remote(f"fake{i}", 2000 + i)
            if i % 2:  # reported at its endpoint (beacon) first, the others say HELLO first
                h.appeared(fake.uuid, fake.endpoint, float(i))
            h.send(fake, fake.hello(), float(i))
            h.appeared(uuid_module.uuid4(), f"tcp://10.0.0.9:{3000 + i}", float(i))
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 3, said
    assert any("max_pending=4 peers found by discovery" in line
               and "raise max_pending (PEERMESH_MAX_PENDING" in line for line in said), said
    assert any("max_unproven=4 peers that said HELLO wait for a PING-OK" in line
               and "raise max_unproven (PEERMESH_MAX_UNPROVEN" in line for line in said), said
    assert any("max_peers=10 peers in its table" in line
               and "raise max_peers (PEERMESH_MAX_PEERS" in line for line in said), said


def test_one_address_holds_at_most_max_peers_per_address() -> None:
    # One host makes up UUIDs by beacons and by HELLOs: it gets its share, no more, and
    # a peer of its own that says HELLO sheds one of its address's pending ones.
    h = harness(max_peers=16, max_peers_per_address=4)
    for i in range(3):
        h.appeared(uuid_module.uuid4(), f"tcp://10.0.0.2:{1000 + i}", 0.0)
    for i in range(10):
        fake = Remote(f"fake{i}", 2000 + i)  # at 10.0.0.2
        h.send(fake, fake.hello(), 0.1)
    peers = h.session.peers.values()
    assert len(peers) == 4 and all(p.ready for p in peers)  # HELLOs shed the 3 pending
    assert h.session.per_address == {"10.0.0.2": 4}
    assert h.session.counters.get("address_refused") == 6
    assert h.session.counters.get("pending_shed") == 3
    other = Remote("other", 3000)
    other.endpoint = "tcp://10.0.0.3:3000"
    entered(h, other, 0.2)                   # another address has its own share
    for i in range(6):                      # this node's own address is not counted
        local = Remote(f"local{i}", 4000 + i)
        local.endpoint = "tcp://" + OWN_ENDPOINT[6:].rpartition(":")[0] + f":{4000 + i}"
        entered(h, local, 0.3)
    assert len(h.session.peers) == 11 and h.session.per_address == {"10.0.0.2": 4,
                                                                   "10.0.0.3": 1}
    h.remove(h.session.peers[other.uuid], "gone")
    assert h.session.per_address == {"10.0.0.2": 4}


def test_a_newcomer_that_says_hello_replaces_an_evasive_fake() -> None:
    # Fake HELLOs fill the table and then say nothing (not even PING-OK): once
    # they are EVASIVE, a real newcomer's HELLO takes the place of one.
    h = harness(max_peers=4)
    fakes = [Remote(f"fake{i}", 2000 + i) for i in range(4)]
    for fake in fakes:
        entered(h, fake, 0.0)
    newcomer = Remote("new", 7000)
    h.send(newcomer, newcomer.hello(), 1.0)  # nobody is EVASIVE yet: refused
    assert newcomer.uuid not in h.session.peers
    h.timer(CONFIG.evasive)  # all four PINGed, EVASIVE
    h.taken()
    h.send(newcomer, newcomer.hello(), CONFIG.evasive + 0.5)
    assert newcomer.uuid in h.session.peers and len(h.session.peers) == 4
    kinds = h.taken()
    assert (ENTER, "new") in kinds
    assert [k for k in kinds if k[0] is EXIT] == [(EXIT, "evasive, shed for a new peer "
                                                          "(max_peers=4)")]
    assert h.session.counters.get("evasive_shed") == 1


# --- HELLO size and groups ----------------------------------------------------------------


def test_hello_over_max_hello_is_refused_and_its_peer_dropped() -> None:
    # A HELLO with a 4 MB header was kept per fake peer.
    h = harness(max_hello=1000)
    big = Remote("big", 3000)
    h.appeared(big.uuid, big.endpoint, 0.0)  # pending, HELLO sent to it
    h.send(big, big.hello(headers={"X-Big": "x" * 2000}), 0.0)
    assert big.uuid not in h.session.peers and h.link(big.endpoint).closed
    assert h.taken() == []
    assert h.session.counters.get("hellos_refused") == 1
    entered(h, Remote("small", 3001), 0.0, headers={"X-Small": "x" * 500})


def test_hello_with_more_groups_than_max_groups_is_refused() -> None:
    # One HELLO listing 500k groups stopped the hub.
    h = harness(max_groups=16)
    many = Remote("many", 3000)
    h.send(many, many.hello(groups=tuple(f"g{i}" for i in range(17))), 0.0)
    assert many.uuid not in h.session.peers
    assert h.taken() == [] and h.session.counters.get("hellos_refused") == 1
    entered(h, Remote("ok", 3001), 0.0, groups=tuple(f"g{i}" for i in range(16)))


def test_a_join_past_max_groups_removes_the_peer() -> None:
    h = harness(max_groups=3)
    joiner = Remote("joiner", 3000)
    entered(h, joiner, 0.0, groups=("a", "b"))
    h.send(joiner, zre.Join(joiner.next(), "c", 3), 0.0)
    h.send(joiner, zre.Join(joiner.next(), "d", 4), 0.0)
    assert h.taken() == [(JOIN, "c"), (EXIT, "joined more than max_groups (3) groups")]
    assert joiner.uuid not in h.session.peers
    assert not h.session.members  # no group keeps a member that left
    assert h.session.counters.get("groups_refused") == 1


def test_joins_and_leaves_change_the_peers_group_set_in_place() -> None:
    # _peer_join copied the whole set per group: 40k groups in one HELLO took 32 s.
    h = harness()
    joiner = Remote("joiner", 3000)
    entered(h, joiner, 0.0, groups=("a",))
    peer = h.session.peers[joiner.uuid]
    groups = peer.groups
    for i in range(100):
        h.send(joiner, zre.Join(joiner.next(), f"g{i}", i + 2), 0.0)
    h.send(joiner, zre.Leave(joiner.next(), "g0", 102), 0.0)
    assert peer.groups is groups and len(groups) == 100


# --- leaving: port-0 beacons and the departed peers ----------------------------------------


def test_port_zero_from_another_address_does_not_remove_the_peer() -> None:
    # One spoofed 22-byte beacon cut a live peer off for `expired` seconds.
    h = harness()
    peer = Remote("peer", 3000)  # at 10.0.0.2
    entered(h, peer, 0.0)
    h.left(peer.uuid, 1.0, "10.0.0.66")
    assert peer.uuid in h.session.peers and h.taken() == []
    assert h.session.counters.get("leaves_ignored") == 1
    h.left(peer.uuid, 2.0, "10.0.0.2")
    assert h.taken() == [(EXIT, "left")]


def test_port_zero_beacons_from_random_uuids_leave_nothing_behind() -> None:
    # 200,000 port-0 beacons from random UUIDs grew _departed to 89k entries.
    h = harness(max_peers=8)
    for _ in range(500):
        h.left(uuid_module.uuid4(), 0.0, "10.0.0.9")
    assert not h.session._departed
    # Peers that really leave are remembered, at most max_peers of them.
    for i in range(20):
        peer = Remote(f"p{i}", 3000 + i)
        entered(h, peer, float(i))
        h.left(peer.uuid, float(i), "10.0.0.2")
    assert len(h.session._departed) == 8


def test_report_of_a_known_uuid_at_another_endpoint_neither_moves_nor_refreshes_it() -> None:
    h = harness()
    peer = Remote("peer", 3000)
    entered(h, peer, 0.0)
    h.appeared(peer.uuid, "tcp://10.0.0.66:3000", 4.0)
    assert h.session.peers[peer.uuid].endpoint == peer.endpoint
    assert h.session.peers[peer.uuid].last_seen == 0.0
    assert list(h.links) == [peer.endpoint]
    h.appeared(peer.uuid, peer.endpoint, 4.0)  # its own beacon does
    assert h.session.peers[peer.uuid].last_seen == 4.0


# --- the event queue: bounded in octets too ------------------------------------------------


def whisper(size: int) -> Event:
    return Event(WHISPER, uuid_module.uuid4(), "w", frames=(b"x" * size,))


def test_green_queue_holds_no_more_octets_than_its_bound_and_loses_nothing() -> None:
    # 60 x 20 MB whispers to an application that does not read: 1.17 GB. A whisper that
    # does not fit waits (with what comes after it) and the producer stops reading.
    queue: GreenEventQueue[Event] = GreenEventQueue(1000)
    queue.bound_bytes(2_500)
    for _ in range(10):
        queue.put(whisper(1000))
    queue.put(Event(ENTER, uuid_module.uuid4(), "e"))
    assert len(queue) == 2 and queue.waiting() == 9 and queue.dropped == 0
    assert queue.octets() == 2000
    assert queue.full() and queue.blocked()  # the producer stops reading
    taken = [queue.get(0)]  # room for the next one
    assert not queue.blocked()
    assert queue.full() and len(queue) == 2 and queue.octets() <= 2_500
    while len(taken) < 11:
        event = queue.get(0)
        assert event is not None
        taken.append(event)
        queue.full()
        assert queue.octets() <= 2_500
    assert [e.type for e in taken] == [WHISPER] * 10 + [ENTER]  # all, in order
    assert not queue.full() and queue.waiting() == 0 and not queue.blocked()


def test_content_larger_than_the_whole_bound_is_dropped_and_counted() -> None:
    queue: GreenEventQueue[Event] = GreenEventQueue(1000)
    queue.bound_bytes(2_500)
    queue.put(whisper(2_501))
    queue.put(whisper(2_500))
    assert queue.dropped == 1 and len(queue) == 1 and not queue.full()


@pytest.mark.parametrize("held", [True, False], ids=["batch", "alone"])
def test_put_each_keeps_the_bounds_put_keeps(held: bool) -> None:
    # A batch put whole while it fits (one call); past the bound in octets each item as
    # ``put`` takes it: what fits goes in, the rest waits in order, the too-large dropped.
    queues = [GreenEventQueue[Event](1000), GreenEventQueue[Event](1000)]
    batches = [[whisper(1000), whisper(500)], [whisper(900), whisper(2_501), whisper(200)]]
    for queue in queues:
        queue.bound_bytes(2_500)
    for batch in batches:
        if held:
            queues[1].hold()
        queues[0].put_each(batch, [sum(map(len, e.frames)) for e in batch])
        for event in batch:
            queues[1].put(event)
        queues[1].release()
    for queue in queues:
        assert (len(queue), queue.waiting(), queue.dropped, queue.octets()) == (3, 1, 1, 2_400)
        assert queue.admitted == 2_400 and queue.full()
    assert [queues[0].get(0) for _ in range(3)] == [queues[1].get(0) for _ in range(3)] == [
        batches[0][0], batches[0][1], batches[1][0]]
    assert not queues[0].full() and queues[0].get(0) is batches[1][2]


def test_thread_queue_counts_what_other_threads_took() -> None:
    queue: ThreadEventQueue[Event] = ThreadEventQueue(1000, lambda fn: fn())
    queue.bound_bytes(10_000)
    for _ in range(10):
        queue.put(whisper(1000))
    taken: list[Event] = []
    consumer = threading.Thread(target=lambda: taken.extend(queue.get(1) for _ in range(10)))
    consumer.start()
    consumer.join(5)
    assert len(taken) == 10
    for _ in range(10):
        queue.put(whisper(1000))
    assert queue.waiting() == 0 and queue.size == 10_000 and not queue.full()
    queue.put(whisper(1))
    assert queue.waiting() == 1 and queue.full() and queue.dropped == 0
    consumer = threading.Thread(target=lambda: taken.append(queue.get(1)))  # type: ignore
    consumer.start()
    consumer.join(5)
    assert not queue.blocked()  # the consumer released the producer
    assert not queue.full() and queue.waiting() == 0 and len(queue) == 10


@pytest.mark.parametrize("key", ["max_peers", "max_pending", "max_hello", "max_groups",
                                 "event_queue_bytes", "max_connections"])
def test_limits_must_be_positive(key: str) -> None:
    with pytest.raises(ValueError, match=key):
        NodeConfig(**{key: 0})
