"""Every decoder's contract: ``ProtocolError`` for anything it cannot decode, nothing else.

The kept corpus (``tests/wire/corpus``) runs through its decoder; every
decoder refuses what is not bytes the same way; and a short run of
``scripts/fuzz.py`` per decoder finds no crash (and would report one). The wire
codecs and the agent's request parser say the peer broke the protocol: each of
their refusals is a ``RemoteProtocolError``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

from peermesh.errors import ProtocolError, RemoteProtocolError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "scripts"))

import fuzz  # noqa: E402

PRESENT = [d for d in fuzz.DECODERS if d.load() is not None]
FRAMES = [d for d in PRESENT if d.frames]
SINGLE = [d for d in PRESENT if not d.frames]
KEPT = [d for d in PRESENT if (fuzz.CORPUS / f"{d.name}.txt").exists()]
#: decoders whose refusals are all ``RemoteProtocolError`` (the rest: modules of their own)
REMOTE = [d for d in PRESENT if d.where.startswith(("peermesh.wire.", "peermesh.agent."))]


def _name(decoder: fuzz.Decoder) -> str:
    return decoder.name


def _outcome(function: Any, data: Any) -> str:
    try:
        function(data)
    except ProtocolError:
        return "refused"
    return "decoded"


def test_every_corpus_file_belongs_to_a_decoder() -> None:
    names = {d.name for d in fuzz.DECODERS}
    files = {p.stem for p in fuzz.CORPUS.glob("*.txt")}
    assert files <= names, files - names
    assert {"beacon", "zre", "sada", "nfp", "spark-request", "flux", "mtl-request", "mtl-reply",
            "mtl-data", "mtl-table", "flux-json", "agent-request", "hello-flux",
            "hello-nfp-worker", "hello-nfp-broker", "hello-mtl-gateway", "hello-broker",
            "hello-sada-channel"} <= {d.name for d in KEPT}


@pytest.mark.parametrize("decoder", KEPT, ids=_name)
def test_the_corpus_decodes_or_is_refused(decoder: fuzz.Decoder) -> None:
    function = decoder.load()
    inputs = fuzz.load_corpus(decoder)
    assert inputs
    outcomes = [_outcome(function, data) for data in inputs]
    assert "decoded" in outcomes and "refused" in outcomes   # the corpus holds both kinds


NOT_FRAMES = [None, 5, 1.5, "text", b"one byte string", bytearray(b"x"), object(),
              [b"", 5], [None], [b"", b"x", "text"], [b"x", [b"nested"]], {"a": b"b"}]


@pytest.mark.parametrize("decoder", FRAMES, ids=_name)
@pytest.mark.parametrize("data", NOT_FRAMES, ids=repr)
def test_what_is_not_a_list_of_frames_is_a_protocol_error(decoder: fuzz.Decoder,
                                                          data: Any) -> None:
    with pytest.raises(ProtocolError):
        decoder.load()(data)  # type: ignore[misc]


@pytest.mark.parametrize("decoder", KEPT, ids=_name)
def test_bytes_like_frames_decode_as_bytes_do(decoder: fuzz.Decoder) -> None:
    function = decoder.load()
    for data in fuzz.load_corpus(decoder):
        as_bytes = _result(function, data)
        if isinstance(data, bytes):
            alike = [bytearray(data), memoryview(data)]
        else:
            alike = [[bytearray(f) for f in data], tuple(memoryview(f) for f in data)]
        for other in alike:
            assert _result(function, other) == as_bytes


def _result(function: Any, data: Any) -> Any:
    try:
        return function(data)
    except ProtocolError as exc:
        return ("refused", exc.reason)


@pytest.mark.parametrize("decoder", SINGLE, ids=_name)
@pytest.mark.parametrize("data", [None, 5, "text", [b"frame"], object()], ids=repr)
def test_what_is_not_bytes_is_a_protocol_error(decoder: fuzz.Decoder, data: Any) -> None:
    with pytest.raises(ProtocolError):
        decoder.load()(data)  # type: ignore[misc]


@pytest.mark.parametrize("decoder", PRESENT, ids=_name)
def test_a_short_fuzz_run_finds_no_crash(decoder: fuzz.Decoder) -> None:
    report = fuzz.fuzz(decoder, 150)
    assert report.crash is None, report.crash
    assert report.inputs == 150 and report.refused > 0


def fragile(frames: Any) -> None:
    """A decoder with a bug: a first frame of 3+ octets starting with 0xff."""
    if frames and frames[0][:1] == b"\xff" and len(frames[0]) >= 3:
        raise IndexError("fragile")
    raise ProtocolError("refused")


def test_the_fuzzer_reports_a_crash_with_a_small_input(tmp_path: Path) -> None:
    decoder = fuzz.Decoder("fragile", f"{__name__}:fragile")
    (tmp_path / "fragile.txt").write_text("# seed\nff0000 -\n")
    report = fuzz.fuzz(decoder, 500, corpus_dir=tmp_path)
    assert report.crash is not None
    data, why = report.crash
    assert why == "IndexError: fragile"
    assert isinstance(data, list) and data[0][:1] == b"\xff" and len(data[0]) == 3
    fuzz.save_input(decoder, data, "crashed", tmp_path)
    assert fuzz.load_corpus(decoder, tmp_path)[-1] == data


def test_an_absent_decoder_is_reported_absent() -> None:
    report = fuzz.fuzz(fuzz.Decoder("later", "peermesh.wire.not_yet_written:decode"), 10)
    assert report.absent and report.inputs == 0


def unchecked_json(data: Any) -> Any:
    """A JSON decoder that catches only ValueError (a nesting bomb escapes it)."""
    import json
    try:
        return json.loads(bytes(data).decode("utf-8", "replace"))
    except ValueError:
        raise ProtocolError("not JSON") from None


def test_the_fuzzer_finds_a_nesting_bomb_without_a_corpus(tmp_path: Path) -> None:
    decoder = fuzz.Decoder("unchecked", f"{__name__}:unchecked_json", frames=False)
    report = fuzz.fuzz(decoder, 300, corpus_dir=tmp_path)
    assert report.crash is not None and report.crash[1].startswith("RecursionError")


def test_the_remote_decoders_are_the_wire_codecs() -> None:
    assert {"beacon", "zre", "sada", "nfp", "nfp-body", "flux", "flux-json", "mtl-request",
            "mtl-reply", "mtl-data", "mtl-table", "mtl-replication",
            "agent-request"} <= {d.name for d in REMOTE}


def _refusal(function: Any, data: Any) -> Optional[ProtocolError]:
    try:
        function(data)
    except ProtocolError as exc:
        return exc
    return None


@pytest.mark.parametrize("decoder", REMOTE, ids=_name)
def test_a_wire_decoder_refuses_with_remote_protocol_error(decoder: fuzz.Decoder) -> None:
    function = decoder.load()
    corpus = fuzz.load_corpus(decoder)
    garbage: list[Any] = [*corpus, *(NOT_FRAMES if decoder.frames else
                                     [None, 5, "text", [b"frame"], object()])]
    refusals = [exc for exc in (_refusal(function, data) for data in garbage) if exc]
    assert refusals
    wrong = [type(exc).__name__ for exc in refusals if not isinstance(exc, RemoteProtocolError)]
    assert not wrong, wrong


@pytest.mark.parametrize("decoder", REMOTE, ids=_name)
def test_fuzzed_garbage_is_refused_with_remote_protocol_error(decoder: fuzz.Decoder) -> None:
    from hypothesis import HealthCheck, Phase, given, settings

    function = decoder.load()
    seen = {"refused": 0}

    @settings(max_examples=120, database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])
    @given(fuzz.strategy(decoder, fuzz.load_corpus(decoder)))
    def one(data: Any) -> None:
        try:
            function(data)
        except RemoteProtocolError:
            seen["refused"] += 1

    one()       # any other exception (a plain or local ProtocolError too) fails here
    assert seen["refused"] > 0
