"""The one-shot ``flux`` commands (``rpc``, ``pub``, ``sub``, ``ping``, ``tree``): each a
rankless client of one member (``peermesh.flux.cliclient``) for as long as it runs."""

from __future__ import annotations

import argparse
import errno
import json
import time
from typing import TYPE_CHECKING, Any, Iterator, Optional

from ..cli.output import EXIT_FAILURE, EXIT_OK, clean, emit, note, table, to_json
from ..cli.session import leaving
from ..config import NodeConfig
from ..wire.flux import NODEID_ANY
from .errors import FluxError
from .outputs import MAX_OFFLINE
from .cliclient import Connection, _error_text, _readable, _shown

if TYPE_CHECKING:  # the overlay (and gevent) are imported by the actions, not by the parser
    from .client import FluxClient


def _payload(text_: Optional[str]) -> Optional[dict[str, Any]]:
    """The JSON argument as a payload object; ValueError naming what is wrong."""
    if text_ is None:
        return None
    try:
        obj = json.loads(text_)
    except ValueError as exc:
        raise ValueError(f"JSON argument {text_!r:.60} is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"JSON argument must be an object ({{...}}): Flux payloads are JSON "
                         f"objects, not {type(obj).__name__}")
    return obj


def _cmd_rpc(args: argparse.Namespace, config: NodeConfig) -> int:
    payload = _payload(args.payload)
    with Connection(args, config) as flux:
        rank = _checked_rank(flux, args.rank, args.timeout)
        future = flux.rpc(args.topic, payload, NODEID_ANY if rank is None else rank,
                          streaming=args.stream)
        try:
            with leaving(f"waiting for the answer to {args.topic}"):
                if not args.stream:
                    _print_answer(args, future.get(args.timeout))
                    return EXIT_OK
                try:
                    for answer in future.stream(args.timeout):
                        _print_answer(args, answer)
                except KeyboardInterrupt:
                    future.cancel()
                    raise
        except FluxError as exc:
            return _rpc_error(args, exc)
    return EXIT_OK


def _print_answer(args: argparse.Namespace, payload: Optional[bytes]) -> None:
    if args.json:
        emit(to_json({"topic": args.topic, "payload": _readable(payload)}))
    elif payload is not None:  # no payload, no line (as flux-core's `flux rpc`)
        emit(_shown(payload))


def _rpc_error(args: argparse.Namespace, exc: FluxError) -> int:
    if args.json:
        emit(to_json({"topic": args.topic, "errnum": exc.errnum,
                      "error": errno.errorcode.get(exc.errnum, str(exc.errnum)),
                      "message": exc.message}))
    note(f"error: {_error_text(exc)}")
    return EXIT_FAILURE


def _checked_rank(flux: FluxClient, rank: Optional[int], timeout: float) -> Optional[int]:
    """``rank``, or ValueError when it is past the instance's size (the member's, and when
    past that, rank 0's: a member does not hear of every rank given after it joined)."""
    if rank is None or rank < flux.size:
        return rank
    with leaving("asking rank 0 for the instance's size"):
        size = flux.rpc("peermesh.info", None, 0).get_json(timeout).get("size")
    if isinstance(size, int) and rank >= size:
        raise ValueError(f"rank {rank} is out of range: the instance has ranks 0..{size - 1}")
    return rank


def _cmd_pub(args: argparse.Namespace, config: NodeConfig) -> int:
    payload = _payload(args.payload)
    with Connection(args, config) as flux:
        try:
            with leaving(f"waiting for rank 0 to number event {args.topic}"):
                seq = flux.publish(args.topic, payload).get_json(args.timeout)["seq"]
        except FluxError as exc:
            return _rpc_error(args, exc)
    if args.json:
        emit(to_json({"seq": seq, "topic": args.topic}))
    elif args.synchronous:
        emit(f"seq={seq}")
    return EXIT_OK


