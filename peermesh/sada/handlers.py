"""Services, their actions, and how a REQ becomes a REP status and payload.

A ``Service`` is a name, a version and a table of actions keyed by
(category, action name). A handler is a plain callable: it gets the request
payload (msgpack-decoded, or raw bytes for ``raw=True`` handlers) and returns
the reply payload. It may also

* return ``Reply(payload, status=...)`` to choose the status (or send raw bytes),
* raise ``ServiceError(status, message)`` to answer with an error status,
* return a gevent ``Greenlet`` or ``AsyncResult`` (anything with ``get`` and
  ``rawlink``): the reply is sent when it is ready.

Any other exception becomes a REP 500 whose payload is the message; the
server carries on. This module has no sockets: ``resolve`` and ``execute``
are what the server runs for each REQ, and what the tests call directly.
A REQ travels here as the tuple of its fields (``wire.sada.parse_req``); the
server's fast path finds handlers by the REQ's frames themselves
(``Service.by_frames``) and runs them with ``call``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

import msgpack

from ..wire.sada import MAX_TEXT, Status, status_frame
from .errors import ServiceError
from .versions import choose_version, version_key

__all__ = ["Service", "Handler", "Reply", "Request", "resolve", "resolve_service",
           "unknown_action", "execute", "call", "finish", "outcome", "pack", "unpack",
           "is_deferred"]

Outcome = tuple[int, bytes]
#: a REQ's fields in order: request id, service, version, category, action, payload
ReqFields = tuple[bytes, str, str, str, str, bytes]


_packb = msgpack.packb
_unpackb = msgpack.unpackb
#: what handlers return most: packed as they are, without a look for Reply or deferreds
_PLAIN = frozenset({dict, list, str, bytes, int, float, bool, type(None), tuple})
_OK = int(Status.OK)


def pack(obj: Any) -> bytes:
    """msgpack, with bin and str kept apart (the payload encoding by default)."""
    return _packb(obj, use_bin_type=True)


def unpack(data: bytes) -> Any:
    """The inverse of ``pack``; an empty payload means None."""
    if not data:
        return None
    return _unpackb(data, raw=False, strict_map_key=False)


@dataclass(frozen=True, slots=True)
class Reply:
    """What a handler returns to choose the status, or to send bytes as they are.

    ``payload`` is packed with msgpack unless ``raw`` is true (then it must be
    bytes) or the handler was registered with ``raw=True``.
    """

    payload: Any = None
    status: int = Status.OK
    raw: bool = False


class Request:
    """What a handler registered with ``request=True`` gets as its second argument."""

    __slots__ = ("request_id", "service", "version", "category", "action", "payload",
                 "channel")

    def __init__(self, req: ReqFields, channel: str) -> None:
        self.request_id: bytes = req[0]
        self.service: str = req[1]
        self.version: str = req[2]               #: as asked by the channel
        self.category: str = req[3]
        self.action: str = req[4]
        self.payload: bytes = req[5]             #: the payload as it came
        self.channel: str = channel              #: the channel's endpoint

    def unpack(self) -> Any:
        """The payload decoded from msgpack."""
        return unpack(self.payload)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r} {self.service} {self.version} "
                f"{self.category}/{self.action} from {self.channel})")


class Handler:
    """One registered action: the callable and how to call it."""

    __slots__ = ("fn", "raw", "inline", "with_request", "category", "action")

    def __init__(self, fn: Callable[..., Any], category: str, action: str, raw: bool,
                 inline: bool, with_request: bool) -> None:
        self.fn = fn
        self.category = category
        self.action = action
        self.raw = raw                    #: payload and reply are bytes, not msgpack
        self.inline = inline              #: run in the server's reader greenlet (never blocks)
        self.with_request = with_request  #: called as fn(payload, request)

    def __repr__(self) -> str:
        return f"<Handler {self.category}/{self.action} -> {self.fn!r}>"


def _checked_text(kind: str, value: str, empty_ok: bool = False) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{kind} must be a str, not {type(value).__name__}")
    size = len(value.encode("utf-8"))
    if size > MAX_TEXT:
        raise ValueError(f"{kind} {value[:40]!r} is {size} UTF-8 octets; the limit is {MAX_TEXT}")
    if not size and not empty_ok:
        raise ValueError(f"{kind} must not be empty")
    return value


class Service:
    """A named, versioned set of actions, served by adding it to a ``Server``.

    ::

        calc = Service("calc", "1.2")

        @calc.action("add", category="math")
        def add(numbers):
            return sum(numbers)

    Actions may be added or removed at any time, also while served.
    """

    def __init__(self, name: str, version: str = "1.0") -> None:
        self.name = _checked_text("service name", name)
        self.version = _checked_text("service version", version)
        self._actions: dict[tuple[str, str], Handler] = {}
        #: the same handlers keyed by a REQ's frames 7 and 8 (UTF-8 category and action)
        self.by_frames: dict[tuple[bytes, bytes], Handler] = {}

    def action(self, name: Optional[str] = None, category: str = "", *, raw: bool = False,
               inline: bool = False, request: bool = False
               ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: register the function as action ``name`` (default: its name).

        ``raw``: the handler gets and returns bytes (no msgpack). ``inline``: run
        it in the server's reader greenlet, which is fastest but means it must
        never block (no sleeps, no I/O); by default each request runs in its
        own greenlet. ``request``: call it as ``fn(payload, request)`` with a
        ``Request``.
        """

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add(name or fn.__name__, fn, category, raw=raw, inline=inline,
                     request=request)
            return fn

        return register

    def add(self, action: str, fn: Callable[..., Any], category: str = "", *, raw: bool = False,
            inline: bool = False, request: bool = False) -> None:
        """Register ``fn`` as ``category``/``action`` (replacing any handler there)."""
        if not callable(fn):
            raise TypeError(f"handler for {action!r} is not callable: {fn!r}")
        key = (_checked_text("action category", category, True),
               _checked_text("action name", action))
        handler = Handler(fn, key[0], key[1], raw, inline, request)
        self._actions[key] = handler
        self.by_frames[(key[0].encode("utf-8"), key[1].encode("utf-8"))] = handler

    def remove(self, action: str, category: str = "") -> None:
        """Unregister an action; KeyError if there is none."""
        del self._actions[(category, action)]
        del self.by_frames[(category.encode("utf-8"), action.encode("utf-8"))]

    def handler(self, category: str, action: str) -> Optional[Handler]:
        """The handler of ``category``/``action``, or None."""
        return self._actions.get((category, action))

    def actions(self) -> list[tuple[str, str]]:
        """The (category, action) pairs, sorted."""
        return sorted(self._actions)

    def __repr__(self) -> str:
        return f"<Service {self.name} {self.version} ({len(self._actions)} actions)>"


