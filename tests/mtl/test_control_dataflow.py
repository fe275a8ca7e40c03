"""The MTL data flow as tables, without sockets: leases, summon/dismiss ordering,
routing for the test and mesh profiles, heartbeats and expiry."""

from __future__ import annotations

from pathlib import Path

import pytest

from peermesh.core import Core, Deliver, Send
from peermesh.mtl.credentials import CredentialsFile, User, make_user
from peermesh.mtl.dataflow import HANDLERS, DataFlow, MeshJoin, MeshLeave, MeshShout
from peermesh.mtl.profiles import MESH, TEST
from peermesh.wire.mtl import (Confirm, Content, Direction, Dismiss, Lease, Ping, Pong, Reject,
                               Response, Summon, decode_data, encode_data)

NOW = 1_800_000_000.0
R1, R2, W1 = b"reader-1", b"reader-2", b"writer-1"


@pytest.fixture
def users(tmp_path: Path) -> CredentialsFile:
    creds = CredentialsFile(tmp_path / "creds.json")
    alice = make_user("alice", "pw", read=["chat", "resource", "news.*"],
                      write=["chat", "resource"])
    creds.update(lambda u: u.__setitem__("alice", alice))
    creds.refresh(force=True)
    return creds


@pytest.fixture
def flow(users: CredentialsFile) -> DataFlow:
    return DataFlow(still_valid=users.still_valid, heartbeat=1.0, liveness=3, lease_ttl=30.0)


def alice(users: CredentialsFile) -> User:
    user = users.user("alice")
    assert user is not None
    return user


def lease(flow: DataFlow, users: CredentialsFile, identity: bytes, direction: Direction,
          resources: tuple[str, ...] = (), profile=MESH, namespace: str = "") -> str:
    grant = flow.grant(b"session", alice(users), profile, namespace, direction, resources,
                       "none", NOW)
    assert feed(flow, identity, Lease(1, grant.token)) == [(identity, Response(1, 200))]
    return grant.token


def feed(flow: DataFlow, identity: bytes, command: object, now: float = NOW) -> list:
    """Feed one command; what the flow sends, decoded."""
    frames = command if isinstance(command, list) else encode_data(command)  # type: ignore
    flow.handle(identity, frames, now)
    sends, _ = flow.take()
    return [(who, decode_data(f)) for who, f in sends]


def test_lease_unknown_token_is_403(flow: DataFlow) -> None:
    assert feed(flow, R1, Lease(7, "no-such-lease")) == [(R1, Response(7, 403))]
    assert flow.links == {}


def test_nothing_before_a_lease(flow: DataFlow) -> None:
    assert feed(flow, R1, Summon(1, "chat")) == [(R1, Response(1, 403))]
    assert feed(flow, R1, Dismiss(2, "chat")) == [(R1, Response(2, 403))]
    assert feed(flow, R1, Content(3, "chat", b"x")) == []
    assert feed(flow, R1, Confirm(3)) == []
    assert feed(flow, R1, Reject(3)) == []
    assert flow.links == {}


def test_second_lease_on_a_link_is_400(flow: DataFlow, users: CredentialsFile) -> None:
    token = lease(flow, users, R1, Direction.READ)
    assert feed(flow, R1, Lease(2, token)) == [(R1, Response(2, 400))]


def test_summon_response_comes_before_content_and_none_after_dismiss(
        flow: DataFlow, users: CredentialsFile) -> None:
    lease(flow, users, R1, Direction.READ, ("chat",))
    lease(flow, users, W1, Direction.WRITE, ("chat",))
    assert feed(flow, W1, Content(1, "", b"early")) == []  # nobody summoned yet
    assert feed(flow, R1, Summon(5, "chat")) == [(R1, Response(5, 200))]
    assert feed(flow, W1, Content(2, "", b"hello", {"k": 1})) == \
        [(R1, Content(1, "chat", b"hello", {"k": 1}))]
    assert feed(flow, R1, Summon(6, "chat")) == [(R1, Response(6, 400))]  # twice
    assert feed(flow, R1, Dismiss(7, "chat")) == [(R1, Response(7, 200))]
    assert feed(flow, W1, Content(3, "", b"late")) == []
    assert feed(flow, R1, Dismiss(8, "chat")) == [(R1, Response(8, 400))]  # twice


