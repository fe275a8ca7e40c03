"""The MTL credentials file, SASL exchanges against it and failed-attempt throttling."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path
from typing import Any, Optional

import pytest
import scramp

from peermesh.errors import PeermeshError
from peermesh.mtl.credentials import (Authenticator, CredentialsError, CredentialsFile,
                                      FailureTable, SaslStep, Throttle, User, Verifier,
                                      dump_credentials, make_user, parse_time)

NOW = 1_800_000_000.0        # Unix time the tests run at
ADDRESS = "tcp://192.0.2.7:40000"


def credentials(tmp_path: Path, *users: User) -> CredentialsFile:
    creds = CredentialsFile(tmp_path / "creds.json")

    def add(table: dict[str, User]) -> None:
        table.update((u.name, u) for u in users)

    creds.update(add)
    return creds


def scram_login(auth: Authenticator, name: str, password: str, now: float = NOW,
                client: str = ADDRESS) -> SaslStep:
    """A whole SCRAM-SHA-256 exchange with scramp's client; the last step."""
    exchange = auth.begin("scram-sha-256", client, now)
    client_side = scramp.ScramClient(["SCRAM-SHA-256"], name, password)
    step = exchange.respond(client_side.get_client_first().encode(), now)
    if step.done:
        return step
    assert step.challenge is not None
    client_side.set_server_first(step.challenge.decode())
    step = exchange.respond(client_side.get_client_final().encode(), now)
    if step.user is not None:
        assert step.additional is not None
        client_side.set_server_final(step.additional.decode())   # the server proved itself
    return step


def plain_login(auth: Authenticator, name: str, password: str, now: float = NOW,
                authzid: str = "") -> SaslStep:
    exchange = auth.begin("PLAIN", ADDRESS, now)
    return exchange.respond(f"{authzid}\0{name}\0{password}".encode(), now)


ALICE = make_user("alice", "correct horse", read=["chat", "sensors.*"], write=["chat"])


