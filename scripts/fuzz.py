"""Fuzz every decoder of the project: only ``ProtocolError`` may come out of it.

    python scripts/fuzz.py                      # 10,000 inputs per decoder
    python scripts/fuzz.py -n 200000 zre sada   # more inputs, some decoders
    python scripts/fuzz.py --save               # add crashing inputs to the corpus

Inputs come from hypothesis: random frames, nesting bombs (JSON or msgpack
containers opened hundreds to thousands of times, alone or as one frame among
random ones), and the kept corpus (``tests/wire/corpus/NAME.txt``, which the
test suite runs) mutated (bytes flipped, frames cut, dropped, doubled, swapped
or replaced). Each decoder gets
``-n`` inputs; the report counts, per decoder, the inputs decoded, those
refused with ``ProtocolError``, and crashes: anything else raised, shown with
the smallest input hypothesis found. The exit status is 1 if any decoder
crashed.

A new decoder is one line in ``DECODERS``: its name (also its corpus file's),
where it is (``module:function``) and whether it takes a list of frames or one
byte string. The overlays' HELLO header parsers answer None (or ``[]``) for
what they refuse, never raising: each is fuzzed through a ``hello_*`` adapter
below, which takes the header's value as UTF-8 octets and calls a None a
refusal. A decoder whose module does not exist yet is reported absent; one
without a corpus file gets random inputs only (add one with valid messages:
mutations of real messages reach deeper than random bytes).

Corpus files: one input per line; a frame is its octets in hex, ``-`` for an
empty frame, frames separated by one space; ``#`` starts a comment line.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "wire" / "corpus"

Input = Union[bytes, list[bytes]]


@dataclass(frozen=True)
class Decoder:
    """One decoder to fuzz: ``where`` is ``module:function``; ``frames``: it takes a list of
    frames (else one byte string, e.g. a datagram)."""

    name: str
    where: str
    frames: bool = True

    def load(self) -> Optional[Callable[[Any], Any]]:
        """The function, or None when its module does not exist (yet)."""
        module, _, function = self.where.partition(":")
        try:
            found = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module.startswith(exc.name):
                return None
            raise
        return getattr(found, function)  # a wrong name is an error, not "absent"


DECODERS = [
    Decoder("beacon", "peermesh.wire.zre:decode_beacon", frames=False),
    Decoder("zre", "peermesh.wire.zre:decode"),
    Decoder("sada", "peermesh.wire.sada:decode"),
    Decoder("nfp", "peermesh.wire.nfp:decode"),
    Decoder("nfp-body", "peermesh.wire.nfp:decode_body", frames=False),
    Decoder("spark-request", "peermesh.spark.protocol:decode_request"),
    Decoder("spark-reply", "peermesh.spark.protocol:decode_reply"),
    Decoder("flux", "peermesh.wire.flux:decode"),
    Decoder("mtl-request", "peermesh.wire.mtl:decode_request"),
    Decoder("mtl-reply", "peermesh.wire.mtl:decode_reply"),
    Decoder("mtl-data", "peermesh.wire.mtl:decode_data"),
    Decoder("mtl-table", "peermesh.wire.mtl:decode_table", frames=False),
    Decoder("mtl-replication", "peermesh.wire.mtl_replication:decode"),
    Decoder("flux-json", "peermesh.wire.flux:read_json", frames=False),
    Decoder("agent-request", "peermesh.agent.server:parse_request", frames=False),
    Decoder("hello-flux", "fuzz:hello_flux", frames=False),
    Decoder("hello-nfp-worker", "fuzz:hello_nfp_worker", frames=False),
    Decoder("hello-nfp-broker", "fuzz:hello_nfp_broker", frames=False),
    Decoder("hello-mtl-gateway", "fuzz:hello_mtl_gateway", frames=False),
    Decoder("hello-broker", "fuzz:hello_broker", frames=False),
    Decoder("hello-sada-channel", "fuzz:hello_sada_channel", frames=False),
]


# --------------------------------------------------------------------------
# HELLO header parsers as decoders: the header's value in, None (or []) a refusal


def _header(data: Any) -> str:
    from peermesh.errors import ProtocolError
    from peermesh.wire.frames import as_bytes
    try:
        return as_bytes(data, "a header value").decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("a header value is UTF-8") from None


def _refused_if_empty(value: Any) -> Any:
    from peermesh.errors import ProtocolError
    if value is None or value == []:
        raise ProtocolError("refused")
    return value


def hello_flux(data: bytes) -> Any:
    """``X-PM-FLUX-TREE`` of instance ``flux`` (``parse_member``)."""
    from peermesh.flux.overlay import FLUX_HEADER, parse_member
    return _refused_if_empty(parse_member({FLUX_HEADER: _header(data)}, "flux"))


def hello_nfp_worker(data: bytes) -> Any:
    """``X-PM-NFP-WORKER`` (``parse_workers``)."""
    from peermesh.nfp.mesh import parse_workers
    return _refused_if_empty(parse_workers(_header(data)))


def hello_nfp_broker(data: bytes) -> Any:
    """``X-PM-NFP-BROKER`` (``parse_broker_endpoint``)."""
    from peermesh.nfp.mesh import parse_broker_endpoint
    return _refused_if_empty(parse_broker_endpoint(_header(data)))


def hello_mtl_gateway(data: bytes) -> Any:
    """``X-PM-MTL-GATEWAY`` (``parse_gateway_header``)."""
    from peermesh.mtl.gateway import parse_gateway_header
    return _refused_if_empty(parse_gateway_header(_header(data)))


def hello_broker(data: bytes) -> Any:
    """``X-PM-BROKER``, the neutral broker candidacy (``parse_candidate``)."""
    from uuid import UUID

    from peermesh.overlay.election import BROKER_HEADER, parse_candidate
    return _refused_if_empty(parse_candidate(UUID(int=1), {BROKER_HEADER: _header(data)}))


def hello_sada_channel(data: bytes) -> Any:
    """``X-PM-SADA-CHANNEL``, admitted as a server admits a channel from the mesh
    (``mesh_endpoint`` within 127.0.0.0/8)."""
    from peermesh.sada.endpoints import as_networks, mesh_endpoint
    return _refused_if_empty(mesh_endpoint(_header(data), as_networks(["127.0.0.0/8"])))


# --------------------------------------------------------------------------
# The corpus


def parse_line(line: str, frames: bool) -> Input:
    """One corpus line as an input."""
    parts = [b"" if token == "-" else bytes.fromhex(token) for token in line.split()]
    if frames:
        return parts
    if len(parts) != 1:
        raise ValueError(f"a byte-string input is one token, not {len(parts)}: {line[:40]!r}")
    return parts[0]


def format_input(data: Input) -> str:
    """An input as a corpus line."""
    frames = [data] if isinstance(data, bytes) else data
    return " ".join(frame.hex() or "-" for frame in frames)


def load_corpus(decoder: Decoder, directory: Path = CORPUS) -> list[Input]:
    """The kept inputs of ``decoder`` (none if it has no corpus file)."""
    path = directory / f"{decoder.name}.txt"
    if not path.exists():
        return []
    return [parse_line(line, decoder.frames) for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def save_input(decoder: Decoder, data: Input, why: str, directory: Path = CORPUS) -> None:
    """Append ``data`` to ``decoder``'s corpus file, with a comment saying ``why``."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{decoder.name}.txt", "a") as out:
        out.write(f"# {why}\n{format_input(data)}\n")