def test_summon_outside_the_lease_or_grants_is_400(flow: DataFlow,
                                                   users: CredentialsFile) -> None:
    lease(flow, users, R1, Direction.READ, ("chat",))
    assert feed(flow, R1, Summon(1, "news.eu")) == [(R1, Response(1, 400))]  # not in lease
    lease(flow, users, R2, Direction.READ)  # empty list: whatever alice may read
    assert feed(flow, R2, Summon(1, "news.eu")) == [(R2, Response(1, 200))]
    assert feed(flow, R2, Summon(2, "secret")) == [(R2, Response(2, 400))]


def test_writer_cannot_summon_reader_cannot_write(flow: DataFlow,
                                                  users: CredentialsFile) -> None:
    lease(flow, users, W1, Direction.WRITE, ("chat",))
    assert feed(flow, W1, Summon(1, "chat")) == [(W1, Response(1, 400))]
    lease(flow, users, R1, Direction.READ, ("chat",))
    assert feed(flow, R1, Content(1, "chat", b"x")) == []


def test_content_to_a_resource_not_granted_is_rejected(flow: DataFlow,
                                                       users: CredentialsFile) -> None:
    lease(flow, users, W1, Direction.WRITE)  # empty list: the resource is required
    assert feed(flow, W1, Content(4, "", b"x")) == [(W1, Reject(4))]
    assert feed(flow, W1, Content(5, "news.eu", b"x")) == [(W1, Reject(5))]  # read-only
    assert feed(flow, W1, Content(6, "chat", b"x")) == []


def test_test_profile_fans_out_from_all_writers_to_all_readers(
        flow: DataFlow, users: CredentialsFile) -> None:
    for reader in (R1, R2):
        lease(flow, users, reader, Direction.READ, (), TEST)
        assert feed(flow, reader, Summon(1, "resource")) == [(reader, Response(1, 200))]
    lease(flow, users, W1, Direction.WRITE, ("resource",), TEST)
    lease(flow, users, b"writer-2", Direction.WRITE, (), TEST)
    out = feed(flow, W1, Content(1, "", b"a")) + feed(flow, b"writer-2",
                                                      Content(1, "resource", b"b"))
    assert out == [(R1, Content(1, "resource", b"a")), (R2, Content(1, "resource", b"a")),
                   (R1, Content(2, "resource", b"b")), (R2, Content(2, "resource", b"b"))]
    assert flow.take()[1] == []  # the test profile never touches the mesh


def test_mesh_profile_shouts_joins_and_delivers_shouts(flow: DataFlow,
                                                       users: CredentialsFile) -> None:
    lease(flow, users, R1, Direction.READ, ("chat",), MESH, "lab.")
    flow.handle(R1, encode_data(Summon(1, "chat")), NOW)
    assert flow.take()[1] == [MeshJoin("lab.chat")]
    lease(flow, users, W1, Direction.WRITE, ("chat",), MESH, "lab.")
    flow.handle(W1, encode_data(Content(1, "", b"up")), NOW)
    sends, actions = flow.take()
    assert actions == [MeshShout("lab.chat", [b"up"])]
    assert [decode_data(f) for _, f in sends] == [Content(1, "chat", b"up")]
    flow.shouted("lab.chat", [b"from-peer"], "ab" * 16)
    flow.shouted("lab.other", [b"nobody reads"], "ab" * 16)
    flow.shouted("lab.chat", [b"two", b"frames"], "cd" * 16)
    sends, _ = flow.take()
    assert [decode_data(f) for _, f in sends] == [
        Content(2, "chat", b"from-peer", {"peer": "ab" * 16}),
        Content(3, "chat", b"two", {"peer": "cd" * 16, "more": [b"frames"]})]
    flow.handle(R1, encode_data(Dismiss(2, "chat")), NOW)
    assert flow.take()[1] == [MeshLeave("lab.chat")]


