"""A joining member that is refused for good stops, naming why, instead of asking again."""

from __future__ import annotations

import os
from typing import Optional

import pytest
from cliprocess import Cli
from peermesh.flux.core import PARENT, Dial, Emit, FluxCore, FluxSettings, Hangup, Notice, Send, State
from peermesh.wire.flux import (
    Control, ControlType, Errno, Request, Response, decode, encode, string_payload,
)


def joining() -> tuple[FluxCore, Request]:
    core = FluxCore(os.urandom(16), "tcp://me", settings=FluxSettings(),
                    bootstrap=["tcp://there"])
    out = core.start(0.0)
    assert any(isinstance(o, Dial) for o in out) and core.state is State.JOINING
    (join,) = [decode(o.frames) for o in out if type(o) is Send and o.link == PARENT]
    assert isinstance(join, Request) and join.topic == "peermesh.join"
    return core, join


def refusal(out: list) -> Optional[Notice]:
    return next((o.event for o in out if isinstance(o, Emit) and o.event.what == "refused"), None)


def test_disconnect_while_joining_stops_with_a_reason() -> None:
    core, _ = joining()
    out = core.receive(PARENT, encode(Control(ControlType.DISCONNECT)), 1.0)
    notice = refusal(out)
    assert notice is not None and "DISCONNECT" in str(notice.detail)
    assert core.state is State.STOPPED and any(isinstance(o, Hangup) for o in out)
    assert core.handle_timer(100.0) == []                    # and never dials again


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
    assert any(isinstance(o, Dial) for o in core.handle_timer(core.next_deadline()))


def test_cli_member_refused_by_a_stranger_exits_1_naming_why(free_udp_port: int,
                                                             refusing: str) -> None:
    result = Cli(free_udp_port).call("flux", "run", "--parent", refusing, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "error: joining was refused: DISCONNECT" in result.stderr


def test_client_refused_while_connecting_raises_and_can_connect_again(refusing: str) -> None:
    from peermesh.flux import FluxClient, FluxError

    client = FluxClient([refusing], failover=5)
    for _ in range(2):                     # the second connect is refused the same way
        with pytest.raises(FluxError) as caught:
            client.connect(15)
        assert caught.value.errnum == Errno.EHOSTUNREACH
        assert "DISCONNECT" in caught.value.message
        assert not client.reconnecting and not client.connected
    client.close()


def test_a_flux_core_brokers_hello_is_refused_with_a_reason() -> None:
    from peermesh.flux.core import FLUX_CORE_CHILD_REFUSED
    from peermesh.flux.outputs import Send
    from peermesh.wire.flux import Role, error_message, json_payload

    root = FluxCore(os.urandom(16), "tcp://root", settings=FluxSettings(), root=True)
    root.start(0.0)
    uuid = b"0f8fad5b-d9cb-469f-a165-70867728950e"
    hello = Request("overlay.hello", json_payload({"rank": 1, "version": 0x5800, "uuid":
                                                   uuid.decode(), "status": 0}),
                    0xFFFFFFFF, 3, routes=(), rolemask=Role.OWNER)
    (answer,) = root.receive(uuid, encode(hello), 1.0)
    assert isinstance(answer, Send) and answer.link == uuid and answer.frames[0] == uuid
    response = decode(answer.frames[1:])
    assert isinstance(response, Response) and response.errnum == Errno.EPROTO
    assert response.matchtag == 3 and response.routes == ()
    assert error_message(response.payload) == FLUX_CORE_CHILD_REFUSED
    assert root.receive(uuid, encode(Control(ControlType.HEARTBEAT, routes=())), 2.0) == []


def test_read_config_finds_rank_parent_and_uri(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from peermesh.flux.fluxmode import read_config

    conf = tmp_path / "boot.toml"
    hosts = "".join(f'[[bootstrap.hosts]]\nhost = "n{r}"\n' for r in range(1, 5))
    conf.write_text('[bootstrap]\ncurve_cert = "c.cert"\ndefault_port = 8050\n'
                    'default_connect = "tcp://%h:%p"\n[tbon]\ntopo = "kary:2"\n'
                    '[[bootstrap.hosts]]\nhost = "n0"\nconnect = "tcp://10.0.0.1:9"\n' + hosts)
    place = read_config(str(conf), "n3")
    assert {k: place[k] for k in ("rank", "size", "parent", "bind", "cert", "hosts")} == {
        "rank": 3, "size": 5, "parent": "tcp://n1:8050", "bind": None,
        "cert": str(tmp_path / "c.cert"), "hosts": ["n0", "n1", "n2", "n3", "n4"]}
    assert place["parents"] == [-1, 0, 0, 1, 1]
    assert read_config(str(conf), "n4")["parent"] == "tcp://n1:8050"
    for host in ("n1", "n0"):          # ranks with children need somewhere to listen
        with pytest.raises(ValueError, match=f"{host} .* has children under kary:2 but no "
                                             "bind URI"):
            read_config(str(conf), host)
    conf.write_text(conf.read_text().replace('default_connect', 'default_bind = '
                                             '"tcp://*:%p"\ndefault_connect'))
    assert read_config(str(conf), "n1")["bind"] == "tcp://*:8050"
    assert read_config(str(conf), "n0")["parent"] is None
    with pytest.raises(ValueError, match="not among the hosts"):
        read_config(str(conf), "elsewhere")
    custom = tmp_path / "custom.toml"
    custom.write_text('[bootstrap]\ncurve_cert = "/c"\n[[bootstrap.hosts]]\nhost = "a"\n'
                      'connect = "tcp://127.0.0.1:1"\n[[bootstrap.hosts]]\nhost = "b"\n')
    place = read_config(str(custom), "b")
    assert (place["rank"], place["size"], place["parent"], place["cert"]) == (
        1, 2, "tcp://127.0.0.1:1", "/c")
    custom.write_text('[bootstrap]\n[[bootstrap.hosts]]\nhost = "a"\n[[bootstrap.hosts]]\n'
                      'host = "b"\n')
    with pytest.raises(ValueError, match="no bootstrap.curve_cert"):
        read_config(str(custom), "b")
