"""``peermesh mtl read`` and ``peermesh mtl write``: a client of a gateway (``--gateway``, repeated
for failover) for as long as the command runs."""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import nullcontext
from typing import Any, Callable

from ..argtypes import positive_count, seconds, text, utf8
from ..cli.output import EXIT_OK, PROG, clean, emit, note, to_json
from ..cli.progress import Progress
from .passwords import PASSWORD_ENV, password_options, read_password

#: environment variables of the client options
GATEWAY_ENV, USER_ENV = "PEERMESH_MTL_GATEWAY", "PEERMESH_MTL_USER"


def _client_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("gateway options")
    group.add_argument("--gateway", "-g", metavar="ENDPOINT", action="append", type=text,
                       help="tcp://HOST:PORT of a gateway's control flow; repeat it for "
                            f"failover (default: ${GATEWAY_ENV}, comma-separated)")
    group.add_argument("--user", "-u", metavar="NAME", type=text,
                       help=f"authenticate as NAME (default: ${USER_ENV}; none: anonymous)")
    group.add_argument("--confirm", choices=("none", "full"), default="none",
                       help="none: content may be lost on the way; full: the gateway stores "
                            "it until a reader confirms it (default: %(default)s)")
    group.add_argument("--profile", default="mesh", type=text,
                       help="the gateway profile (default: %(default)s; 'test' has one "
                            "group, 'resource')")
    group.add_argument("--vhost", default="/", type=text, metavar="NAME",
                       help="the gateway's virtual host (default: %(default)s)")
    group.add_argument("--timeout", type=seconds, default=5.0, metavar="SECONDS",
                       help="longest wait for a gateway's answer (default: %(default)s)")
    group.add_argument("--server-key", metavar="FILE", type=text,
                       help="the gateway node's public certificate (peermesh keygen's PATH): "
                            "talk CURVE to a gateway on keys (default: a plain link)")
    password_options(parser)


def _add_client_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    read = command(
        "mtl read", "print what is written to mesh groups, through a gateway",
        "Summon each GROUP and print every content as it comes, one line each (the body "
        "as text), until Ctrl-C or --count. With --confirm full the gateway stores the "
        "groups' content, across restarts, until a confirmed reader (this one, or another "
        "sharing the queue) has printed and confirmed it.",
        f"  {PROG} mtl read chat -g tcp://gw.example:5560 -u alice\n"
        f"  {PROG} mtl read jobs --confirm full --json --count 10 -g tcp://gw.example:5560",
        _cmd_read, node_options=False)
    read.add_argument("groups", metavar="GROUP", nargs="+", type=text, help="a mesh group")
    read.add_argument("--json", action="store_true",
                      help="one JSON object per content: resource, sequence, body, properties")
    read.add_argument("--count", "-n", type=positive_count, metavar="N",
                      help="stop after N contents")
    _client_options(read)

    write = command(
        "mtl write", "write to a mesh group, through a gateway",
        "Send MESSAGE into GROUP; with '-' (or no MESSAGE) send each line of standard input "
        "as one content. With --confirm full it waits until the gateway has stored "
        "everything, and fails if it did not.",
        f"  {PROG} mtl write chat 'hello from afar' -g tcp://gw.example:5560 -u alice\n"
        f"  tail -f app.log | {PROG} mtl write logs - --confirm full -g tcp://gw.example:5560",
        _cmd_write, node_options=False)
    write.add_argument("group", metavar="GROUP", type=text, help="a mesh group")
    write.add_argument("message", metavar="MESSAGE", nargs="?", default="-", type=utf8,
                       help="the content; '-' (the default): each line of standard input")
    _client_options(write)


def _client(args: argparse.Namespace, password_from_stdin_ok: bool = True) -> Any:
    from .client import Client

    gateways = args.gateway or [g.strip() for g in os.environ.get(GATEWAY_ENV, "").split(",")
                                if g.strip()]
    if not gateways:
        raise ValueError(f"no gateway: give --gateway tcp://HOST:PORT or ${GATEWAY_ENV}")
    user = args.user or os.environ.get(USER_ENV) or None
    if user is not None and args.password_file == "-" and not password_from_stdin_ok:
        raise ValueError("standard input carries the messages: give the password with "
                         f"--password-file PATH, --password-env VAR or ${PASSWORD_ENV}")
    server_key = None
    if args.server_key is not None:
        from ..io.keys import load_public_key
        server_key = load_public_key(args.server_key)   # KeyFileError naming what is wrong
    password = read_password(args) if user is not None else None
    return Client(gateways, user, password, virtual_host=args.vhost, profile=args.profile,
                  timeout=args.timeout, server_key=server_key)


def _cmd_read(args: argparse.Namespace, config: Any) -> int:
    client = _client(args)
    shown = 0
    try:
        client.connect()
        reader = client.reader(args.groups, confirm=args.confirm)
        for group in args.groups:
            reader.summon(group)
        note(f"reading {', '.join(clean(g) for g in args.groups)} through {client.gateway}"
             f" as {clean(client.user or 'anonymous')}")
        with Progress("reading", total=args.count, unit="msg") if args.count is not None \
                else nullcontext(None) as bar:
            for received in reader:
                line = _render(received, args.json, len(args.groups) > 1)
                if bar is not None:
                    bar.emit(line)
                    bar.update()
                else:
                    emit(line)
                if args.confirm == "full":
                    reader.confirm(received)
                shown += 1
                if args.count is not None and shown >= args.count:
                    break
    except KeyboardInterrupt:   # Ctrl-C or SIGTERM: the normal end of following
        pass
    finally:
        client.close()
    return EXIT_OK


def _render(received: Any, as_json: bool, named: bool) -> str:
    if as_json:
        return to_json({"resource": received.resource, "sequence": received.sequence,
                        "body": received.body, "properties": received.properties})
    text = clean(received.body.decode("utf-8", "backslashreplace"))
    return f"{clean(received.resource)}: {text}" if named else text


def _cmd_write(args: argparse.Namespace, config: Any) -> int:
    from .client import ClientError

    lines = sys.stdin if args.message == "-" else [args.message]
    client = _client(args, password_from_stdin_ok=args.message != "-")
    sent = 0
    try:
        client.connect()
        where = client.gateway
        writer = client.writer([args.group], confirm=args.confirm)
        for line in lines:
            writer.send(line.rstrip("\n").encode("utf-8", "surrogateescape"), args.group)
            sent += 1
        if not writer.wait(args.timeout):
            raise ClientError(f"the gateway confirmed {sent - writer.unconfirmed} of {sent} "
                              f"contents within {args.timeout:g} s")
        if writer.rejected:
            raise ClientError(f"the gateway rejected {len(writer.rejected)} of {sent} contents")
    finally:
        client.close()
    note(f"wrote {sent} content{'s' if sent != 1 else ''} to {clean(args.group)} through "
         f"{where}{', all stored' if args.confirm == 'full' else ''}")
    return EXIT_OK