def _cmd_sub(args: argparse.Namespace, config: NodeConfig) -> int:
    with Connection(args, config) as flux:
        flux.add_listener(_report_lost)
        try:
            with leaving(f"subscribing to {args.prefix!r} events"):
                subscription = flux.subscribe(args.prefix, args.timeout)
        except FluxError as exc:
            note(f"error: {_error_text(exc)}")
            return EXIT_FAILURE
        note(f"subscribed to {args.prefix!r} events through rank {flux.rank}; Ctrl-C to stop")
        shown = 0
        try:
            while flux.connected or flux.reconnecting:
                event = subscription.get(flux.heartbeat)  # (wakes to see a lost member)
                if event is None:
                    continue
                if args.json:
                    emit(to_json({"seq": event.seq, "topic": event.topic,
                                  "payload": _readable(event.payload)}))
                else:
                    emit(f"{clean(event.topic)}\t{_shown(event.payload)}")
                shown += 1
                if args.count is not None and shown >= args.count:
                    break
        except KeyboardInterrupt:
            return EXIT_OK  # the normal end of following
    return EXIT_OK if flux.connected or args.count is not None and shown >= args.count \
        else EXIT_FAILURE


def _report_lost(notice: Any) -> None:
    if notice.what == "member-lost":
        note(f"the member (rank {notice.rank}) was lost ({clean(notice.detail)}); "
             "looking for another")
    elif notice.what == "member-changed":
        note(f"carrying on through rank {notice.rank} at {clean(notice.detail)}")
    elif notice.what == "failover-failed":
        note(f"error: no member took over ({clean(notice.detail)})")
    elif notice.what == "events-lost":
        note(f"events {notice.detail[0]} to {notice.detail[1]} are no longer kept by rank 0: "
             "those that matched are lost")


def _cmd_ping(args: argparse.Namespace, config: NodeConfig) -> int:
    import gevent

    from .bodies import ping_body

    nodeid, service, label = args.target
    if args.batch and not args.count:
        raise ValueError("--batch needs --count: it sends every ping first")
    topic = service + ".ping"
    pad = "p" * args.pad
    rtts: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    with Connection(args, config) as flux:
        if nodeid is None:
            rows = walk_tree(flux, args.timeout)   # a rank that did not answer fails its ping too
            targets = [(row["rank"], str(row["rank"])) for row in rows]
            # and the ranks rank 0 has lost (a killed member is no one's child any more)
            targets += [(r, str(r)) for r in rows[0].get("offline", ()) if r not in
                        {t for t, _ in targets}]
            counts = args.count or 1
        else:
            if nodeid <= 0xFFFFFFFD:
                _checked_rank(flux, nodeid, args.timeout)
            targets, counts = [(nodeid, label)], args.count or 0
        if not args.json:
            emit(f"flux-ping {label}!{service}")

        def answered(name: str, seq: int, sent: float, future: Any) -> bool:
            try:
                answer = future.get_json(args.timeout)
            except FluxError as exc:
                failed.append({"rank": int(name) if name.isdigit() else name,
                               "error": _error_text(exc)})
                if not args.json:
                    note(f"{'' if name == 'any' else name + '!'}{_error_text(exc)}")
                return False
            ms = (time.monotonic() - sent) * 1000
            rank, route = answer.get("rank"), answer.get("route", "")
            rtts.append({"rank": rank, "seq": seq, "ms": round(ms, 3), "route": route})
            if not args.json:
                cred = (f" userid={answer.get('userid')} rolemask="
                        f"{_hex(answer.get('rolemask'))}" if args.userid else "")
                emit(f"{rank}!{topic} pad={args.pad}{cred} seq={seq} time={ms:.3f} ms "
                     f"({clean(str(route))})")
            return True

        with leaving("pinging"):
            for target, name in targets:
                seq = 0
                batch: list[tuple[int, float, Any]] = []
                while not counts or seq < counts:
                    if seq:
                        gevent.sleep(args.ping_interval)
                    sent = time.monotonic()
                    future = flux.rpc(topic, ping_body(seq, pad), target)
                    if args.batch:
                        batch.append((seq, sent, future))
                    elif not answered(name, seq, sent, future) and nodeid is not None:
                        break  # as flux ping: the first error ends it
                    seq += 1
                for seq, sent, future in batch:
                    answered(name, seq, sent, future)
    summary = _summary(rtts, failed)
    if args.json:
        emit(to_json({"pings": rtts, "unreachable": failed, "summary": summary}))
    elif args.summary and (rtts or failed):
        times = (f": min/mean/max = {summary['min_ms']:.3f}/{summary['mean_ms']:.3f}/"
                 f"{summary['max_ms']:.3f} ms" if rtts else "")
        emit(f"{summary['answered']} answered, {summary['unreachable']} unreachable{times}")
    return EXIT_FAILURE if failed else EXIT_OK