def test_ping_pong_and_dead_link(flow: DataFlow, users: CredentialsFile) -> None:
    token = lease(flow, users, R1, Direction.READ, ("chat",))
    feed(flow, R1, Summon(1, "chat"))
    assert feed(flow, R1, Ping()) == [(R1, Pong())]
    assert feed(flow, b"stranger", Ping()) == [(b"stranger", Pong())]
    assert flow.tick(NOW + 0.5) == NOW + 1.5 and flow.take()[0] == []
    flow.tick(NOW + 1.0)
    assert [(w, decode_data(f)) for w, f in flow.take()[0]] == [(R1, Ping())]
    feed(flow, R1, Pong(), NOW + 1.2)  # heard: alive
    flow.tick(NOW + 3.5)
    assert R1 in flow.links
    flow.tick(NOW + 4.3)  # silent for more than 3 heartbeats: unbound
    flow.take()
    assert R1 not in flow.links and ("mesh", "chat") not in flow.readers
    assert flow.grants[token].link is None
    # the client reconnects within the lease's time to live and presents it again
    assert feed(flow, R2, Lease(9, token), NOW + 10) == [(R2, Response(9, 200))]


def test_unbound_lease_expires(flow: DataFlow, users: CredentialsFile) -> None:
    grant = flow.grant(b"s", alice(users), MESH, "", Direction.READ, (), "none", NOW)
    flow.tick(NOW + 29)
    assert grant.token in flow.grants
    flow.tick(NOW + 30)
    assert grant.token not in flow.grants
    assert feed(flow, R1, Lease(1, grant.token)) == [(R1, Response(1, 403))]


def test_reconnect_takes_the_lease_over(flow: DataFlow, users: CredentialsFile) -> None:
    token = lease(flow, users, R1, Direction.READ, ("chat",))
    feed(flow, R1, Summon(1, "chat"))
    assert feed(flow, R2, Lease(1, token)) == [(R2, Response(1, 200))]
    assert R1 not in flow.links and ("mesh", "chat") not in flow.readers
    assert feed(flow, R1, Summon(2, "chat")) == [(R1, Response(2, 403))]


def test_revoked_user_loses_leases(flow: DataFlow, users: CredentialsFile) -> None:
    token = lease(flow, users, R1, Direction.READ, ("chat",))
    users.update(lambda u: u.pop("alice"))
    users.refresh(force=True)
    assert flow.revoke_invalid(NOW) == [token]
    assert flow.links == {} and flow.grants == {}


@pytest.mark.parametrize("frames", [
    [b"\x05"], [b"\x05", b"", b""], [b"\x01\x00", b""], [b"\xff", b""], [b"", b""],
    [b"\x03" + bytes(8) + b"\x05ab", b""], ["x", b""],
])
def test_ill_formed_commands_are_dropped_and_others_still_served(
        flow: DataFlow, users: CredentialsFile, frames: list) -> None:
    lease(flow, users, R1, Direction.READ, ("chat",))
    assert feed(flow, R1, frames) == []
    assert feed(flow, R1, Summon(3, "chat")) == [(R1, Response(3, 200))]


def test_repeated_unconfirmed_content_routes_the_same_way(flow: DataFlow,
                                                          users: CredentialsFile) -> None:
    lease(flow, users, R1, Direction.READ, ("chat",))
    feed(flow, R1, Summon(1, "chat"))
    lease(flow, users, W1, Direction.WRITE, ("chat",))
    out = []
    for i, command in enumerate([Content(1, "", b"a"), Content(2, "", b"b"),  # cached
                                 Content(3, "chat", b"c"), Content(4, "chat", b"d"),
                                 Content(5, "", b"e", {"p": 1})]):
        flow.handle(W1, encode_data(command), NOW)
        sends, actions = flow.take()
        out += [decode_data(f).body for _, f in sends]
        assert actions == [MeshShout("chat", [command.body])]
    assert out == [b"a", b"b", b"c", b"d", b"e"]
    assert len(flow.links[W1].passthrough) == 2
    flow.handle(W1, [b"\x05" + bytes(8) + b"\x00\x00\x00", "not bytes"], NOW)  # type: ignore
    assert flow.take() == ([], [])


