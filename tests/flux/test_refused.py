"""A joining member that is refused for good stops, naming why, instead of asking again."""

from __future__ import annotations

import os
import threading
from typing import Optional

import pytest
import zmq

from cliprocess import Cli
from peermesh.flux.core import PARENT, Dial, FluxCore, FluxSettings, Hangup, Notice, State
from peermesh.wire.flux import (
    Control, ControlType, Errno, Request, Response, decode, encode, string_payload,
)


def joining() -> tuple[FluxCore, Request]:
    core = FluxCore(os.urandom(16), "tcp://me", settings=FluxSettings(),
                    bootstrap=["tcp://there"])
    out = core.start(0.0)
    assert any(isinstance(o, Dial) for o in out) and core.state is State.JOINING
    (join,) = [decode(o.frames) for o in out if getattr(o, "link", None) == PARENT]
    assert isinstance(join, Request) and join.topic == "peermesh.join"
    return core, join


def refusal(out: list) -> Optional[Notice]:
    return next((o for o in out if isinstance(o, Notice) and o.what == "refused"), None)


def test_disconnect_while_joining_stops_with_a_reason() -> None:
    core, _ = joining()
    out = core.receive(PARENT, encode(Control(ControlType.DISCONNECT)), 1.0)
    notice = refusal(out)
    assert notice is not None and "DISCONNECT" in str(notice.detail)
    assert core.state is State.STOPPED and any(isinstance(o, Hangup) for o in out)
    assert core.timer(100.0) == []                    # and never dials again


@pytest.mark.parametrize("errnum,text", [
    (Errno.ENOSYS, "No service matching peermesh.join is registered"),
    (Errno.EPROTO, "version mismatch"),
])
def test_enosys_or_eproto_answer_to_join_stops(errnum: int, text: str) -> None:
    core, join = joining()
    answer = Response(join.topic, string_payload(text), errnum, join.matchtag,
                      routes=join.routes)
    notice = refusal(core.receive(PARENT, encode(answer), 1.0))
    assert notice is not None and str(notice.detail) == (
        f"{'ENOSYS' if errnum == Errno.ENOSYS else 'EPROTO'} answering peermesh.join: {text}")
    assert core.state is State.STOPPED


def test_a_passing_refusal_is_asked_again() -> None:
    core, join = joining()
    answer = Response(join.topic, string_payload("busy"), Errno.EAGAIN, join.matchtag,
                      routes=join.routes)
    out = core.receive(PARENT, encode(answer), 1.0)
    assert refusal(out) is None and core.state is State.JOINING
    assert any(isinstance(o, Dial) for o in core.timer(core.next_deadline))


def test_cli_member_refused_by_a_stranger_exits_1_naming_why(free_udp_port: int) -> None:
    """A ROUTER that answers every message DISCONNECT, as flux-core answers a stranger."""
    context = zmq.Context.instance()
    router = context.socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def answer() -> None:
        while not stop.is_set():
            if router.poll(50):
                identity, *_ = router.recv_multipart()
                router.send_multipart([identity, *encode(Control(ControlType.DISCONNECT))])

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        result = Cli(free_udp_port).call("flux", "run", "--parent",
                                         f"tcp://127.0.0.1:{port}", timeout=60)
    finally:
        stop.set()
        thread.join(5)
        router.close()
    assert result.returncode == 1, result.stderr
    assert "error: joining was refused: DISCONNECT" in result.stderr
