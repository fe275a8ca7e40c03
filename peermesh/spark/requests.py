"""What Spark's workers need to ask the driver: how to reach its MTL gateway
(``GatewaySettings``, from the plan's options) and what became of one request
(``Outcome``), on the mesh and through the gateway alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

__all__ = ["GatewaySettings", "Outcome", "outcome_of"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one request: ``value`` (the reply) or ``status`` + ``error``."""

    ok: bool
    value: Any = None
    status: Optional[int] = None    #: REP status (200 on success); None if no REP came
    error: Optional[str] = None     #: "404 no such service" / "RequestTimeout: ..."


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """How a worker reaches the driver's MTL gateway (picklable; from the options)."""

    endpoint: str                       #: its control endpoint, ``tcp://HOST:PORT``
    user: str
    password: str = field(repr=False)
    server_key: Optional[str] = None    #: Z85 public key, on a mesh with keys

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Optional["GatewaySettings"]:
        """From data source options (lower-cased); None without option ``gateway``."""
        endpoint = options.get("gateway")
        if not endpoint:
            return None
        user, password = options.get("gatewayuser"), options.get("gatewaypassword")
        if not user or not password:
            raise ValueError("option gateway needs options gatewayUser and gatewayPassword "
                             "(start_service(..., gateway=...) sets all three)")
        return cls(endpoint, user, password, options.get("serverkey") or None)


def outcome_of(exc: BaseException) -> Outcome:
    """The ``Outcome`` of a request that raised ``exc`` (a status if it carries one)."""
    status = getattr(exc, "status", None)
    if status is not None:
        message = getattr(exc, "message", str(exc))
        return Outcome(False, None, int(status), f"{int(status)} {message}")
    return Outcome(False, None, None, f"{type(exc).__name__}: {exc}")
