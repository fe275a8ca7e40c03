"""Which side broke the protocol: every codec's encoder refuses a bad argument with
``LocalProtocolError``, every decoder refuses a peer's bytes with ``RemoteProtocolError``
(``tests/wire/test_fuzz_corpus.py`` runs the decoders on garbage)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from peermesh.agent.protocol import BadRequest, parse_request
from peermesh.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from peermesh.flux.bodies import int_field, str_field, unb64
from peermesh.wire import flux, flux_local, mtl, mtl_replication, nfp, sada, zre
from peermesh.wire.frames import EncodeError, as_bytes, as_frames

UUID = bytes(range(16))

#: one encoder call per codec that the wire cannot carry
LOCAL: dict[str, Callable[[], Any]] = {
    "zre-beacon": lambda: zre.encode_beacon(zre.Beacon(b"short", 5670)),
    "zre": lambda: zre.encode(zre.Shout(1, "g" * 256, (b"x",))),
    "sada": lambda: sada.encode_req(b"", "svc", "1", "", "act", b""),
    "sada-status": lambda: sada.status_frame(999),
    "nfp-status": lambda: nfp.encode_status(999),
    "nfp-target": lambda: nfp.request_frames(nfp.Command.POST, nfp.Role.CLIENT, "svc", (),
                                             "u-1"),
    "mtl-table": lambda: mtl.encode_table({1: 2}),  # type: ignore[dict-item]
    "mtl-string": lambda: mtl.encode_string("x" * 300),
    "flux": lambda: flux.encode(flux.Request("")),
    "flux-proto": lambda: flux.encode_proto(flux.Proto(1, 0, 1 << 32)),
    "flux-json": lambda: flux.json_payload([1]),  # type: ignore[arg-type]
    "flux-local": lambda: flux_local.encode([b"ok", "text"]),  # type: ignore[list-item]
}


@pytest.mark.parametrize("call", LOCAL.values(), ids=LOCAL.keys())
def test_an_encoder_refuses_a_bad_argument_with_local_protocol_error(call: Callable[[], Any]
                                                                      ) -> None:
    with pytest.raises(LocalProtocolError) as info:
        call()
    assert not isinstance(info.value, RemoteProtocolError) and info.value.reason


def test_encode_error_is_local_and_still_a_value_error() -> None:
    with pytest.raises(ValueError, match="short string"):
        mtl.encode_string("x" * 300)
    assert issubclass(EncodeError, LocalProtocolError) and issubclass(EncodeError, ValueError)
    assert not issubclass(EncodeError, RemoteProtocolError)


def test_the_frames_check_says_whose_input_it_was() -> None:
    for remote, side in ((True, RemoteProtocolError), (False, LocalProtocolError)):
        with pytest.raises(side, match="a body must be bytes"):
            as_bytes("text", "a body", remote=remote)
        for bad in (b"one", 5, [b"ok", None]):
            with pytest.raises(side):
                as_frames(bad, remote=remote)
    assert as_frames((bytearray(b"a"), memoryview(b"b")), remote=False) == [b"a", b"b"]


def _post(target: bytes) -> list[bytes]:
    frames = nfp.request_frames(nfp.Command.POST, nfp.Role.CLIENT, "svc", nfp.ALL, "u-1")
    frames[4] = target
    return frames


def test_a_peer_s_overlong_target_is_a_remote_error() -> None:
    assert nfp.decode(_post(b"w1")).target == "w1"  # type: ignore[union-attr]
    with pytest.raises(nfp.TargetTooLong) as info:
        nfp.decode(_post(b"w" * (nfp.MAX_TARGET + 1)))
    assert isinstance(info.value, RemoteProtocolError)
    with pytest.raises(RemoteProtocolError, match="target"):
        nfp.decode(_post(b"all,w1"))


def test_mtl_replication_numbers_from_a_peer_are_remote_errors() -> None:
    assert mtl_replication.decode_number(mtl_replication.encode_number(7)) == 7
    with pytest.raises(RemoteProtocolError):
        mtl_replication.decode_number(b"\0" * 7)


def test_flux_body_readers_refuse_a_peer_s_fields_as_remote_errors() -> None:
    body = {"rank": 3, "name": "n", "payload": "aGk="}
    assert int_field(body, "rank", 0) == 3 and str_field(body, "name") == "n"
    assert unb64(body["payload"]) == b"hi"
    for call in (lambda: int_field(body, "rank", 0, 2), lambda: int_field(body, "name"),
                 lambda: str_field(body, "rank"), lambda: str_field(body, "name", 0),
                 lambda: unb64(5), lambda: unb64("not base64!")):
        with pytest.raises(RemoteProtocolError):
            call()


def test_an_agent_client_s_bad_request_is_a_remote_error() -> None:
    for body in (b"\xc1", b"\x93\x01\x02\x03", b"\x81\xa2op\x05"):
        with pytest.raises(BadRequest) as info:
            parse_request(body)
        assert isinstance(info.value, RemoteProtocolError)
    with pytest.raises(RemoteProtocolError):
        parse_request("text")  # type: ignore[arg-type]
    assert issubclass(BadRequest, ProtocolError)
