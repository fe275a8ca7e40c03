"""One Flux node in its own process, for the multi-process tests.

``python fluxchild.py '<json config>'`` starts a ``FluxOverlay`` on loopback
(``root`` or ``parents``, ``topology``, fast timers), serves a few test
services, prints one JSON line ``{"event": "ready", "rank", "endpoint",
"pid"}`` once it is in the tree, and runs until its stdin closes or it is
killed. Services: ``svc.echo`` (rank, pid, what it got), ``svc.stream``
(``count`` answers every ``interval`` s, ends early when cancelled or its
client goes; ``svc.ended`` lists those ends as ``{"matchtag", "cancelled"}``),
``svc.hold`` (never answers), ``svc.note`` / ``svc.notes`` (count requests
sent without response), ``svc.publish`` (publish ``topics`` in order; with
``delay``, answer at once and publish ``delay`` s later),
``svc.events`` (the events seen so far, as ``[topic, seq]``).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import gevent
import gevent.os

from peermesh.flux import FluxOverlay, FluxRequest, FluxSettings


def main() -> None:
    cfg = json.loads(sys.argv[1])
    settings = FluxSettings(heartbeat=cfg.get("heartbeat", 0.1), torpid=0.3,
                            lost=cfg.get("lost", 0.6), hello_timeout=0.5)
    flux = FluxOverlay(root=cfg.get("root", False), parents=cfg.get("parents", ()),
                       rank=cfg.get("rank"), topology=cfg.get("topology", "kary:2"),
                       settings=settings, address="127.0.0.1",
                       max_message=cfg.get("max_message", 1 << 20))
    flux.start()
    notes: list[Any] = []
    events: list[list[Any]] = []
    ended: list[dict[str, Any]] = []
    flux.subscribe("", lambda event: events.append([event.topic, event.seq]))

    def echo(request: FluxRequest) -> dict[str, Any]:
        return {"rank": flux.rank, "pid": os.getpid(), "got": request.json()}

    def stream(request: FluxRequest) -> None:
        body = request.json()
        request.on_cancel = lambda: ended.append({"matchtag": request.message.matchtag,
                                                  "cancelled": request.cancelled})

        def run() -> None:
            for i in range(int(body.get("count", 10))):
                if request.cancelled:
                    return
                request.respond({"i": i})
                gevent.sleep(float(body.get("interval", 0.01)))
            request.end()

        gevent.spawn(run)

    def publish(request: FluxRequest) -> Any:
        body = request.json()
        topics, delay = body["topics"], body.get("delay")

        def run() -> None:
            if delay is not None:
                gevent.sleep(delay)
            seqs = [flux.publish(topic, {"from": flux.rank}).get_json(5)["seq"]
                    for topic in topics]
            if delay is None:
                request.respond({"seqs": seqs})

        gevent.spawn(run)
        return {"accepted": True} if delay is not None else None

    flux.register("svc.echo", echo)
    flux.register("svc.stream", stream)
    flux.register("svc.hold", lambda request: None)
    flux.register("svc.note", lambda request: notes.append(request.json()))
    flux.register("svc.notes", lambda request: {"notes": notes})
    flux.register("svc.publish", publish)
    flux.register("svc.events", lambda request: {"events": events})
    flux.register("svc.ended", lambda request: {"ended": ended})
    if not flux.wait_online(10):
        print(json.dumps({"event": "failed", "info": flux.info()}), flush=True)
        return
    print(json.dumps({"event": "ready", "rank": flux.rank, "endpoint": flux.endpoint,
                      "pid": os.getpid()}), flush=True)
    gevent.os.tp_read(sys.stdin.fileno(), 1)  # until the test closes stdin
    flux.stop()


if __name__ == "__main__":
    main()
