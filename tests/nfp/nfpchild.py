"""One NFP node in its own process, for the multi-process tests.

``python nfpchild.py '<json config>'`` starts a gevent ``Node`` on loopback
with an ``NfpNode`` (workers and/or broker candidacy), prints one JSON line
``{"event": "ready", ...}`` and then one line per broker change, and runs
until its stdin closes (the test's finaliser closes it, then kills what is
left) or it is killed. Tasks (``TASKS``) record every execution by appending
a line to ``<data_dir>/runs-<worker>.log``, so tests can count runs across
restarts.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import gevent
import gevent.os

from peermesh import Node
from peermesh.nfp import NfpNode, Tasks
from peermesh.nfp.worker import JobContext

TASKS = Tasks()
_config: dict[str, Any] = {}


def _record(job: JobContext, what: str) -> None:
    with open(os.path.join(_config["data_dir"], f"runs-{job.worker}.log"), "a") as log:
        log.write(f"{job.uuid} {what} {os.getpid()}\n")


@TASKS.task()
def echo(job: JobContext, *args: Any, **kwargs: Any) -> dict[str, Any]:
    _record(job, "echo")
    return {"args": list(args), "kwargs": kwargs, "worker": job.worker, "pid": os.getpid()}


@TASKS.task()
def sleep(job: JobContext, seconds: float = 1.0) -> str:
    _record(job, "sleep-start")
    job.event("sleeping", seconds=seconds)
    gevent.sleep(float(seconds))
    _record(job, "sleep-end")
    return f"{job.worker} slept {seconds}"


@TASKS.task()
def die(job: JobContext, path: str) -> None:
    """End this process (as a crash would) once the file ``path`` exists, at most 30 s."""
    _record(job, "die-start")
    for _ in range(3000):
        if os.path.exists(path):
            os._exit(7)
        gevent.sleep(0.01)


@TASKS.task()
def hold(job: JobContext, path: str) -> str:
    """Run until the file ``path`` exists (the test creates it), at most 30 s."""
    _record(job, "hold-start")
    for _ in range(3000):
        if os.path.exists(path):
            break
        gevent.sleep(0.01)
    _record(job, "hold-end")
    return f"{job.worker} held"


def main() -> None:
    cfg = json.loads(sys.argv[1])
    _config.update(cfg)
    node = Node(cfg["name"], interface="lo", port=cfg["port"], interval=cfg.get("interval", 0.05),
                evasive=cfg.get("evasive", 0.3), silent=cfg.get("silent", 0.4),
                expired=cfg.get("expired", 0.6))
    nfp = NfpNode(node, data_dir=cfg["data_dir"], broker=cfg.get("broker", "never"),
                  priority=cfg.get("priority", 0), keepalive=cfg.get("keepalive", 0.1),
                  multiplier=cfg.get("multiplier", 3), queue_timeout=cfg.get("queue_timeout", 5),
                  request_timeout=cfg.get("request_timeout", 2), files_root=cfg.get("files_root"),
                  inventory_dir=cfg.get("inventory_dir"), admin_token=cfg.get("admin_token"))
    for service, name in cfg.get("workers", []):
        nfp.add_worker(service, name, TASKS)

    def on_broker(change: Any) -> None:
        print(json.dumps({"event": "broker", "broker": change.new.name if change.new else None,
                          "took_over": change.took_over, "stepped_down": change.stepped_down}),
              flush=True)
    nfp.add_listener(on_broker)
    node.start()
    nfp.start()
    print(json.dumps({"event": "ready", "name": node.name, "uuid": node.uuid.hex,
                      "pid": os.getpid(),
                      "workers": {w.name: w.endpoint for w in nfp.workers}}), flush=True)

    def drain() -> None:
        for _ in node.events():
            pass

    def stdin_closed() -> None:
        gevent.os.make_nonblocking(0)
        while gevent.os.nb_read(0, 4096):
            pass

    waiters = [gevent.spawn(drain), gevent.spawn(stdin_closed)]
    gevent.wait(waiters, count=1, timeout=cfg.get("lifetime", 120))
    nfp.stop()
    node.stop()


if __name__ == "__main__":
    main()
