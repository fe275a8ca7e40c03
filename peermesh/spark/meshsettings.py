"""``MeshSettings``: how a node in a Spark worker process joins the same mesh as the driver."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional

__all__ = ["MeshSettings"]


@dataclass(frozen=True)
class MeshSettings:
    """How a node in a Spark worker process joins the same mesh as the driver.

    Picklable; the data source and ``ServiceCaller`` carry one to executors.
    Fields are ``NodeConfig`` settings (None: the worker's own default,
    ``PEERMESH_*`` or built-in).
    """

    interface: Optional[str] = None
    port: Optional[int] = None
    interval: Optional[float] = None
    evasive: Optional[float] = None
    silent: Optional[float] = None
    expired: Optional[float] = None
    discovery: Optional[tuple[str, ...]] = None
    seeds: Optional[tuple[str, ...]] = None
    #: the secret certificate and allowed-keys directory of the worker's host (options
    #: ``keyFile``, ``allowedKeys``), for a mesh with keys; never taken from the driver
    key_file: Optional[str] = None
    allowed_keys: Optional[str] = None

    def node_settings(self) -> dict[str, Any]:
        """Keyword settings for ``ThreadedNode`` (only those that are set)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def to_options(self) -> dict[str, str]:
        """As data source options (strings; tuples comma-separated)."""
        result = {}
        for key, value in asdict(self).items():
            if value is None:
                continue
            name = _OPTION_NAMES.get(key, key)
            result[name] = ",".join(value) if isinstance(value, tuple) else str(value)
        return result

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "MeshSettings":
        """From data source options (lower-cased keys, string values)."""
        values: dict[str, Any] = {}
        for key in ("interface",):
            if options.get(key):
                values[key] = options[key]
        for key, name in _OPTION_NAMES.items():
            if options.get(name.lower()):
                values[key] = options[name.lower()]
        if options.get("port"):
            values["port"] = int(options["port"])
        for key in ("interval", "evasive", "silent", "expired"):
            if options.get(key):
                values[key] = float(options[key])
        for key in ("discovery", "seeds"):
            if options.get(key) is not None and key in options:
                values[key] = tuple(v.strip() for v in options[key].split(",") if v.strip())
        return cls(**values)

    @classmethod
    def from_config(cls, config: Any, interface: Any = None) -> "MeshSettings":
        """The settings of a running node's ``NodeConfig``.

        ``interface`` (the node's ``Interface``) is passed on as its network in
        CIDR form, so that a worker picks its own interface on the same network
        whatever that interface is named on its host.
        """
        where = str(interface.network) if interface is not None else config.interface
        return cls(interface=where, port=config.port, interval=config.interval,
                   evasive=config.evasive, silent=config.silent, expired=config.expired,
                   discovery=tuple(config.discovery), seeds=tuple(config.seeds))


#: MeshSettings fields whose data source option is spelled otherwise
_OPTION_NAMES = {"key_file": "keyFile", "allowed_keys": "allowedKeys"}
