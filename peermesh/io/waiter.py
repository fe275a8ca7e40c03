"""Plain pyzmq sockets driven cooperatively on the gevent hub.

``zmq.green`` makes every send and receive cooperative and costs 4-6x the CPU
per message. Here sockets stay plain: callers send and receive with
``NOBLOCK`` in a loop, and only when a socket has nothing to give (or no room)
do they wait on its ``zmq.FD`` through the hub. That descriptor is
edge-triggered and signals any change, so the socket's ``EVENTS`` are checked
before every wait (which also re-arms the edge) and waits are bounded, as a
guard against a missed edge.
"""

from __future__ import annotations

from typing import Callable, Optional, cast

import gevent
import zmq

__all__ = ["SocketWaiter"]

_GUARD = 5.0  # seconds: the longest a wait trusts the edge-triggered FD alone
_EVENTS = int(zmq.EVENTS)


class SocketWaiter:
    """Waits, cooperatively, until a plain zmq socket can be read or written."""

    __slots__ = ("socket", "_watcher", "_hub")

    def __init__(self, socket: zmq.Socket) -> None:
        self.socket = socket
        self._hub = gevent.get_hub()
        self._watcher = self._hub.loop.io(socket.getsockopt(zmq.FD), 1)

    def wait(self, flag: int, timeout: Optional[float] = None) -> bool:
        """Wait until ``flag`` (POLLIN or POLLOUT) is set; False after ``timeout`` seconds."""
        getsockopt = cast(Callable[[int], int], self.socket.getsockopt)  # EVENTS is an int
        flag = int(flag)
        if getsockopt(_EVENTS) & flag:
            return True
        deadline = None if timeout is None else self._hub.loop.now() + timeout
        while not getsockopt(_EVENTS) & flag:
            step = _GUARD
            if deadline is not None:
                remaining = deadline - self._hub.loop.now()
                if remaining <= 0:
                    return False
                step = min(step, remaining)
            with gevent.Timeout(step, False):
                self._hub.wait(self._watcher)
        return True

    def close(self) -> None:
        """Stop watching the descriptor (the socket itself is closed by its owner)."""
        self._watcher.close()
