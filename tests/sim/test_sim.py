"""The simulated network: real nodes on virtual time, partitions, loss, timeouts."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import gevent
import pytest

from peermesh.events import EventType
from peermesh.sim import Simulation
from peermesh.sim.commands import LARGE_RUN, _progress_printer, large_run_estimate
from peermesh.sim.network import JITTER_STEPS

ENTER, EXIT, EVASIVE, SILENT = EventType.ENTER, EventType.EXIT, EventType.EVASIVE, EventType.SILENT


@pytest.fixture
def make_sim():
    sims: list[Simulation] = []

    def make(nodes: int, **kw) -> Simulation:
        sim = Simulation(nodes, keep_events=True, seed=7, **kw).start()
        sims.append(sim)
        return sim

    yield make
    for sim in sims:
        sim.stop()


def events_of(sim: Simulation, kind: EventType, since: float = 0.0):
    return [(at, node, event) for at, node, event in sim.events
            if event.type is kind and at >= since]


def test_nodes_mesh_fully_at_once_and_talk(make_sim):
    sim = make_sim(8, latency=0.002)
    assert sim.run_until(sim.is_full_mesh, limit=2.0)
    assert sim.converged_at is not None and sim.converged_at >= 0.004  # two latencies
    a, b = sim.nodes[0], sim.nodes[-1]
    a.join("g")
    sim.run(0.1)
    a.whisper(b.uuid, b"hello")
    b.shout("g", b"to the group")
    sim.run(0.1)
    whispers = [e for _, n, e in sim.events if n is b and e.type is EventType.WHISPER]
    assert [e.frames for e in whispers] == [(b"hello",)]
    got_shout = {n for _, n, e in sim.events if e.type is EventType.SHOUT}
    assert got_shout == {a}  # only the member gets a shout, whoever sends it


def test_partition_gives_exit_on_both_sides_then_enter_after_heal(make_sim):
    sim = make_sim(6, interval=1.0, evasive=5.0, silent=10.0, expired=30.0)
    assert sim.run_until(sim.is_full_mesh, limit=2.0)
    left, right = sim.partition(2)
    split_at = sim.clock.now()
    sim.run(29.0)
    assert events_of(sim, EXIT, split_at) == []  # nothing expires early
    sim.run(3.0)
    exits = events_of(sim, EXIT, split_at)
    pairs = {(node.uuid, event.peer) for _, node, event in exits}
    across = {(x.uuid, y.uuid) for x in left for y in right} | \
             {(y.uuid, x.uuid) for x in left for y in right}
    assert pairs == across  # every node lost exactly the other island, both ways
    assert all(event.reason == "expired" for _, _, event in exits)
    assert all(split_at + 29.0 <= at <= split_at + 32.0 for at, _, _ in exits)
    assert not sim.is_full_mesh()
    sim.heal()
    healed_at = sim.clock.now()
    assert sim.run_until(sim.is_full_mesh, limit=3.0)
    enters = {(node.uuid, event.peer) for _, node, event in events_of(sim, ENTER, healed_at)}
    assert enters == across


def test_silence_is_reported_evasive_then_silent_then_exit_on_virtual_time(make_sim):
    sim = make_sim(3, interval=1.0, evasive=5.0, silent=10.0, expired=30.0)
    assert sim.run_until(sim.is_full_mesh, limit=2.0)
    dead = sim.nodes[2]
    # A crash: the node's greenlets stop, no port-0 beacon, its mailbox vanishes.
    gevent.killall(dead._greenlets + [g for d in dead._discovery for g in d._greenlets])
    dead._mailbox.close()
    crashed_at = sim.clock.now()
    sim.run(40.0)
    for survivor in sim.nodes[:2]:
        seen = [(at - crashed_at, e.type) for at, n, e in sim.events
                if n is survivor and e.peer == dead.uuid and e.type is not ENTER]
        kinds = [kind for _, kind in seen]
        assert kinds == [EVASIVE, SILENT, EXIT], seen
        times = dict((kind, at) for at, kind in seen)
        assert 4.0 <= times[EVASIVE] <= 6.5
        assert 9.0 <= times[SILENT] <= 11.5
        assert 29.0 <= times[EXIT] <= 31.5


def test_beacon_loss_slows_nothing_that_matters(make_sim):
    sim = make_sim(10, loss=0.3)
    assert sim.run_until(sim.is_full_mesh, limit=10.0)
    sim.run(5.0)
    report = sim.report()
    assert report["beacons"]["lost"] > 0
    assert report["messages"]["lost"] == 0
    assert report["events"].get("EXIT", 0) == 0  # 30% loss never looks like a dead peer


def test_complete_follows_every_enter_and_exit(make_sim):
    assert make_sim(1).is_full_mesh() and make_sim(1).complete() == 1  # no one to meet
    sim = make_sim(5, interval=1.0, evasive=5.0, silent=10.0, expired=30.0)

    def full_views() -> int:
        return sum(1 for node in sim.nodes if len(node.peers()) == 4)

    assert sim.run_until(sim.is_full_mesh, limit=2.0)
    assert sim.complete() == full_views() == 5
    sim.partition([sim.nodes[:1]])  # one node alone: every view loses a peer
    sim.run(32.0)
    assert sim.complete() == full_views() == 0 and not sim.is_full_mesh()
    assert sim.counts["EXIT"] == 8
    sim.heal()
    assert sim.run_until(sim.is_full_mesh, limit=3.0)
    assert sim.complete() == full_views() == 5


def test_links_can_change_during_a_run(make_sim):
    sim = make_sim(4)
    assert sim.run_until(sim.is_full_mesh, limit=1.0)
    a, b = sim.nodes[:2]
    sim.network.set_link(sim.address(a), sim.address(b), latency=0.5)
    sent_at = sim.clock.now()
    a.whisper(b.uuid, b"slow")
    sim.run(0.4)
    assert not [e for _, n, e in sim.events if n is b and e.type is EventType.WHISPER]
    sim.run(0.2)
    got = [(at, e) for at, n, e in sim.events if n is b and e.type is EventType.WHISPER]
    assert len(got) == 1 and got[0][0] - sent_at == pytest.approx(0.5, abs=0.06)


def test_same_seed_same_story():
    reports = []
    for _ in range(2):
        sim = Simulation(12, loss=0.2, jitter=0.01, seed=42).start()
        sim.run(3.0)
        report = sim.report()
        sim.stop()
        report.pop("memory_per_node_bytes")
        reports.append(report)
    assert reports[0] == reports[1]


def test_progress_is_reported_inside_one_virtual_instant():
    sim = Simulation(70, latency=0.001, seed=5)  # 4,830 ENTERs, all at one instant
    calls: list[tuple[int, float]] = []
    sim.watch(lambda s: calls.append((s.entered, s.clock.now())), every=0.0)
    sim.start()
    assert sim.run_until(sim.is_full_mesh, limit=2.0)
    sim.stop()
    assert sim.entered == 70 * 69 and sim.complete() == 70
    # between steps it could only see none or all of them: this call came from inside one
    assert any(0 < entered < 70 * 69 for entered, _ in calls), calls


def test_the_gc_is_paused_only_while_time_advances():
    sim = Simulation(3, seed=1).start()
    seen: list[bool] = []
    sim.clock.call_at(0.5, lambda: seen.append(gc.isenabled()))
    sim.run(1.0)
    sim.stop()
    assert seen == [False] and gc.isenabled()


def test_simulate_command_reports_json():
    out = subprocess.run(
        [sys.executable, "-m", "peermesh", "simulate", "--nodes", "12", "--duration", "40",
         "--partition", "2:33", "--latency", "1", "--seed", "3", "--json"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["nodes"] == 12 and report["full_mesh"] is True
    assert report["events"]["EXIT"] == 2 * 6 * 6  # both islands lost the other, both ways
    assert "partition into 2 islands" in out.stderr and "healed" in out.stderr


def test_jitter_takes_a_few_even_steps_and_keeps_order(make_sim):
    sim = make_sim(2, latency=0.01, jitter=0.004)
    assert sim.run_until(sim.is_full_mesh, limit=1.0)
    a, b = sim.nodes
    sent_at = sim.clock.now()
    for i in range(60):
        a.whisper(b.uuid, b"%d" % i)
    sim.run(0.1)
    got = [(at, e.frames) for at, n, e in sim.events if n is b and e.type is EventType.WHISPER]
    assert [content for _, content in got] == [(b"%d" % i,) for i in range(60)]
    steps = {round((at - sent_at - 0.01) / (0.004 / JITTER_STEPS), 6) for at, _ in got}
    assert steps <= set(range(JITTER_STEPS + 1)) and len(steps) > 1


def test_simulate_with_latency_jitter_and_loss_converges_and_shows_each_state_once():
    out = subprocess.run(
        [sys.executable, "-m", "peermesh", "simulate", "--nodes", "20", "--duration", "4",
         "--latency", "1", "--jitter", "1", "--loss", "0.02", "--seed", "3", "--json"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["full_mesh"] is True and report["beacons"]["lost"] > 0
    times = [line[:9] for line in out.stderr.splitlines() if line.startswith("t=")]
    assert len(set(times)) == len(times), out.stderr  # each virtual second once
    assert {f"t={t:6.1f}s" for t in (1, 2, 3, 4)} <= set(times), out.stderr


def test_progress_lines_show_each_state_once(capsys):
    sim = Simulation(3, seed=1).start()
    progress = _progress_printer(0.0)
    progress(sim)
    progress(sim)  # the per-second line and the wall-time watcher at one instant
    sim.run(1.0)
    progress(sim)
    sim.stop()
    lines = capsys.readouterr().err.splitlines()
    assert [line[:9] for line in lines] == ["t=   0.0s", "t=   1.0s"], lines


def test_a_large_run_is_announced_with_its_likely_cost():
    assert large_run_estimate(LARGE_RUN, 10, 1.0) is None
    text = large_run_estimate(100_000, 10, 1.0)
    assert text is not None and text.startswith("100000 nodes") and "GiB" in text
    assert "days" in text


@pytest.mark.parametrize("argv, message", [
    (["--nodes", "0"], "--nodes must be at least 1"),
    (["--latency", "-1"], "--latency must be"),
    (["--jitter", "nan"], "--jitter must be"),
    (["--loss", "2"], "--loss must be a probability within 0..1"),
    (["--duration", "inf"], "--duration must be"),
    (["--partition", "x"], "AT:DURATION"),
    (["--partition", "1:nan"], "argument --partition"),
])
def test_simulate_command_misuse_is_a_clear_error(argv, message):
    out = subprocess.run([sys.executable, "-m", "peermesh", "simulate", *argv],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_flush_and_stop_wait_on_virtual_time(make_sim):
    sim = make_sim(3, latency=0.01)
    assert sim.run_until(sim.is_full_mesh, limit=2.0)
    a, b, c = sim.nodes
    a.whisper(b.uuid, b"answered")
    flushing = gevent.spawn(a.flush, 10.0)
    sim.run(0.1)  # a PING and its PING-OK: two latencies of virtual time
    assert flushing.dead and flushing.value is True

    sim.partition([[a], [b, c]])
    a.whisper(b.uuid, b"lost")
    flushing = gevent.spawn(a.flush, 10.0)
    sim.run(9.9)
    assert not flushing.dead  # no PING-OK can come: it waits out its 10 virtual seconds
    sim.run(0.2)
    assert flushing.dead and flushing.value is False

    a.whisper(c.uuid, b"lost too")
    stopping = gevent.spawn(a.stop, 5.0)
    sim.run(5.1)
    assert stopping.dead and stopping.exception is None and not a.running


# --------------------------------------------------------------------------
# Caps that follow what a node can hold; a report that adds up


def test_simulated_nodes_have_no_descriptor_caps_whatever_config_they_get(make_sim):
    from peermesh.config import UNBOUNDED_PEERS, NodeConfig

    sim = make_sim(3, config=NodeConfig())  # as `peermesh simulate` passes one
    for node in sim.nodes:
        assert node.config.max_peers == node._session.max_peers == UNBOUNDED_PEERS
    capped = make_sim(3, max_peers=40)      # a cap asked for is kept
    assert {node.config.max_peers for node in capped.nodes} == {40}


def test_a_hundred_nodes_booting_at_once_are_all_taken_in_their_first_round(make_sim):
    sim = make_sim(150)  # every node hears 149 beacons in one instant: none is ignored
    assert sim.run_until(sim.is_full_mesh, limit=1.0)
    for node in sim.nodes:
        stats = node._session.counters.snapshot()
        assert stats["pending_refused"] == stats["peers_refused"] == 0, stats


def test_the_reports_counts_add_up(make_sim):
    sim = make_sim(30, latency=0.001, jitter=0.001, loss=0.05)
    sim.run(3.0)
    # stop while some beacons are on their way (1-2 ms each)
    assert sim.run_until(lambda: sim.network.beacons_in_flight > 0, limit=2.0, step=0.0002)
    report = sim.report()
    for kind in ("messages", "beacons"):
        counts = report[kind]
        assert counts["sent"] == counts["delivered"] + counts["lost"] + counts["in_flight"], \
            (kind, counts)
    assert report["beacons"]["in_flight"] > 0


def test_hellos_from_the_hosts_their_endpoints_name_need_no_other_proof(make_sim):
    # Each node that starts after the others hears their HELLOs before any of their
    # beacons: far more than max_unproven. Each comes from the host its endpoint names,
    # which the simulated mailbox tells (as "Peer-Address" would): all enter in the first
    # round, with no PING and no HELLO held for a beacon.
    sim = make_sim(40, max_unproven=4)
    assert sim.run_until(sim.is_full_mesh, limit=0.5)  # the next beacons go at 1 s
    for node in sim.nodes:
        session = node._session
        stats = session.counters.snapshot()
        assert stats["unproven_refused"] == stats["unproven_shed"] == 0, stats
        assert not session.unproven and session.sent_control == 0
    assert sim.nodes[-1]._session.source is not None


def test_a_simulated_node_no_one_hears_messages_of_takes_a_batch_in_one_call(make_sim):
    """As a real node's queue, the simulation's sink takes a batch's events at once, so a
    node with no message listener runs the batch path a real one runs."""
    sim = make_sim(2)
    assert sim.run_until(sim.is_full_mesh, limit=5.0)
    node = sim.nodes[1]
    for listener in list(node._listeners):
        node.remove_listener(listener)
    assert node._session.batch_sink is not None