def _hex(value: Any) -> str:
    return f"{value:#x}" if isinstance(value, int) else str(value)


def _summary(rtts: list[dict[str, Any]], failed: list[dict[str, Any]]) -> dict[str, Any]:
    times = [r["ms"] for r in rtts]
    summary: dict[str, Any] = {"answered": len(times), "unreachable": len(failed)}
    if times:
        summary.update(min_ms=min(times), mean_ms=round(sum(times) / len(times), 3),
                       max_ms=max(times))
    return summary


def walk_tree(flux: FluxClient, timeout: float,
              limit: Optional[int] = None) -> list[dict[str, Any]]:
    """``peermesh.info`` of rank 0, then of each rank's children, level by level: rows of
    {rank, parent, state, children, torpid, size, seq, topology, clients}; a rank that does not
    answer is {rank, parent, state: "unreachable", error}. With ``limit``, at most that many
    ranks are asked (the lowest of each level first)."""
    rows: list[dict[str, Any]] = []
    level: dict[int, Optional[int]] = {0: None}  # rank -> the rank that listed it
    seen: set[int] = set()
    while level:
        if limit is not None:
            level = dict(sorted(level.items())[:max(0, limit - len(rows))])
        seen.update(level)
        futures = [(rank, parent, flux.rpc("peermesh.info", None, rank))
                   for rank, parent in level.items()]
        level = {}
        for rank, parent, future in futures:
            try:
                row = _tree_row(rank, parent, future.get_json(timeout))
            except FluxError as exc:
                rows.append({"rank": rank, "parent": parent, "state": "unreachable",
                             "error": _error_text(exc)})
                continue
            rows.append(row)
            for child in row["children"]:
                if child not in seen:
                    level.setdefault(child, rank)
    return rows


def _tree_row(rank: int, parent: Optional[int], info: dict[str, Any]) -> dict[str, Any]:
    """A member's ``peermesh.info`` answer as a row, whatever it sent (rank and parent as
    the walk found them)."""
    def ranks(key: str) -> list[int]:
        value = info.get(key)
        return [r for r in value if type(r) is int and r >= 0] if isinstance(value, list) else []

    def scalar(key: str) -> Any:
        value = info.get(key)
        return value if type(value) in (int, str) else None

    return {"rank": rank, "parent": parent, "state": str(info.get("state", "?")),
            "children": ranks("children"), "torpid": ranks("torpid"), "size": scalar("size"),
            "seq": scalar("seq"), "topology": scalar("topology"), "clients": scalar("clients"),
            **({"offline": ranks("offline")[:MAX_OFFLINE]} if rank == 0 else {})}


def _cmd_tree(args: argparse.Namespace, config: NodeConfig) -> int:
    with Connection(args, config) as flux:
        with leaving("walking the tree"):
            rows = walk_tree(flux, args.timeout)
    if args.json:
        emit(to_json(rows))
        return EXIT_OK
    depth: dict[int, int] = {}
    torpid = {r for row in rows for r in row.get("torpid", ())}
    lines = [("RANK", "PARENT", "STATE", "CHILDREN")]
    for row in _depth_first(rows):
        rank, parent = row["rank"], row.get("parent")
        depth[rank] = depth.get(parent, -1) + 1 if parent is not None else 0
        state = clean(row["state"]) + (" torpid" if rank in torpid else "") + \
            (f": {row['error']}" if "error" in row else "")
        lines.append(("  " * depth[rank] + str(rank), "-" if parent is None else str(parent),
                      state, ",".join(map(str, row.get("children", ()))) or "-"))
    emit(table(lines))
    root = rows[0]
    if "error" not in root:
        answered = sum(1 for row in rows if "error" not in row)
        note(f"{answered} members answered; size {root['size']}, {clean(root['topology'])}, "
             f"last event {root['seq']}")
    return EXIT_OK


def _depth_first(rows: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    by_parent: dict[Optional[int], list[dict[str, Any]]] = {}
    for row in rows:
        by_parent.setdefault(row.get("parent") if row["rank"] else None, []).append(row)
    stack = list(reversed(by_parent.get(None, [])))
    while stack:
        row = stack.pop()
        yield row
        stack.extend(reversed(sorted(by_parent.get(row["rank"], []), key=lambda r: r["rank"])))