# --------------------------------------------------------------------------
# Inputs


def strategy(decoder: Decoder, corpus: list[Input]) -> Any:
    """hypothesis inputs for ``decoder``: random ones and mutated corpus entries."""
    from hypothesis import strategies as st

    frame = st.binary(max_size=96)
    bomb = st.builds(_bomb, st.sampled_from(_OPENERS), st.integers(100, 5000),
                     st.sampled_from([b"", b"\0", b"\xc0", b"1"]))
    if not decoder.frames:
        plain = st.one_of(st.binary(max_size=128), bomb)
        if not corpus:
            return plain
        return st.one_of(plain, st.builds(_mutate_bytes, st.sampled_from(corpus),
                                          st.lists(st.tuples(st.integers(0, 3),
                                                             st.integers(0, 1 << 16), frame),
                                                   min_size=1, max_size=4)))
    plain_frames = st.one_of(st.lists(frame, max_size=12),
                             st.builds(_with_bomb, st.lists(frame, max_size=4), bomb,
                                       st.integers(0, 4)))
    if not corpus:
        return plain_frames
    edits = st.lists(st.tuples(st.integers(0, 7), st.integers(0, 1 << 16),
                               st.integers(0, 1 << 16), frame), min_size=1, max_size=4)
    return st.one_of(plain_frames, st.builds(_mutate_frames, st.sampled_from(corpus), edits))


#: what a nesting bomb repeats: JSON array and object, msgpack fixarray and fixmap
_OPENERS = [b"[", b'{"a":', b"\x91", b"\x81\xa1a"]


def _bomb(opener: bytes, times: int, tail: bytes) -> bytes:
    return opener * times + tail


def _with_bomb(frames: list[bytes], bomb: bytes, at: int) -> list[bytes]:
    return frames[:at] + [bomb] + frames[at:]