def test_rfc7677_vector_through_the_file_and_the_authenticator(tmp_path: Path) -> None:
    # RFC 7677 section 3: user "user", password "pencil", salt, 4096 iterations, nonces
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    made = scramp.ScramMechanism("SCRAM-SHA-256").make_auth_info("pencil", 4096, salt)
    creds = credentials(tmp_path, User("user", Verifier(*made), read=("*",)))
    again = CredentialsFile(creds.path)                     # read back from the file
    auth = Authenticator(again)
    exchange = auth.begin("SCRAM-SHA-256", ADDRESS, NOW, nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    step = exchange.respond(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO", NOW)
    assert step.challenge == (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                              b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    step = exchange.respond(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                            b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=", NOW)
    assert step.additional == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert step.done and step.failure is None and step.user is not None
    assert step.user.name == "user" and step.user.may_read("anything")


def test_scram_and_plain_succeed_and_fail(tmp_path: Path) -> None:
    auth = Authenticator(credentials(tmp_path, ALICE), mechanisms=("SCRAM-SHA-256", "plain"))
    assert auth.mechanisms == ("SCRAM-SHA-256", "PLAIN")
    ok = scram_login(auth, "alice", "correct horse")
    assert ok.user == ALICE and ok.failure is None
    wrong = scram_login(auth, "alice", "battery staple")
    assert wrong.user is None and wrong.failure and wrong.done
    # an unknown user gets a server-first message like anyone (a decoy verifier) and
    # fails at the proof, so the answer does not tell which names exist
    exchange = auth.begin("SCRAM-SHA-256", ADDRESS, NOW)
    client_side = scramp.ScramClient(["SCRAM-SHA-256"], "mallory", "x")
    first = exchange.respond(client_side.get_client_first().encode(), NOW)
    assert first.challenge and b",i=4096" in first.challenge
    client_side.set_server_first(first.challenge.decode())
    last = exchange.respond(client_side.get_client_final().encode(), NOW)
    assert last.user is None and last.failure == "unknown or expired user"

    assert plain_login(auth, "alice", "correct horse").user == ALICE
    assert plain_login(auth, "alice", "correct horse", authzid="alice").user == ALICE
    for step in (plain_login(auth, "alice", "wrong"), plain_login(auth, "bob", "correct horse"),
                 plain_login(auth, "alice", "correct horse", authzid="root")):
        assert step.user is None and step.failure
    garbled = auth.begin("PLAIN", ADDRESS, NOW).respond(b"alice\0correct horse", NOW)
    assert garbled.failure == "malformed PLAIN message"


def test_an_empty_first_response_gets_an_empty_challenge(tmp_path: Path) -> None:
    auth = Authenticator(credentials(tmp_path, ALICE), mechanisms=("PLAIN",))
    exchange = auth.begin("PLAIN", ADDRESS, NOW)
    assert exchange.respond(b"", NOW) == SaslStep(challenge=b"")
    assert exchange.respond(b"\0alice\0correct horse", NOW).user == ALICE
    assert exchange.respond(b"\0alice\0correct horse", NOW).failure == "the exchange has ended"


def test_hostile_scram_messages_fail_the_exchange(tmp_path: Path) -> None:
    auth = Authenticator(credentials(tmp_path, ALICE))
    for first in (b"\xff\xfe", b"garbage", b"n,,n=alice", b"y,,m=ext,n=alice,r=abc",
                  b"n,a=bob,n=alice,r=abc", b"n,,n=,r=abc", b"n,,n=alice,r=a,b"):
        step = auth.begin("SCRAM-SHA-256", f"10.0.0.{len(first)}", NOW).respond(first, NOW)
        assert step.failure and step.user is None and step.done, first
    exchange = auth.begin("SCRAM-SHA-256", "10.0.1.1", NOW)
    assert exchange.respond(b"n,,n=alice,r=abc", NOW).challenge
    bad_final = exchange.respond(b"c=biws,r=wrongnonce,p=AAAA", NOW)
    assert bad_final.failure and bad_final.user is None


def test_mechanisms_not_offered_are_refused(tmp_path: Path) -> None:
    auth = Authenticator(credentials(tmp_path, ALICE))
    assert auth.offers("scram-sha-256") and not auth.offers("PLAIN")
    with pytest.raises(CredentialsError, match="not offered"):
        auth.begin("PLAIN", ADDRESS, NOW)
    with pytest.raises(CredentialsError, match="DIGEST-MD5"):
        Authenticator(auth.credentials, mechanisms=("DIGEST-MD5",))
    assert issubclass(CredentialsError, PeermeshError)


def test_expiry(tmp_path: Path) -> None:
    soon = make_user("bob", "pw", read=["*"], expires=NOW + 60)
    creds = credentials(tmp_path, soon)
    auth = Authenticator(creds)
    bob = scram_login(auth, "bob", "pw", now=NOW).user
    assert bob is not None and creds.still_valid(bob, NOW)
    assert not creds.still_valid(bob, NOW + 60)
    late = scram_login(auth, "bob", "pw", now=NOW + 61)
    assert late.user is None and late.failure == "unknown or expired user"
    assert plain_login(Authenticator(creds, ("PLAIN",)), "bob", "pw", now=NOW + 61).user is None
    # the file keeps the expiry as UTC text and reads it back to the second
    entry = json.loads(creds.path.read_bytes())["users"]["bob"]
    assert entry["expires"] == "2027-01-15T08:01:00Z"
    assert CredentialsFile(creds.path).user("bob") == soon


def test_reload_tells_changed_and_removed_users(tmp_path: Path) -> None:
    creds = credentials(tmp_path, ALICE, make_user("bob", "pw"))
    gateway = CredentialsFile(creds.path)              # the gateway's own copy
    generation = gateway.generation
    alice = gateway.user("alice")
    assert alice is not None and gateway.still_valid(alice, NOW)
    assert gateway.refresh() is False and gateway.generation == generation

    def new_password(users: dict[str, User]) -> None:
        users["alice"] = make_user("alice", "new", read=list(ALICE.read))

    creds.update(new_password)
    assert gateway.refresh() is True and gateway.generation == generation + 1
    assert not gateway.still_valid(alice, NOW)         # the gateway sends 401
    assert scram_login(Authenticator(gateway), "alice", "new").user is not None

    bob = gateway.user("bob")
    assert bob is not None
    creds.update(lambda users: users.pop("bob"))
    assert gateway.refresh() and gateway.user("bob") is None
    assert not gateway.still_valid(bob, NOW)

    # a broken file is refused; what was read before stays in force
    creds.path.write_text("{ not json")
    with pytest.raises(CredentialsError, match="is not valid JSON"):
        gateway.refresh()
    assert gateway.user("alice") is not None
    creds.path.unlink()
    assert gateway.refresh() and gateway.users == {}


def test_the_file_is_written_atomically_and_private(tmp_path: Path) -> None:
    creds = credentials(tmp_path, ALICE)
    assert stat.S_IMODE(os.stat(creds.path).st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["creds.json", "creds.json.lock"]
    text = creds.path.read_text()
    assert "correct horse" not in text and '"stored-key"' in text
    assert CredentialsFile(creds.path).users == {"alice": ALICE}
    assert CredentialsFile(tmp_path / "missing.json").users == {}


def test_grants_are_patterns() -> None:
    assert ALICE.may_read("chat") and ALICE.may_read("sensors.kitchen")
    assert not ALICE.may_read("sensors") and not ALICE.may_read("Chat")
    assert ALICE.may_write("chat") and not ALICE.may_write("sensors.kitchen")
    nobody = make_user("eve", "pw")
    assert not nobody.may_read("chat") and not nobody.may_write("")


@pytest.mark.parametrize("kwargs, message", [
    ({"name": ""}, "must be 1..255 printable"),
    ({"name": "a\nb"}, "must be 1..255 printable"),
    ({"name": "x" * 256}, "must be 1..255 printable"),
    ({"name": "\uff41lice"}, "not in SASLprep form"),
    ({"password": ""}, "password must not be empty"),
    ({"password": "a\u0007b"}, "password cannot be used"),
    ({"read": [""]}, "read pattern"),
    ({"write": [3]}, "write pattern"),
    ({"iterations": 100}, "iteration count"),
    ({"expires": float("nan")}, "must be a Unix time"),
])
def test_make_user_refuses_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {"name": "alice", "password": "pw", **kwargs}
    with pytest.raises(CredentialsError, match=message):
        make_user(**arguments)


def _entry(**changes: Any) -> dict[str, Any]:
    good = json.loads(dump_credentials({"alice": ALICE}))["users"]["alice"]
    good.update(changes)
    return {k: v for k, v in good.items() if v is not None}


def _verifier(**changes: Any) -> dict[str, Any]:
    return _entry(**{"scram-sha-256": {**_entry()["scram-sha-256"], **changes}})


def _doc(users: Any) -> bytes:
    return json.dumps({"peermesh-mtl-credentials": 1, "users": users}).encode()


@pytest.mark.parametrize("data, message", [
    (b"\xff\xfe", "is not UTF-8 text"),
    (b"[1, 2", "is not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b"[]", "is not a peermesh MTL credentials file"),
    (b'{"users": {}}', "is not a peermesh MTL credentials file"),
    (b'{"peermesh-mtl-credentials": 2}', "is not a peermesh MTL credentials file"),
    (b'{"peermesh-mtl-credentials": 1, "groups": {}}', "unknown key(s) groups"),
    (_doc([]), "users: must be an object"),
    (_doc({"alice": "pw"}), "user 'alice': must be an object"),
    (_doc({"alice": {"password": "pw"}}), "user 'alice': unknown key(s) password"),
    (_doc({"alice": _entry(**{"scram-sha-256": None})}), '"scram-sha-256" must be an object'),
    (_doc({"alice": _verifier(extra=1)}), "must have exactly the keys"),
    (_doc({"alice": _verifier(salt="!!not base64!!")}), "salt is not valid base64"),
    (_doc({"alice": _verifier(salt=5)}), "salt must be base64 text"),
    (_doc({"alice": _verifier(salt="AAAA")}), "salt must be at least 12 bytes"),
    (_doc({"alice": _verifier(**{"stored-key": "AAAA"})}), "must be 32 bytes"),
    (_doc({"alice": _verifier(iterations="4096")}), "iterations must be an integer"),
    (_doc({"alice": _verifier(iterations=True)}), "iterations must be an integer"),
    (_doc({"alice": _verifier(iterations=10 ** 9)}), "iterations must be an integer"),
    (_doc({"alice": _entry(read="chat")}), '"read" must be a list'),
    (_doc({"alice": _entry(write=["ok", "\x1b[2J"])}), "write pattern"),
    (_doc({"alice": _entry(expires="tomorrow")}), "is not an ISO 8601 time"),
    (_doc({"alice": _entry(expires=17)}), "must be an ISO 8601 time"),
    (_doc({"": _entry()}), "user '': user name '' must be"),
])
def test_hostile_file_contents_name_the_file_and_the_fault(tmp_path: Path, data: bytes,
                                                           message: str) -> None:
    path = tmp_path / "creds.json"
    path.write_bytes(data)
    with pytest.raises(CredentialsError) as caught:
        CredentialsFile(path)
    assert str(caught.value).startswith(f"credentials file {path}: ")
    assert message in str(caught.value)


def test_an_unreadable_or_huge_file_is_a_clear_error(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(CredentialsError, match="cannot read credentials file .*directory"):
        CredentialsFile(tmp_path)
    monkeypatch.setattr("peermesh.mtl.users.MAX_FILE_BYTES", 10)
    (tmp_path / "big.json").write_bytes(b" " * 11)
    with pytest.raises(CredentialsError, match="larger than 10 bytes"):
        CredentialsFile(tmp_path / "big.json")


def test_parse_time() -> None:
    assert parse_time("2027-01-01") == parse_time("2027-01-01T00:00:00Z") == 1798761600.0
    assert parse_time("2027-01-01T01:00:00+01:00") == 1798761600.0


# --- throttling ---------------------------------------------------------


@pytest.mark.parametrize("failures, at, expected", [
    # (times of failures, time asked, seconds to wait): 5 free, then 1 s doubling to 60 s
    ([0, 0, 0, 0], 0, 0.0),
    ([0, 0, 0, 0, 0], 0, 1.0),
    ([0, 0, 0, 0, 0], 0.25, 0.75),
    ([0, 0, 0, 0, 0], 1.0, 0.0),
    ([0, 0, 0, 0, 0, 1], 1.0, 2.0),
    ([0] * 8, 0, 8.0),
    ([0] * 40, 0, 60.0),
    ([0] * 40, 60, 0.0),
    ([0] * 40, 900, 0.0),                  # forgotten after 15 minutes
    ([0, 0, 0, 0, 0, 900], 900, 0.0),     # the count before a quiet 15 min does not count
    ([0, 0, 0, 0, 0, 899, 900], 900, 4.0),  # 15 min from the last failure, not the first
])
def test_failure_table(failures: list[float], at: float, expected: float) -> None:
    table = FailureTable()
    for when in failures:
        table.failed("k", when)
    assert table.retry_after("k", at) == pytest.approx(expected)
    assert table.retry_after("other", at) == 0.0


def test_failure_tables_are_bounded_and_forget_the_oldest() -> None:
    table = FailureTable(free=1, max_entries=3)
    for i, key in enumerate("abcd"):
        table.failed(key, float(i))
    assert len(table) == 3
    assert table.retry_after("a", 3.0) == 0.0          # evicted
    assert table.retry_after("d", 3.0) == 1.0
    table.failed("b", 4.0)                             # b is now the newest
    table.failed("e", 5.0)
    assert table.retry_after("c", 5.0) == 0.0 and table.retry_after("b", 5.0) > 0


def test_throttle_per_user_and_per_address(tmp_path: Path) -> None:
    throttle = Throttle()
    auth = Authenticator(credentials(tmp_path, ALICE), throttle=throttle)
    for _ in range(4):
        assert scram_login(auth, "alice", "guess", now=NOW).retry_after == 0.0
    fifth = scram_login(auth, "alice", "guess", now=NOW)
    assert fifth.failure and fifth.retry_after == pytest.approx(1.0)
    # throttled from this address, even with the right password: no password check is made
    blocked = scram_login(auth, "alice", "correct horse", now=NOW + 0.5)
    assert blocked.failure == "user throttled" and blocked.retry_after == pytest.approx(0.5)
    # ... but not from another address: someone else's failures do not lock alice out
    assert scram_login(auth, "alice", "correct horse", now=NOW + 0.5,
                       client="10.9.9.9").user == ALICE
    assert scram_login(auth, "alice", "correct horse", now=NOW + 1).user == ALICE
    key = Throttle.user_key("alice", ADDRESS)
    assert throttle.users.retry_after(key, NOW + 1) == 0.0   # success clears the user here
    # an address that guesses at many names is throttled after 20 failures
    for i in range(14):
        assert scram_login(auth, f"user{i}", "guess", now=NOW + 3).retry_after == 0.0
    assert scram_login(auth, "user14", "guess", now=NOW + 3).retry_after == 1.0
    assert throttle.addresses.retry_after(ADDRESS, NOW + 3) > 0
    step = auth.begin("SCRAM-SHA-256", ADDRESS, NOW + 3).respond(b"n,,n=alice,r=abc", NOW + 3)
    assert step.failure == "address throttled" and step.retry_after > 0
    other: Optional[User] = scram_login(auth, "alice", "correct horse", now=NOW + 3,
                                        client="10.1.1.1").user
    assert other == ALICE
