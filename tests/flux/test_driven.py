"""A Flux node served by the one driver (``peermesh.io.driver``), on real sockets: a ROUTER
peer whose identity is not a member's never reaches the core (it could pose as the parent,
``^``), while a member-sized one is answered; a rank whose child's connection is gone
fails what was in flight through it (EHOSTUNREACH on the ROUTER: ``link_down``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Optional

import pytest
import zmq

from peermesh.flux import FluxError, FluxOverlay, FluxSettings
from peermesh.flux.outputs import IDENTITY_SIZE, PARENT
from peermesh.wire.flux import Response, decode, encode, json_payload, make_request

from .conftest import wait_until

FAST = FluxSettings(heartbeat=0.1, torpid=0.3, lost=0.6, hello_timeout=0.5)


@pytest.fixture
def root() -> Iterator[FluxOverlay]:
    node = FluxOverlay(root=True, topology="kary:2", settings=FAST, address="127.0.0.1").start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def dealers() -> Iterator[list[zmq.Socket]]:
    made: list[zmq.Socket] = []
    yield made
    for sock in made:
        sock.close(linger=0)


def dealer(made: list[zmq.Socket], identity: bytes, endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    made.append(sock)   # tracked for closing before first use
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.SNDTIMEO, 1000)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def client_hello() -> list[bytes]:
    """``peermesh.client`` as a rankless client sends it (no routes yet: the ROUTER's)."""
    return encode(make_request("peermesh.client", json_payload({}), 0xFFFFFFFF, 7, 0, (), 0, 0))


def answer(sock: zmq.Socket) -> Optional[Response]:
    try:
        message = decode(sock.recv_multipart(zmq.NOBLOCK))
    except zmq.Again:
        return None
    assert isinstance(message, Response)
    return message


def test_only_member_identities_reach_the_core(root: FluxOverlay,
                                               dealers: list[zmq.Socket]) -> None:
    member = dealer(dealers, os.urandom(IDENTITY_SIZE), root.endpoint)
    poser = dealer(dealers, PARENT, root.endpoint)
    poser.send_multipart(client_hello())
    dropped = wait_until(lambda: root.dropped or None, 10, "the poser's message dropped")
    member.send_multipart(client_hello())
    welcome = wait_until(lambda: answer(member), 10, "the member-sized client answered")
    assert welcome.errnum == 0 and welcome.matchtag == 7
    assert answer(poser) is None and root.dropped == dropped
    assert len(root.core.clients) == 1 and root.core.stats["dropped"] == 0


def test_a_child_gone_from_the_router_fails_its_requests() -> None:
    patient = FluxSettings(heartbeat=0.1, torpid=30.0, lost=60.0, hello_timeout=0.5)
    root = FluxOverlay(root=True, topology="kary:2", settings=patient,
                       address="127.0.0.1").start()
    one = FluxOverlay(parents=[root.endpoint], topology="kary:2", settings=patient,
                      address="127.0.0.1").start()
    try:
        assert one.wait_online(10)
        one.register("demo.hang", lambda request: None)   # never answers
        future = root.rpc("demo.hang", None, 1)
        wait_until(lambda: root.core.routing.via.get(one.identity), 10, "the request in flight")
        one.core.children.clear()
        one._driver.close()        # its connections close with nothing said  # type: ignore
        # the root's next heartbeat to the child finds it gone (long before ``lost``):
        # EHOSTUNREACH on the ROUTER, link_down
        with pytest.raises(FluxError, match="link is down"):
            future.get(10)
        assert 1 not in root.info()["children"]
    finally:
        one.stop()
        root.stop()
