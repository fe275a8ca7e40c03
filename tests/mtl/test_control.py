"""The MTL control-flow state machine as tables, without sockets.

Requests go in as the frames a client sends; replies are decoded with the
codec. Users live in a real credentials file under the test's tmp path;
SCRAM's client side is scramp's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest
import scramp

from peermesh.mtl.control import REFUSALS, TRANSITIONS, ControlFlow, State
from peermesh.mtl.credentials import Authenticator, CredentialsFile, User, make_user
from peermesh.mtl.dataflow import DataFlow
from peermesh.wire.mtl import (Authorize, Challenged, DataLease, Direction, Failure, LeaseRequest,
                               Ok, Open, Ready, Reply, SelectProfile, Unauthorized,
                               decode_reply, encode_request)

NOW = 1_800_000_000.0
ME = b"\x00client-1"
ADDRESS = "127.0.0.1"


class Harness:
    """A ControlFlow over a real credentials file; ``ask`` sends one request."""

    def __init__(self, tmp_path: Path, **options: object) -> None:
        self.path = tmp_path / "creds.json"
        self.credentials = CredentialsFile(self.path)
        self.add(make_user("alice", "wonderland", read=["chat", "news.*", "resource"],
                           write=["chat", "resource"]))
        self.add(make_user("bob", "builder", read=["resource"], write=["resource"]))
        mechanisms = ("SCRAM-SHA-256", "PLAIN") if options.get("plain") else ("SCRAM-SHA-256",)
        self.auth = Authenticator(self.credentials, mechanisms)
        self.data = DataFlow(still_valid=self.credentials.still_valid)
        self.control = ControlFlow(self.auth, self.data, **options)  # type: ignore[arg-type]
        self.control.data_port = 5556
        self.now = NOW

    def add(self, user: User) -> None:
        self.credentials.update(lambda users: users.__setitem__(user.name, user))
        self.credentials.refresh(force=True)

    def remove(self, name: str) -> None:
        self.credentials.update(lambda users: users.pop(name))
        self.credentials.refresh(force=True)

    def ask(self, request: object, identity: bytes = ME, address: str = ADDRESS) -> Reply:
        frames = encode_request(request) if not isinstance(request, list) else request
        answer = self.control.handle(identity, address, frames, self.now)
        assert answer is not None
        return decode_reply(answer)

    def state(self, identity: bytes = ME) -> State:
        return self.control.sessions[identity].state

    def scram(self, user: str, password: str, identity: bytes = ME,
              address: str = ADDRESS) -> Reply:
        client = scramp.ScramClient(["SCRAM-SHA-256"], user, password)
        reply = self.ask(Authorize("SCRAM-SHA-256", client.get_client_first().encode()),
                         identity, address)
        if isinstance(reply, Challenged):
            client.set_server_first(reply.challenge.decode())
            reply = self.ask(Authorize("SCRAM-SHA-256", client.get_client_final().encode()),
                             identity, address)
            if isinstance(reply, Ready):
                assert reply.additional is not None
                client.set_server_final(reply.additional.decode())  # the server is genuine
        return reply

    def login(self, user: str = "alice", password: str = "wonderland",
              profile: Optional[str] = "mesh", identity: bytes = ME) -> None:
        assert isinstance(self.ask(Open("/"), identity), Unauthorized)
        assert isinstance(self.scram(user, password, identity), Ready)
        if profile:
            assert self.ask(SelectProfile(profile), identity) == Ok()


@pytest.fixture
def gw(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


def test_table_covers_every_state() -> None:
    assert set(REFUSALS) == set(State)
    assert {state for state, _ in TRANSITIONS} == set(State)


def test_open_answers_401_with_scram_only_by_default(gw: Harness) -> None:
    assert gw.ask(Open("/")) == Unauthorized(("SCRAM-SHA-256",))
    assert gw.state() is State.OPENED


def test_plain_and_anonymous_offered_only_when_configured(tmp_path: Path) -> None:
    gw = Harness(tmp_path, plain=True, anonymous=True)
    assert gw.ask(Open("/")) == Unauthorized(("SCRAM-SHA-256", "PLAIN", "ANONYMOUS"))


def test_scram_success_is_a_challenge_round_then_201_with_server_final(gw: Harness) -> None:
    gw.ask(Open("/"))
    client = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "wonderland")
    first = gw.ask(Authorize("scram-sha-256", client.get_client_first().encode()))
    assert isinstance(first, Challenged) and first.mechanism == "SCRAM-SHA-256"
    assert gw.state() is State.CHALLENGED
    client.set_server_first(first.challenge.decode())
    ready = gw.ask(Authorize("SCRAM-SHA-256", client.get_client_final().encode()))
    assert isinstance(ready, Ready) and ready.profiles == ("test", "mesh")
    assert ready.additional is not None
    client.set_server_final(ready.additional.decode())  # raises if the server is not genuine
    assert gw.state() is State.READY


def test_empty_initial_response_gets_an_empty_challenge(gw: Harness) -> None:
    gw.ask(Open("/"))
    assert gw.ask(Authorize("SCRAM-SHA-256", b"")) == Challenged("SCRAM-SHA-256", b"")
    client = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "wonderland")
    reply = gw.ask(Authorize("SCRAM-SHA-256", client.get_client_first().encode()))
    assert isinstance(reply, Challenged) and reply.challenge.startswith(b"r=")


def test_wrong_password_is_401_and_the_session_stays_unauthenticated(gw: Harness) -> None:
    gw.ask(Open("/"))
    reply = gw.scram("alice", "not-the-password")
    assert isinstance(reply, Unauthorized) and reply.mechanisms == ("SCRAM-SHA-256",)
    assert gw.state() is State.OPENED
    assert isinstance(gw.ask(SelectProfile("mesh")), Unauthorized)


def test_unknown_user_fails_like_a_wrong_password(gw: Harness) -> None:
    gw.ask(Open("/"))
    assert isinstance(gw.scram("mallory", "x"), Unauthorized)


def test_mechanism_not_offered(gw: Harness) -> None:
    gw.ask(Open("/"))
    reply = gw.ask(Authorize("PLAIN", b"\x00alice\x00wonderland"))
    assert isinstance(reply, Unauthorized) and "not offered" in reply.reason
    assert gw.state() is State.OPENED


def test_plain_when_allowed(tmp_path: Path) -> None:
    gw = Harness(tmp_path, plain=True)
    gw.ask(Open("/"))
    assert isinstance(gw.ask(Authorize("PLAIN", b"\x00alice\x00wonderland")), Ready)
    gw.ask(Open("/"))
    assert isinstance(gw.ask(Authorize("PLAIN", b"\x00alice\x00nope")), Unauthorized)


def test_anonymous_gets_the_anonymous_users_grants(tmp_path: Path) -> None:
    gw = Harness(tmp_path, anonymous=True)
    gw.ask(Open("/"))
    assert isinstance(gw.ask(Authorize("ANONYMOUS", b"trace")), Unauthorized)  # no such user
    gw.add(make_user("anonymous", "unused-secret", read=["public"]))
    gw.ask(Open("/"))
    assert isinstance(gw.ask(Authorize("ANONYMOUS", b"")), Ready)
    gw.ask(SelectProfile("mesh"))
    assert isinstance(gw.ask(LeaseRequest(Direction.READ, ("public",))), DataLease)
    assert gw.ask(LeaseRequest(Direction.WRITE, ("public",))).status == 403  # type: ignore


def test_throttled_after_repeated_failures(gw: Harness) -> None:
    for _ in range(4):
        gw.ask(Open("/"))
        assert isinstance(gw.scram("alice", "wrong"), Unauthorized)
    gw.ask(Open("/"))  # the fifth failure: from now on each attempt must wait
    reply = gw.scram("alice", "wrong")
    assert isinstance(reply, Failure) and reply.status == 429
    gw.ask(Open("/"))  # even the right password, too soon
    assert gw.scram("alice", "wonderland").status == 429  # type: ignore[union-attr]
    gw.now += 3600  # the throttle forgets
    gw.ask(Open("/"))
    assert isinstance(gw.scram("alice", "wonderland"), Ready)
    assert gw.control.logins == {"ok": 1, "failed": 4, "throttled": 2}  # (the metrics)


def test_another_hosts_failures_do_not_lock_a_user_out(gw: Harness) -> None:
    """An attacker failing alice's logins every 0.2 s from its own address is throttled;
    alice, logging in from hers meanwhile, never gets 429."""
    attacker, mallory = "192.0.2.66", b"mallory-identity"
    statuses = []
    for _ in range(70):
        gw.ask(Open("/"), mallory, attacker)
        reply = gw.scram("alice", "guess", mallory, attacker)
        statuses.append(reply.status if isinstance(reply, Failure) else 401)
        gw.ask(Open("/"))
        assert isinstance(gw.scram("alice", "wonderland"), Ready)
        gw.now += 0.2
    assert statuses.count(429) > 50          # the attacker waits, doubling to 60 s


# (state, request) -> the status answered, for requests a state does not take
REFUSED = [
    (None, SelectProfile("mesh"), 400),
    (None, Authorize("SCRAM-SHA-256", b"n,,n=alice,r=x"), 400),
    (None, LeaseRequest(Direction.READ), 400),
    ("opened", SelectProfile("mesh"), 401),
    ("opened", LeaseRequest(Direction.WRITE), 401),
    ("ready", LeaseRequest(Direction.READ), 400),
]


@pytest.mark.parametrize("stage, request_, status", REFUSED)
def test_refusals(gw: Harness, stage: Optional[str], request_: object, status: int) -> None:
    if stage == "opened":
        gw.ask(Open("/"))
    elif stage == "ready":
        gw.login(profile=None)
    reply = gw.ask(request_)
    code = 401 if isinstance(reply, Unauthorized) else reply.status  # type: ignore[union-attr]
    assert code == status


def test_open_checks_protocol_and_virtual_host(tmp_path: Path) -> None:
    gw = Harness(tmp_path, virtual_hosts={"test-env": "env."})
    assert gw.ask(Open("/")).status == 400  # type: ignore[union-attr]
    assert gw.ask(Open("test-env", "AMQP", 1)).status == 400  # type: ignore[union-attr]
    assert gw.ask(Open("test-env", "MTL", 2)).status == 400  # type: ignore[union-attr]
    assert isinstance(gw.ask(Open("test-env", "mtl", 1)), Unauthorized)


def test_profile_ok_and_unknown(gw: Harness) -> None:
    gw.login(profile=None)
    assert gw.ask(SelectProfile("nope")).status == 400  # type: ignore[union-attr]
    assert gw.ask(SelectProfile("TEST")) == Ok()
    assert gw.state() is State.PROFILED


def test_reader_and_writer_get_a_lease_on_the_data_port(gw: Harness) -> None:
    gw.login()
    reader = gw.ask(LeaseRequest(Direction.READ, ("chat", "news.eu")))
    writer = gw.ask(LeaseRequest(Direction.WRITE, ("chat",)))
    assert isinstance(reader, DataLease) and isinstance(writer, DataLease)
    assert reader.port == writer.port == 5556 and reader.lease != writer.lease
    grant = gw.data.grants[reader.lease]
    assert (grant.direction, grant.resources, grant.user.name) == \
        (Direction.READ, ("chat", "news.eu"), "alice")


def test_ungranted_resource_is_403(gw: Harness) -> None:
    gw.login()
    assert gw.ask(LeaseRequest(Direction.WRITE, ("news.eu",))).status == 403  # type: ignore
    assert gw.ask(LeaseRequest(Direction.READ, ("secret",))).status == 403  # type: ignore


def test_unsupported_confirm_is_501(gw: Harness) -> None:
    gw.login(profile="test")
    assert gw.ask(LeaseRequest(Direction.READ, (), "full")) == \
        Failure(501, "profile test does not offer confirm 'full'")
    assert gw.ask(LeaseRequest(Direction.READ, (), "partial")).status == 501  # type: ignore
    gw.ask(SelectProfile("mesh"))  # no store: no confirm full either
    assert gw.ask(LeaseRequest(Direction.READ, (), "full")).status == 501  # type: ignore


def test_test_profile_has_one_resource(gw: Harness) -> None:
    gw.login(profile="test")
    assert isinstance(gw.ask(LeaseRequest(Direction.READ, ("resource",))), DataLease)
    assert gw.ask(LeaseRequest(Direction.READ, ("chat",))).status == 400  # type: ignore


def test_invalid_requests_get_400_ill_formed_get_nothing(gw: Harness) -> None:
    assert gw.ask([b"Connection.Close", b"{}"]).status == 400  # type: ignore[union-attr]
    assert gw.ask([b"Connection.Open", b"[1]"]).status == 400  # type: ignore[union-attr]
    for frames in ([b"Connection.Open"], [b"Connection.Open", b"{"], [b"x", b"{}", b""]):
        assert gw.control.handle(ME, ADDRESS, frames, NOW) is None


def test_reauthentication_keeps_profile_and_leases(gw: Harness) -> None:
    gw.login()
    lease = gw.ask(LeaseRequest(Direction.READ, ("chat",)))
    assert isinstance(lease, DataLease)
    assert isinstance(gw.scram("alice", "wonderland"), Ready)
    assert gw.state() is State.PROFILED and lease.lease in gw.data.grants


def test_reauthentication_as_another_user_drops_leases(gw: Harness) -> None:
    gw.login()
    lease = gw.ask(LeaseRequest(Direction.READ, ("chat",)))
    assert isinstance(gw.scram("bob", "builder"), Ready)
    assert gw.state() is State.READY and lease.lease not in gw.data.grants  # type: ignore


def test_failed_reauthentication_drops_everything(gw: Harness) -> None:
    gw.login()
    lease = gw.ask(LeaseRequest(Direction.READ, ("chat",)))
    assert isinstance(gw.scram("alice", "guess"), Unauthorized)
    assert gw.state() is State.OPENED and lease.lease not in gw.data.grants  # type: ignore


def test_changed_credentials_get_401_then_reauthentication_works(gw: Harness) -> None:
    gw.login()
    lease = gw.ask(LeaseRequest(Direction.READ, ("chat",)))
    gw.add(make_user("alice", "new-password", read=["chat"]))
    reply = gw.ask(LeaseRequest(Direction.READ, ("chat",)))
    assert isinstance(reply, Unauthorized) and "changed" in reply.reason
    assert lease.lease not in gw.data.grants  # type: ignore[union-attr]
    assert isinstance(gw.scram("alice", "wonderland"), Unauthorized)
    assert isinstance(gw.scram("alice", "new-password"), Ready)
    assert gw.ask(SelectProfile("mesh")) == Ok()


def test_expired_user_and_session_lifetime_get_401(tmp_path: Path) -> None:
    gw = Harness(tmp_path, session_lifetime=60.0)
    gw.login()
    gw.now += 61
    assert isinstance(gw.ask(SelectProfile("test")), Unauthorized)
    gw.add(make_user("carol", "pw", read=["chat"], expires=NOW + 100))
    gw.login("carol", "pw")
    gw.now += 200
    assert isinstance(gw.ask(LeaseRequest(Direction.READ, ("chat",))), Unauthorized)


def test_sessions_are_bounded_and_idle_ones_expire(tmp_path: Path) -> None:
    gw = Harness(tmp_path, max_sessions=2, session_idle=10.0)
    gw.login(identity=b"a")
    gw.ask(LeaseRequest(Direction.READ, ("chat",)), b"a")
    gw.ask(Open("/"), b"b")
    gw.ask(Open("/"), b"c")  # evicts b (no leases); a keeps its lease
    assert set(gw.control.sessions) == {b"a", b"c"}
    gw.ask(Open("/"), b"d")
    assert set(gw.control.sessions) == {b"a", b"d"}
    gw.now += 11
    gw.control.expire(gw.now)
    assert set(gw.control.sessions) == {b"a"}  # its lease still lives
    gw.now += 31
    gw.data.tick(gw.now)  # the unbound lease expired
    gw.control.expire(gw.now)
    assert gw.control.sessions == {}
