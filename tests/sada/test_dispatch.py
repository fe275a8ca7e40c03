"""Version matching and how a REQ becomes a status and a payload, without sockets."""

from __future__ import annotations

import gevent
import pytest

from peermesh.sada import Reply, Service, ServiceError, choose_version, is_compatible
from peermesh.sada.handlers import execute, finish, pack, resolve, unpack
from peermesh.sada.versions import parse_version


@pytest.mark.parametrize("offered, requested, chosen", [
    (["1.0", "1.2", "2.0"], None, "2.0"),            # nothing asked: the highest
    (["1.0", "1.2", "2.0"], "1.2", "1.2"),           # exact wins
    (["1.0", "1.3", "1.10", "2.0"], "1.2", "1.10"),  # same major, highest not lower
    (["1.0", "1.1"], "1.2", None),                   # lower minors never serve
    (["2.0", "2.5"], "1.0", None),                   # another major never serves
    (["1.2.0"], "1.2", "1.2.0"),                     # missing parts count as 0
    (["1"], "1.0", "1"),
    (["1.0"], "1", "1.0"),
    (["beta", "1.0"], "beta", "beta"),               # non-numeric: exact only
    (["beta"], "1.0", None),
    (["v1.2"], "v1.1", None),
    (["beta", "1.0"], None, "1.0"),                  # numbers sort above names
    (["alpha", "beta"], None, "beta"),
    ([], None, None),
])
def test_version_rule(offered: list[str], requested: str | None, chosen: str | None) -> None:
    assert choose_version(offered, requested) == chosen


def test_version_parsing() -> None:
    assert parse_version("1.2.3") == (1, 2, 3)
    assert parse_version("10") == (10,)
    for bad in ("", "1.", ".1", "1..2", "v1", "1.x", "\u0661.0"):
        assert parse_version(bad) is None
    assert is_compatible("1.4", "1.2") and not is_compatible("1.1", "1.2")


def calc() -> Service:
    service = Service("calc", "1.2")

    @service.action("add", category="math")
    def add(numbers: list[int]) -> int:
        return sum(numbers)

    @service.action(category="math")
    def divide(pair: list[int]) -> float:
        return pair[0] / pair[1]

    @service.action("teapot")
    def teapot(_: object) -> None:
        raise ServiceError(418, "I'm a teapot")

    @service.action("created")
    def created(value: object) -> Reply:
        return Reply({"id": value}, status=201)

    @service.action("reverse", raw=True)
    def reverse(data: bytes) -> bytes:
        return data[::-1]

    @service.action("whoami", request=True)
    def whoami(_: object, request: object) -> dict:
        return {"id": request.request_id, "channel": request.channel,  # type: ignore[attr-defined]
                "version": request.version}  # type: ignore[attr-defined]

    @service.action("later")
    def later(value: int) -> gevent.Greenlet:
        return gevent.spawn(lambda: value * 2)

    @service.action("object")
    def unpackable(_: object) -> object:
        return object()

    return service


CATALOG = {"calc": {"1.2": calc(), "2.0": Service("calc", "2.0")}}


def run(service: str, version: str, category: str, action: str, payload: bytes) -> tuple:
    handler = resolve(CATALOG, service, version, category, action)
    if isinstance(handler, tuple):
        return handler
    result = execute(handler, (b"rid-1", service, version, category, action, payload),
                     "tcp://127.0.0.1:5055")
    if not isinstance(result, tuple):
        result = finish(handler, result)
    return result


@pytest.mark.parametrize("request_, status, reply", [
    (("calc", "1.2", "math", "add", pack([1, 2, 3])), 200, 6),
    (("calc", "1.0", "math", "add", pack([1, 2])), 200, 3),        # compatible: served by 1.2
    (("calc", "1", "math", "add", pack([4])), 200, 4),
    (("calc", "1.2", "math", "divide", pack([1, 0])), 500, "ZeroDivisionError: division by zero"),
    (("calc", "1.2", "", "teapot", pack(None)), 418, "I'm a teapot"),
    (("calc", "1.2", "", "created", pack(7)), 201, {"id": 7}),
    (("calc", "1.2", "", "later", pack(21)), 200, 42),
    (("calc", "1.2", "", "object", pack(None)), 500, None),
    (("calc", "1.2", "math", "add", b"\xc1"), 400, None),          # not msgpack
    (("calc", "1.2", "math", "add", b""), 500, None),              # None + sum -> TypeError
    (("nope", "1.0", "", "add", b""), 404, "unknown service 'nope'"),
    (("calc", "3.0", "math", "add", b""), 406,
     "service 'calc' has no version compatible with '3.0' (offers 1.2, 2.0)"),
    (("calc", "1.2", "", "add", b""), 405,
     "service 'calc' 1.2 has no action 'add'; it has 'add' in category 'math'"),
    (("calc", "1.2", "math", "sub", b""), 405, "service 'calc' 1.2 has no action 'math/sub'"),
    (("calc", "2", "math", "add", b""), 405, "service 'calc' 2.0 has no action 'math/add'"),
])
def test_dispatch_statuses(request_: tuple, status: int, reply: object) -> None:
    got_status, payload = run(*request_)
    assert got_status == status, payload
    if reply is None:
        return
    if status < 400:
        assert unpack(payload) == reply
    else:
        assert payload.decode() == reply


def test_raw_and_request_handlers() -> None:
    assert run("calc", "1.2", "", "reverse", b"\x00\x01abc") == (200, b"cba\x01\x00")
    status, payload = run("calc", "1.0", "", "whoami", pack(None))
    assert status == 200
    assert unpack(payload) == {"id": b"rid-1", "channel": "tcp://127.0.0.1:5055",
                               "version": "1.0"}


def test_service_registration_rules() -> None:
    service = Service("s", "1.0")
    with pytest.raises(ValueError):
        Service("", "1.0")
    with pytest.raises(ValueError):
        Service("s", "")
    with pytest.raises(ValueError):
        service.add("", lambda p: p)
    with pytest.raises(ValueError):
        service.add("a" * 256, lambda p: p)
    with pytest.raises(TypeError):
        service.add("a", "not callable")  # type: ignore[arg-type]
    service.add("a", lambda p: p, category="c")
    assert service.actions() == [("c", "a")]
    service.remove("a", "c")
    assert service.actions() == []