def test_a_batch_is_taken_in_order_and_one_failing_command_costs_no_other(
        users: CredentialsFile, monkeypatch: pytest.MonkeyPatch) -> None:
    flow = DataFlow(still_valid=users.still_valid, batch_shouts=True)
    lease(flow, users, W1, Direction.WRITE, ("chat",))
    lease(flow, users, R1, Direction.READ, ("chat",))
    flow.handle(W1, encode_data(Content(1, "", b"first")), NOW)   # (the passthrough is set)
    flow.take()
    assert flow.outgoing == {"chat": [b"first"]}
    flow.outgoing.clear()

    def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setitem(HANDLERS, (Direction.READ, Ping), broken)
    batch = [(W1, encode_data(Content(2, "", b"before"))),      # nobody reads here yet
             (R1, encode_data(Ping())),                          # raises: logged
             (W1, None),                                         # over the limits: dropped
             (R1, encode_data(Summon(1, "chat"))),
             (W1, encode_data(Content(3, "", b"after"))),        # to the reader too
             (b"stranger", encode_data(Content(1, "chat", b"x")))]   # no lease: dropped
    flow.handle_batch(batch, NOW + 1)
    sends, actions = flow.take()
    assert [(who, decode_data(f)) for who, f in sends] == [
        (R1, Response(1, 200)), (R1, Content(1, "chat", b"after"))]
    assert actions == [MeshJoin("chat")]
    assert flow.outgoing == {"chat": [b"before", b"after"]}
    assert flow.links[W1].heard == flow.links[R1].heard == NOW + 1


def test_the_core_contract_returns_outputs(flow: DataFlow, users: CredentialsFile) -> None:
    """``receive`` / ``handle_timer`` / ``next_deadline`` (``peermesh.core``): what the
    flow asks for comes back as ``Send`` and ``Deliver`` outputs, nothing waits."""
    assert isinstance(flow, Core) and flow.next_deadline() is None   # nothing to watch yet
    grant = flow.grant(b"s", alice(users), MESH, "lab.", Direction.READ, ("chat",), "none", NOW)
    assert flow.next_deadline() == NOW + 1.0
    out = flow.receive(R1, encode_data(Lease(1, grant.token)), NOW)
    assert [(o.link, decode_data(o.frames)) for o in out if isinstance(o, Send)] == [
        (R1, Response(1, 200))]
    out = flow.receive(R1, encode_data(Summon(2, "chat")), NOW)
    assert [o for o in out if isinstance(o, Deliver)] == [Deliver(MeshJoin("lab.chat"))]
    assert flow.take() == ([], [])                                   # (all returned)
    assert flow.receive(b"stranger", [b"garbage"], NOW) == []       # dropped
    assert flow.receive(("not", "a connection"), [b"x"], NOW) == []  # no data link: dropped
    out = flow.handle_timer(NOW + 1.0)                               # quiet for a heartbeat
    assert [(o.link, decode_data(o.frames)) for o in out if isinstance(o, Send)] == [
        (R1, Ping())]
    assert len(out) == 1
    assert flow.next_deadline() == NOW + 2.0
    flow.handle_timer(NOW + 4.5)                 # silent: unbound, its lease lives on
    assert R1 not in flow.links and flow.next_deadline() == NOW + 5.5
    flow.handle_timer(NOW + 40)                  # the unbound lease expired: nothing to watch
    assert flow.grants == {} and flow.next_deadline() is None


def test_control_flow_on_the_core_contract(users: CredentialsFile, flow: DataFlow) -> None:
    """``ControlFlow.receive`` takes a REQ envelope from ``(identity, address)`` and returns
    the reply as one ``Send``; while another gateway serves, every request gets 503."""
    from peermesh.mtl.control import ControlFlow
    from peermesh.mtl.credentials import Authenticator
    from peermesh.wire.mtl import Failure, Open, Unauthorized, decode_reply, encode_request

    control = ControlFlow(Authenticator(users, ("SCRAM-SHA-256",)), flow)
    request = [b"", *encode_request(Open("/"))]
    (out,) = control.receive((b"c1", "10.0.0.9"), request, NOW)
    assert isinstance(out, Send) and out.link == b"c1" and out.frames[0] == b""
    assert isinstance(decode_reply(list(out.frames[1:])), Unauthorized)
    assert control.sessions[b"c1"].address == "10.0.0.9"
    assert control.receive((b"c1", "10.0.0.9"), request[1:], NOW) == []   # no envelope
    assert control.next_deadline() == NOW + 1.0
    control.serving, control.elsewhere = False, lambda: "tcp://10.0.0.2:5560"
    (out,) = control.receive((b"c2", ""), request, NOW)
    reply = decode_reply(list(out.frames[1:]))  # type: ignore[union-attr]
    assert isinstance(reply, Failure) and reply.status == 503 and "10.0.0.2" in reply.reason
    assert control.handle_timer(NOW + 400) == [] and control.sessions == {}
    assert control.next_deadline() is None