Catalog = Mapping[str, Mapping[str, Service]]  # name -> version -> Service


def resolve_service(catalog: Catalog, service: str, version: str) -> Union[Service, Outcome]:
    """The ``Service`` serving ``service`` at ``version`` (see ``versions``), or why none does.

    404 no such service, 406 no compatible version.
    """
    versions = catalog.get(service)
    if not versions:
        return Status.UNKNOWN_SERVICE, f"unknown service {service!r}".encode()
    chosen = choose_version(versions, version)
    if chosen is None:
        offered = ", ".join(sorted(versions, key=version_key))
        return Status.UNKNOWN_VERSION, (f"service {service!r} has no version compatible "
                                        f"with {version!r} (offers {offered})").encode()
    return versions[chosen]


def unknown_action(service: Service, category: str, action: str) -> Outcome:
    """The 405 outcome for an action ``service`` does not have."""
    where = f"{category}/{action}" if category else action
    elsewhere = sorted(repr(c) for c, a in service.actions() if a == action and c != category)
    hint = f"; it has {action!r} in category {', '.join(elsewhere)}" if elsewhere else ""
    return Status.UNKNOWN_ACTION, (f"service {service.name!r} {service.version} has no action "
                                   f"{where!r}{hint}").encode()


def resolve(catalog: Catalog, service: str, version: str, category: str,
            action: str) -> Union[Handler, Outcome]:
    """The handler for a request, or the (status, message) that says why there is none.

    404 no such service, 406 no compatible version (see ``versions``), 405 no
    such category/action in the chosen version.
    """
    found = resolve_service(catalog, service, version)
    if type(found) is tuple:
        return found
    assert isinstance(found, Service)
    handler = found.handler(category, action)
    if handler is None:
        return unknown_action(found, category, action)
    return handler