def _mutate_bytes(data: Input, edits: list[tuple[int, int, bytes]]) -> bytes:
    out = bytearray(data if isinstance(data, bytes) else b"".join(data))
    for op, at, extra in edits:
        where = at % (len(out) + 1)
        if op == 0 and out:                       # flip the bits of one octet
            out[where % len(out)] ^= ((at >> 8) & 0xFF) or 0xFF
        elif op == 1:                             # cut
            del out[where:]
        elif op == 2:                             # insert
            out[where:where] = extra
        else:                                     # overwrite
            out[where:where + len(extra)] = extra
    return bytes(out)


def _mutate_frames(data: Input, edits: list[tuple[int, int, int, bytes]]) -> list[bytes]:
    frames = [data] if isinstance(data, bytes) else list(data)
    for op, at, other, extra in edits:
        if not frames:
            frames.append(extra)
            continue
        i, j = at % len(frames), other % len(frames)
        if op == 0:                                # mutate one frame's octets
            frames[i] = _mutate_bytes(frames[i], [(other % 4, at >> 4, extra)])
        elif op == 1:
            del frames[i]
        elif op == 2:
            frames.insert(i, frames[j])
        elif op == 3:
            frames[i], frames[j] = frames[j], frames[i]
        elif op == 4:
            frames[i] = extra
        elif op == 5:
            frames.insert(i, extra)
        elif op == 6:
            del frames[i:]
        else:
            frames[i] = frames[i] * (1 + other % 3)
    return frames


# --------------------------------------------------------------------------
# Running


@dataclass
class Report:
    """What one decoder did with its inputs."""

    name: str
    absent: bool = False
    inputs: int = 0
    decoded: int = 0
    refused: int = 0
    crash: Optional[tuple[Input, str]] = None    # the smallest crashing input, and why
    seconds: float = 0.0


def fuzz(decoder: Decoder, inputs: int, *, seed: Optional[int] = None,
         corpus_dir: Path = CORPUS) -> Report:
    """Feed ``decoder`` ``inputs`` inputs; its report (crash: the first one, shrunk)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as with_seed

    from peermesh.errors import ProtocolError

    report = Report(decoder.name)
    function = decoder.load()
    if function is None:
        report.absent = True
        return report
    corpus = load_corpus(decoder, corpus_dir)

    @settings(max_examples=inputs, database=None, deadline=None, derandomize=seed is None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])
    @given(strategy(decoder, corpus))
    def one(data: Input) -> None:
        report.inputs += 1
        try:
            function(data)
        except ProtocolError:
            report.refused += 1
            return
        except Exception as exc:
            report.crash = (data, f"{type(exc).__name__}: {exc}")
            raise
        report.decoded += 1

    if seed is not None:
        one = with_seed(seed)(one)
    start = time.perf_counter()
    try:
        one()
    except Exception:  # the crash, shrunk: report.crash holds the last (smallest) one
        if report.crash is None:
            raise           # not the decoder's: a fault of this script

    report.seconds = time.perf_counter() - start
    return report


def main(argv: Optional[list[str]] = None) -> int:
    names = [d.name for d in DECODERS]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("decoders", nargs="*", metavar="DECODER",
                        help=f"which to fuzz (default: all): {', '.join(names)}")
    parser.add_argument("-n", "--inputs", type=int, default=10_000,
                        help="inputs per decoder (default: 10,000)")
    parser.add_argument("--seed", type=int, help="random seed (default: a fixed sequence)")
    parser.add_argument("--save", action="store_true",
                        help="append each crashing input to its decoder's corpus file")
    args = parser.parse_args(argv)
    unknown = [n for n in args.decoders if n not in names]
    if unknown:
        parser.error(f"unknown decoder {', '.join(unknown)} (known: {', '.join(names)})")
    if args.inputs < 1:
        parser.error("--inputs must be 1 or more")
    sys.path.insert(0, str(ROOT))
    chosen = [d for d in DECODERS if not args.decoders or d.name in args.decoders]
    print(f"{'decoder':<18} {'inputs':>9} {'decoded':>9} {'refused':>9} {'crashes':>8} "
          f"{'seconds':>8}")
    crashed = 0
    for decoder in chosen:
        report = fuzz(decoder, args.inputs, seed=args.seed)
        if report.absent:
            print(f"{decoder.name:<18} absent ({decoder.where.partition(':')[0]} does not exist)")
            continue
        print(f"{report.name:<18} {report.inputs:>9,} {report.decoded:>9,} {report.refused:>9,} "
              f"{int(report.crash is not None):>8} {report.seconds:>8.1f}", flush=True)
        if report.crash is not None:
            crashed += 1
            data, why = report.crash
            print(f"  crash: {why}\n  input: {format_input(data)[:400]}")
            if args.save:
                save_input(decoder, data, f"crashed: {why[:120]}")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
