"""One MTL gateway in its own process, for the kill -9 tests.

``python gatewaychild.py '<json config>'`` starts a gevent ``Node`` on
loopback with a ``Gateway`` (``run`` "always" unless the config says
otherwise), prints one JSON line ``{"control": ..., "data": ...}`` once it
has started, then ``{"state": ...}`` at each change (serving, standing-by,
replica), and runs until its stdin closes or it is killed.
"""

from __future__ import annotations

import json
import sys

import gevent
import gevent.os

from peermesh import Node
from peermesh.mtl.gateway import Gateway


def main() -> None:
    cfg = json.loads(sys.argv[1])
    node = Node(cfg["name"], interface="lo", port=cfg["port"], interval=0.05, evasive=0.3,
                silent=0.4, expired=0.6)
    gateway = Gateway(cfg["credentials"], run=cfg.get("run", "always"),
                      priority=cfg.get("priority", 0), settle=cfg.get("settle"),
                      control_port=cfg.get("control_port", 0), data_port=cfg.get("data_port", 0),
                      data_dir=cfg["data_dir"], heartbeat=cfg.get("heartbeat", 1.0),
                      on_state=lambda state: print(json.dumps({"state": state}), flush=True))
    gateway.attach(node)
    node.start()
    gateway.start()
    print(json.dumps({"control": gateway.control_endpoint, "data": gateway.data_endpoint}),
          flush=True)
    gevent.os.make_nonblocking(sys.stdin.fileno())
    while gevent.os.nb_read(sys.stdin.fileno(), 1024):
        pass
    gateway.stop()
    node.stop()


if __name__ == "__main__":
    main()
