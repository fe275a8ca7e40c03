"""Allowlists of public keys, and the ZAP responder that answers libzmq from them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import zmq

from peermesh.io.curve import Curve, shared_allowlist
from peermesh.io.keys import CurveError, KeyFileError, generate, write_keypair
from peermesh.io.zap import Allowlist, zap_responder


def keys_in(directory: Path, *names: str) -> dict[str, bytes]:
    found = {}
    for name in names:
        keypair = generate()
        write_keypair(directory / f"{name}.key", keypair)
        found[name] = keypair.public
    return found


def test_reads_public_certificates_and_skips_the_rest(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    keys = keys_in(tmp_path, "a", "b")            # a.key_secret and b.key_secret beside them
    (tmp_path / ".hidden").write_text("not read")
    (tmp_path / "notes.txt").write_text("curve\n  = oops\n")
    (tmp_path / "sub").mkdir()
    allowlist = Allowlist(tmp_path)
    assert allowlist.keys == {keys["a"], keys["b"]}
    assert "notes.txt is not a certificate" in caplog.text
    assert allowlist.allows(keys["a"]) and not allowlist.allows(generate().public)


def test_changes_are_seen_and_a_vanished_directory_keeps_the_keys(tmp_path: Path) -> None:
    directory = tmp_path / "allowed"
    directory.mkdir()
    allowlist = Allowlist(directory)
    assert not allowlist.refresh() and allowlist.keys == frozenset()
    new = keys_in(directory, "c")["c"]
    assert allowlist.refresh() and allowlist.keys == {new}
    shutil.rmtree(directory)
    assert not allowlist.refresh() and allowlist.keys == {new}
    with pytest.raises(KeyFileError, match="cannot read directory"):
        allowlist.reload()


def test_any_key_and_bad_directories(tmp_path: Path) -> None:
    assert Allowlist(None).any_key and Allowlist(None).allows(b"x" * 40)
    with pytest.raises(KeyFileError, match="no directory"):
        shared_allowlist(tmp_path / "missing")
    (tmp_path / "file").write_text("")
    with pytest.raises(KeyFileError, match="not a directory"):
        shared_allowlist(tmp_path / "file")
    assert shared_allowlist(tmp_path) is shared_allowlist(str(tmp_path))


def test_each_allowlist_has_a_zap_domain_of_its_own(tmp_path: Path) -> None:
    assert len({Allowlist(None).domain, Allowlist(None).domain, Allowlist(tmp_path).domain}) == 3
    assert shared_allowlist(tmp_path).domain == shared_allowlist(tmp_path).domain


def test_one_allowlist_per_domain_while_in_use(tmp_path: Path) -> None:
    context = zmq.Context()
    responder = zap_responder(context)
    try:
        first, second = Allowlist(None), Allowlist(tmp_path)
        responder.register("d", first, "user-1")
        with pytest.raises(CurveError, match="ZAP domain 'd' already admits"):
            responder.register("d", second, "user-2")
        responder.release("d", "user-1")
        responder.register("d", second, "user-2")  # free again
    finally:
        responder.close()  # its own thread closes its socket, then the context can end
        assert not responder.alive
        context.term()


def test_server_and_client_socket_options(tmp_path: Path) -> None:
    keypair = generate()
    write_keypair(tmp_path / "n.key", keypair)
    server = Curve.load(tmp_path / "n.key_secret", domain="nobody")
    options = server.options(zmq.Context.instance())
    assert options[zmq.ZAP_ENFORCE_DOMAIN] == 1 and options[zmq.ZAP_DOMAIN] == b"nobody"
    assert options[zmq.CURVE_SERVER] == 1
    server.release(zmq.Context.instance())
    default = Curve.load(tmp_path / "n.key_secret", tmp_path)
    assert default.options(zmq.Context.instance())[zmq.ZAP_DOMAIN] == \
        shared_allowlist(tmp_path).domain.encode()
    default.release(zmq.Context.instance())
    client = Curve(generate(), Allowlist(None)).options(zmq.Context.instance(), keypair.public)
    assert client[zmq.CURVE_SERVERKEY] == keypair.public and zmq.CURVE_SERVER not in client