def _describe(exc: BaseException) -> bytes:
    text = str(exc)
    return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__).encode(
        "utf-8", "backslashreplace")


def is_deferred(value: Any) -> bool:
    """True for a Greenlet, AsyncResult or the like: the reply comes when it is ready."""
    return hasattr(value, "rawlink") and hasattr(value, "get") and not isinstance(value, Reply)


def execute(handler: Handler, req: ReqFields, channel: str) -> Union[Outcome, Any]:
    """Run the handler on ``req`` (the fields of a REQ: request id, service, version,
    category, action, payload): an outcome (status, payload), or a deferred result
    for ``finish``."""
    return call(handler, req[5], Request(req, channel) if handler.with_request else None)


def call(handler: Handler, payload: bytes, request: Optional[Request] = None
         ) -> Union[Outcome, Any]:
    """Run the handler on a REQ's payload (``request`` for ``with_request`` handlers):
    an outcome (status, payload), or a deferred result for ``finish``."""
    try:
        if handler.raw:
            argument: Any = payload
        elif payload:
            try:
                argument = _unpackb(payload, raw=False, strict_map_key=False)
            except Exception as exc:
                return Status.BAD_REQUEST, b"payload is not msgpack: " + _describe(exc)
        else:
            argument = None
        if request is None:
            result = handler.fn(argument)
        else:
            result = handler.fn(argument, request)
        if handler.raw:
            if type(result) is bytes:   # (what ``outcome`` makes of it, at once)
                return _OK, result
        elif type(result) in _PLAIN:
            try:
                return _OK, _packb(result, use_bin_type=True)
            except Exception as exc:
                return Status.INTERNAL_ERROR, (b"reply is not msgpack-serialisable: "
                                               + _describe(exc))
        if is_deferred(result):
            return result
        return outcome(handler, result)
    except ServiceError as exc:
        return _error_outcome(exc)
    except Exception as exc:
        return Status.INTERNAL_ERROR, _describe(exc)


def finish(handler: Handler, deferred: Any) -> Outcome:
    """The outcome of a deferred result that is ready (or that this call waits for)."""
    try:
        return outcome(handler, deferred.get())
    except ServiceError as exc:
        return _error_outcome(exc)
    except Exception as exc:
        return Status.INTERNAL_ERROR, _describe(exc)


def _error_outcome(exc: ServiceError) -> Outcome:
    try:
        status_frame(exc.status)
        status = exc.status
    except ValueError:
        status = Status.INTERNAL_ERROR
    return status, str(exc.message).encode("utf-8", "backslashreplace")


def outcome(handler: Handler, result: Any) -> Outcome:
    """(status, payload bytes) for what a handler returned."""
    status: int = Status.OK
    raw = handler.raw
    if isinstance(result, Reply):
        status_frame(result.status)  # ValueError -> 500 through the callers
        status = result.status
        raw = raw or result.raw
        result = result.payload
    if raw:
        if isinstance(result, str):
            return status, result.encode("utf-8")
        if result is None:
            return status, b""
        if not isinstance(result, (bytes, bytearray, memoryview)):
            return Status.INTERNAL_ERROR, (f"raw handler returned {type(result).__name__}, "
                                           "not bytes").encode()
        return status, bytes(result)
    try:
        return status, pack(result)
    except Exception as exc:
        return Status.INTERNAL_ERROR, b"reply is not msgpack-serialisable: " + _describe(exc)
