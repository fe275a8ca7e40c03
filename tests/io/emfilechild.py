"""A guarded echo ROUTER in a process out of descriptors (the EMFILE test's child).

Prints ``{"port": ...}`` once listening with every descriptor taken; on a line ``free``
from stdin frees them; on ``stats`` prints its counters; ends at end of input."""

from __future__ import annotations

import json
import logging
import os
import resource

import gevent
import gevent.os
import zmq

from peermesh.counters import Counters
from peermesh.io import HubSocket, bind_ephemeral, make_socket
from peermesh.io.connections import COUNTERS, ConnectionPolicy, GuardedListener


def main() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    router = make_socket(zmq.ROUTER)
    endpoint = bind_ephemeral(router, "127.0.0.1")
    counters = Counters(logging.getLogger("emfile"), "child", COUNTERS)
    listener = GuardedListener(HubSocket(router, endpoint=endpoint), counters,
                               ConnectionPolicy(accept_pause=0.2))
    gevent.spawn(listener.serve, lambda identity, frames: listener.try_send([identity, *frames]))
    gevent.sleep(0.05)
    fillers = []
    while True:
        try:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            break
    print(json.dumps({"port": listener.port}), flush=True)
    gevent.os.make_nonblocking(0)
    for line in iter(lambda: gevent.os.nb_read(0, 100), b""):
        for word in line.split():
            if word == b"free":
                for fd in fillers:
                    os.close(fd)
                fillers = []
            elif word == b"stats":
                print(json.dumps({**counters.snapshot(), "failures": listener.accept_failures,
                                  "connections": listener.connections}), flush=True)
    listener.close()


if __name__ == "__main__":
    main()
