"""Safir-Darbaan peers in child processes, driven over stdin/stdout (JSON lines).

Run as ``python sadachild.py ROLE CONFIG_JSON``. The first line out is
``{"event": "READY", "pid": ..., ...}``; commands come in on stdin, one JSON
object per line, and are answered with ``{"event": "OK", "id": ..., "result":
...}`` or ``{"event": "ERROR", "id": ..., "error": ...}``. End of input stops
the child gracefully.

* ``server``: a ``Server`` with the demo ``echo`` service (labelled with
  ``name``) and ``work`` 1.0: action ``run`` appends ``"<name> <key>"`` to
  ``<log_dir>/runs-<name>.log`` (one line per execution, flushed), sleeps
  ``ms`` milliseconds and returns ``{"server": name, "key": key}``. With
  ``port`` it runs a node (beacon port ``port``, interface ``interface``)
  and finds channels on the mesh; ``channels`` names channels directly.
* ``channel``: a node with a ``Channel`` (found by servers on the mesh), or
  just a channel bound at ``endpoint`` when no ``port`` is given. Commands:
  ``wait`` (service, count, timeout), ``call`` (service, action, payload,
  version, timeout, retries) and ``load`` (n, window, retries, timeout):
  ``window`` requests to ``work``/``run`` in flight until ``n`` were sent,
  ``{"event": "PROGRESS", "done": d}`` every 20 answers, then ``{"event":
  "LOAD", ...}`` with what came back.

The test side reads these lines with ``tests/lanpeers.py``'s ``JsonLines``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import gevent
import gevent.event
from gevent.fileobject import FileObjectPosix

SCRIPT = os.path.abspath(__file__)


def out(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def node_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    keys = ("interface", "port", "interval", "evasive", "silent", "expired")
    return {k: cfg[k] for k in keys if cfg.get(k) is not None}


def run_server(cfg: dict[str, Any]) -> None:
    from peermesh import Node
    from peermesh.sada import Server, Service, echo_service

    name = cfg["name"]
    log_path = os.path.join(cfg.get("log_dir") or ".", f"runs-{name}.log")
    log = open(log_path, "a", buffering=1)
    work = Service("work", "1.0")

    @work.action("run")
    def run(payload: dict[str, Any]) -> dict[str, Any]:
        log.write(f"{name} {payload['key']}\n")
        log.flush()
        if payload.get("ms"):
            gevent.sleep(payload["ms"] / 1000.0)
        return {"server": name, "key": payload["key"]}

    node = Node(name, **node_settings(cfg)) if cfg.get("port") else None
    server = Server(node, channels=cfg.get("channels", ()),
                    services=[echo_service(name, cfg.get("version", "1.0")), work])
    if node is not None:
        node.start()
    server.start()
    out({"event": "READY", "pid": os.getpid(), "name": name,
         "uuid": node.uuid.hex if node else None})
    serve_stdin(lambda cmd: None)
    server.stop(0.5)
    if node is not None:
        node.stop()
    out({"event": "EXITING"})


def run_channel(cfg: dict[str, Any]) -> None:
    from peermesh import Node
    from peermesh.sada import Channel

    node = Node(cfg.get("name", "chan"), **node_settings(cfg)) if cfg.get("port") else None
    settings = {"ping_interval": cfg.get("ping_interval", 0.2)}
    if node is not None:
        channel = Channel(node, **settings)
        node.start()
    else:
        channel = Channel(endpoint=cfg["endpoint"], **settings)
    channel.start()
    out({"event": "READY", "pid": os.getpid(), "endpoint": channel.endpoint,
         "uuid": node.uuid.hex if node else None})

    def command(cmd: dict[str, Any]) -> Any:
        op = cmd["op"]
        if op == "wait":
            return channel.wait_for(cmd["service"], cmd.get("version"), cmd.get("count", 1),
                                    cmd.get("timeout", 5.0))
        if op == "call":
            return channel.request(cmd["service"], cmd["action"], cmd.get("payload"),
                                   version=cmd.get("version"), timeout=cmd.get("timeout"),
                                   retries=cmd.get("retries", 0))
        if op == "servers":
            return [s.to_dict() for s in channel.servers()]
        if op == "load":
            gevent.spawn(load, channel, cmd)
            return True
        raise ValueError(f"unknown op {op!r}")

    serve_stdin(command)
    channel.stop()
    if node is not None:
        node.stop()
    out({"event": "EXITING"})


def load(channel: Any, cmd: dict[str, Any]) -> None:
    """Keep ``window`` requests in flight until ``n`` were sent; report every outcome."""
    n, window = cmd["n"], cmd["window"]
    started: dict[int, float] = {}
    outcomes: dict[int, str] = {}
    servers: dict[str, int] = {}
    errors: dict[str, int] = {}
    done = gevent.event.Event()
    state = {"sent": 0, "answered": 0, "duplicates": 0, "max_latency": 0.0}

    def send_one() -> None:
        key = state["sent"]
        state["sent"] += 1
        started[key] = time.monotonic()
        result = channel.request_async("work", "run", {"key": key, "ms": cmd.get("ms", 0)},
                                       retries=cmd.get("retries", 0),
                                       timeout=cmd.get("timeout", 5.0))
        result.rawlink(lambda r: answered(key, r))

    def answered(key: int, result: Any) -> None:
        if key in outcomes:
            state["duplicates"] += 1
            return
        state["max_latency"] = max(state["max_latency"], time.monotonic() - started[key])
        if result.successful():
            value = result.value
            if value.get("key") != key:
                outcomes[key] = "wrong"
            else:
                outcomes[key] = "ok"
                servers[value["server"]] = servers.get(value["server"], 0) + 1
        else:
            kind = type(result.exception).__name__
            outcomes[key] = kind
            errors[kind] = errors.get(kind, 0) + 1
        state["answered"] += 1
        if state["answered"] % 20 == 0:
            out({"event": "PROGRESS", "done": state["answered"]})
        if state["answered"] >= n:
            done.set()
        elif state["sent"] < n:
            send_one()

    for _ in range(min(window, n)):
        send_one()
    done.wait()
    out({"event": "LOAD", "sent": state["sent"], "answered": state["answered"],
         "ok": sum(1 for o in outcomes.values() if o == "ok"),
         "wrong": sum(1 for o in outcomes.values() if o == "wrong"), "errors": errors,
         "servers": servers, "duplicates": state["duplicates"],
         "max_latency": state["max_latency"], "stats": dict(channel.stats)})


def serve_stdin(command: Any) -> None:
    stdin = FileObjectPosix(sys.stdin.fileno(), "rb", close=False)
    for raw in stdin:
        cmd = json.loads(raw)
        if cmd.get("op") == "stop":
            break
        try:
            result = command(cmd)
        except Exception as exc:  # reported to the test, which decides
            out({"event": "ERROR", "id": cmd.get("id"), "error": f"{type(exc).__name__}: {exc}"})
        else:
            out({"event": "OK", "id": cmd.get("id"), "result": result})


def main() -> None:
    role, cfg = sys.argv[1], json.loads(sys.argv[2])
    {"server": run_server, "channel": run_channel}[role](cfg)


if __name__ == "__main__":
    main()
