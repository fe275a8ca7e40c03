"""Where a server's handlers run: greenlets kept and reused, none made per request."""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import gevent
import gevent.event
from greenlet import GreenletExit, getcurrent, greenlet

__all__ = ["Workers"]

log = logging.getLogger(__name__)

_JOB = object()     # marks a job switched into a worker greenlet


class Workers:
    """Greenlets that run handlers, kept and reused (no greenlet made per request).

    ``run`` from the hub switches straight into an idle worker, which runs the
    job up to its end or its first wait and then hands the hub back, so the
    read that found the request carries on at once. From other greenlets the
    job is handed over through the hub's callbacks.
    """

    def __init__(self, hub: Any) -> None:
        self._hub = hub
        self._idle: list[greenlet] = []
        self._all: set[greenlet] = set()
        self.busy = 0
        self._quiet: Optional[gevent.event.Event] = None   # made by wait()

    def run(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` in a worker greenlet."""
        self.busy += 1
        if getcurrent() is self._hub:
            self._start(fn, args)
        else:
            self._hub.loop.run_callback(self._start, fn, args)

    def _start(self, fn: Callable[..., None], args: tuple) -> None:
        if self._idle:
            worker = self._idle.pop()
        else:
            worker = greenlet(self._work, parent=self._hub)
            self._all.add(worker)
        worker.switch(_JOB, fn, args)

    def _work(self, *job: Any) -> None:
        me = getcurrent()
        while True:
            try:
                job[1](*job[2])
            except GreenletExit:
                self._done()
                self._all.discard(me)
                return
            except Exception:
                log.exception("a request handler's greenlet failed")
            self._done()
            self._idle.append(me)
            while True:   # parked until the next job
                try:
                    job = self._hub.switch()
                except GreenletExit:   # kill() has forgotten the idle ones already
                    if me in self._idle:
                        self._idle.remove(me)
                    self._all.discard(me)
                    return
                except BaseException:  # e.g. a gevent.Timeout a handler left running
                    log.debug("ignored an exception thrown into an idle worker", exc_info=True)
                    continue
                if type(job) is tuple and len(job) == 3 and job[0] is _JOB:
                    break
                log.debug("ignored a switch into an idle worker: %r", job)

    def _done(self) -> None:
        self.busy -= 1
        if not self.busy and self._quiet is not None:
            self._quiet.set()

    def wait(self, timeout: float) -> bool:
        """Wait (up to ``timeout``) until no job runs; True if none does."""
        if not self.busy:
            return True
        self._quiet = gevent.event.Event()
        return self._quiet.wait(timeout)

    def kill(self) -> None:
        """End every worker (running jobs get GreenletExit)."""
        for worker in list(self._all):
            if not worker.dead:
                gevent.kill(worker)
        self._idle.clear()
        self._all.clear()
