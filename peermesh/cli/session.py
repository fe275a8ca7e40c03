"""How every command ends on SIGINT/SIGTERM: one session for all of them.

Two kinds of command:

* A command that *serves* (``run``, ``agent``, ``worker``, ``serve`` ...)
  runs until it is stopped: the first signal stops its node cleanly and the
  command ends with exit code 0.
* Any other command is *interrupted*: the first signal raises
  ``Interrupted`` where the command waits (a reply, a peer, a file chunk),
  its ``finally`` blocks stop the node, and the entry point prints what was
  left undone (``Interrupted.left``, see ``leaving``) and exits 130.

A second signal always interrupts. Commands without a node (through the
agent, ``job list``, ``simulate``) get ``KeyboardInterrupt`` from the plain
handlers that ``install_handlers`` puts on both signals.
"""

from __future__ import annotations

import _signal
import time

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing at run time
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

    from ..config import NodeConfig
    from ..events import Event
    from ..zre.node import Node

from ..errors import PeermeshError

__all__ = ["Interrupted", "HubSignals", "NodeSession", "install_handlers", "leaving"]


def _logger() -> Any:
    import logging

    return logging.getLogger(__name__)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped a command; ``left`` says what it left undone."""

    def __init__(self, left: str = "") -> None:
        super().__init__(left)
        self.left = left


def _interrupt(signum: int, frame: Any) -> None:
    raise Interrupted()


def install_handlers() -> None:
    """SIGINT and SIGTERM raise ``Interrupted`` in the main thread (SIGTERM's default
    would end the process with no message and exit code 143)."""
    _signal.signal(_signal.SIGINT, _interrupt)
    _signal.signal(_signal.SIGTERM, _interrupt)


class leaving:
    """``with leaving(text):`` names what an interruption inside the block leaves undone
    (the innermost ``leaving`` wins)."""

    def __init__(self, left: str) -> None:
        self.left = left

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if isinstance(exc, Interrupted) and not exc.left:
            exc.left = self.left


class HubSignals:
    """SIGINT and SIGTERM handled on the gevent hub while open (as a context manager).

    The first signal calls ``on_first`` when given (a serving command's clean
    stop); any other throws ``Interrupted`` into the greenlet that opened it,
    from the hub, as gevent itself delivers ``KeyboardInterrupt``, so that no
    greenlet of the node dies of it.
    """

    def __init__(self, on_first: Optional[Callable[[], Any]] = None) -> None:
        import gevent
        from greenlet import getcurrent

        self.interrupted = False
        self._on_first = on_first
        self._main = getcurrent()
        # Keep the handler objects alive while open; gevent runs each call in a
        # greenlet of its own, so ``on_first`` may block there.
        self._handlers = [gevent.signal_handler(sig, self._on_signal)
                          for sig in (_signal.SIGINT, _signal.SIGTERM)]

    def _on_signal(self) -> None:
        import gevent

        first, self.interrupted = not self.interrupted, True
        if first and self._on_first is not None:
            self._on_first()
        else:
            gevent.get_hub().loop.run_callback(self._main.throw, Interrupted())

    def close(self) -> None:
        """Hand the signals back to ``install_handlers``."""
        for handler in self._handlers:
            handler.cancel()
        install_handlers()  # cancelling gevent's handler left the default behind

    def __enter__(self) -> "HubSignals":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NodeSession:
    """A node for one command, stopped once: by the command, or by SIGINT/SIGTERM.

    ``serving``: the command runs until stopped, and a signal is its normal
    end (see the module docstring).
    """

    def __init__(self, config: NodeConfig, *, serving: bool = False) -> None:
        import gevent

        from ..zre.node import Node

        try:
            self.node = Node(config=config)
        except TypeError as exc:  # e.g. a TOML group or header that is not a string
            raise ValueError(f"invalid configuration: {exc}") from None
        self._stopper: Optional[gevent.Greenlet] = None
        self._serving = serving
        #: the Prometheus endpoint (``config.metrics``) of a serving command, once started
        self.metrics: Any = None
        self._signals = HubSignals((lambda: gevent.spawn(self.stop)) if serving else None)
        #: SIGHUP re-reads the allowed keys of a serving command's node (`systemctl reload`)
        self._reload = (gevent.signal_handler(_signal.SIGHUP, self._reload_keys)
                        if serving else None)

    def _reload_keys(self) -> None:
        curve = self.node.curve
        if curve is None or curve.allowlist.any_key:
            _logger().info("SIGHUP: this node has no allowed keys to reload")
            return
        try:
            self.node.reload_allowed_keys()
        except PeermeshError as exc:  # e.g. the directory was removed: keep the old keys
            _logger().error("cannot reload the allowed keys: %s", exc)

    @property
    def interrupted(self) -> bool:
        """True once SIGINT or SIGTERM came."""
        return self._signals.interrupted

    def start(self) -> Node:
        """Start the node; RuntimeError naming what could not be bound."""
        import zmq

        cfg = self.node.config
        try:
            node = self.node.start()
        except OSError as exc:
            raise RuntimeError(f"cannot start the node (UDP beacon port {cfg.port}): "
                               f"{exc.strerror or exc}") from exc
        except zmq.ZMQError as exc:
            raise RuntimeError(f"cannot start the node (mailbox): {exc}") from exc
        from ..logs import set_node

        set_node(node.name, node.uuid.hex)
        _logger().info("node %s (%s) at %s, beacons on port %d every %gs", node.name, node.uuid.hex,
                 node.endpoint, cfg.port, cfg.interval)
        if self._serving and cfg.metrics:
            from ..metrics import serve_configured

            try:
                self.metrics = serve_configured(node)
                if self.metrics is not None:
                    from .output import note

                    note(f"metrics at {self.metrics.url}")
            except OSError as exc:
                self.stop()
                raise RuntimeError(f"cannot serve metrics at {cfg.metrics}: "
                                   f"{exc.strerror or exc}") from exc
        return node

    def stop(self) -> None:
        """Stop the node (port-0 beacon, flush); concurrent callers wait for the same stop."""
        if self._stopper is None:
            import gevent

            self._stopper = gevent.spawn(self.node.stop)
        self._stopper.join()

    def close(self) -> None:
        """Stop the node and hand the signals back to ``install_handlers``."""
        try:
            if self.metrics is not None:
                self.metrics.close()
            self.stop()
        finally:
            self._signals.close()
            if self._reload is not None:
                self._reload.cancel()

    def wait_event(self, deadline: float) -> Optional[Event]:
        """The next event before ``deadline`` (monotonic), or None."""
        return self.node.recv(max(0.0, deadline - time.monotonic()))

    def wait_stopped(self) -> None:
        """Read and drop events until the node stops (when serving: until a signal)."""
        for _ in self.node.events():
            pass

    def __enter__(self) -> Node:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
