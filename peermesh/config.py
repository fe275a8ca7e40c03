"""Node configuration: one object with documented defaults.

Values come, lowest precedence first, from the defaults below, a TOML file
(``[node]`` table, same keys), ``PEERMESH_*`` environment variables (the key
in upper case: ``PEERMESH_INTERFACE``, ``PEERMESH_PORT``, ``PEERMESH_EVASIVE``
...; ``PEERMESH_GROUPS``, ``PEERMESH_DISCOVERY`` (``none``: seeds only) and
``PEERMESH_SEEDS`` are comma-separated, ``PEERMESH_HEADERS`` is ``K=V,K=V``)
and keyword arguments or CLI flags.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Optional

if TYPE_CHECKING:  # pathlib only for the stores' data directory: a plain node does without
    from pathlib import Path

__all__ = ["NodeConfig", "read_tables", "read_table", "TABLES", "default_data_dir", "is_loopback",
           "parse_listen", "parse_host_port", "DEFAULT_METRICS_HOST"]

#: where ``--metrics PORT`` listens
DEFAULT_METRICS_HOST = "127.0.0.1"

#: the tables a config file may have: ``[node]`` (NodeConfig), ``[nfp]`` (the NFP
#: commands) and ``[mtl]`` (``peermesh mtl gateway``); anything else, and any key outside a
#: table, is an error
TABLES = ("node", "nfp", "mtl")


def read_tables(path: os.PathLike[str] | str) -> dict[str, dict[str, Any]]:
    """The tables of TOML file ``path``; ValueError naming what is wrong with it.

    Unknown tables (a typo such as ``[nodes]``) and keys outside any table
    are errors rather than ignored, so a mistake never leaves a setting
    (e.g. the interface) at its default unnoticed.
    """
    import tomllib  # only files need it; keeps `import peermesh` quick

    try:
        with open(path, encoding="utf-8") as f:
            data = tomllib.loads(f.read())
    except OSError as exc:
        raise ValueError(f"cannot read config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"config file {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path} is not valid TOML: {exc}") from None
    loose = sorted(k for k, v in data.items() if not isinstance(v, dict) and k not in TABLES)
    if loose:
        raise ValueError(f"config file {path}: key(s) outside any table: {', '.join(loose)} "
                         "(node settings go under [node])")
    unknown = sorted(set(data) - set(TABLES))
    if unknown:
        raise ValueError(f"config file {path}: unknown table(s) "
                         f"{', '.join(f'[{t}]' for t in unknown)}; known: "
                         f"{', '.join(f'[{t}]' for t in TABLES)}")
    for name, table in data.items():
        if not isinstance(table, dict):
            raise ValueError(f"config file {path}: [{name}] must be a table")
    return data


def read_table(path: Optional[os.PathLike[str] | str], name: str,
               keys: Mapping[str, tuple[Any, ...]]) -> dict[str, Any]:
    """The checked ``[name]`` table of TOML file ``path`` ({} if none); ValueError if wrong.

    ``keys`` maps each allowed key to ``(what, check, ...)``: a value for which
    ``check(value)`` is false is refused with "must be ``what``".
    """
    if path is None:
        return {}
    table = read_tables(path).get(name, {})
    unknown = set(table) - set(keys)
    if unknown:
        raise ValueError(f"config file {path}: [{name}] has unknown key(s) "
                         f"{', '.join(sorted(unknown))}")
    for key, value in table.items():
        what, check = keys[key][:2]
        if not check(value):
            raise ValueError(f"config file {path}: [{name}] {key} must be {what}, not {value!r}")
    return dict(table)


#: integer settings that must be at least 1 (those in _FITTED may also be None: fitted
#: to what the node can hold when it is made, see ``Node``)
_COUNTS = ("sndhwm", "send_queue", "send_buffer", "event_queue", "event_queue_bytes",
           "max_message", "max_peers", "max_peers_per_address", "max_pending", "max_unproven",
           "max_hello",
           "max_groups", "max_connections")
_FITTED = ("max_peers", "max_connections")
#: ``max_peers`` where nothing bounds it (the simulated network has no descriptors)
UNBOUNDED_PEERS = 1 << 20


@dataclass(frozen=True)
class NodeConfig:
    """Settings of one node. Times are in seconds."""

    #: public name; defaults to the first 6 hex digits of the UUID, as Zyre does
    name: Optional[str] = None
    #: groups joined at start
    groups: tuple[str, ...] = ()
    #: groups this node stands for leader of (Zyre's election; see ``Node.contest``)
    contest: tuple[str, ...] = ()
    #: headers sent in HELLO (fixed once the node has started)
    headers: Mapping[str, str] = field(default_factory=dict)
    #: interface name, IPv4 address or CIDR; None: $PEERMESH_INTERFACE, then the default
    interface: Optional[str] = None
    #: UDP beacon port (ZRE-DISC)
    port: int = 5670
    #: discovery sources: "beacon" (UDP broadcast, the ZRE default) and/or "mdns"
    discovery: tuple[str, ...] = ("beacon",)
    #: seed nodes ``host[:port]`` (port: their beacon port) reached by unicast beacons,
    #: for networks without broadcast; peers found through them share what they know
    seeds: tuple[str, ...] = ()
    #: seconds between beacons
    interval: float = 1.0
    #: silence after which a peer is PINGed and reported EVASIVE
    evasive: float = 5.0
    #: silence after which a peer is reported SILENT
    silent: float = 10.0
    #: silence after which a peer is removed (EXIT)
    expired: float = 30.0
    #: ZeroMQ send high-water mark of each peer's DEALER (messages)
    sndhwm: int = 10_000
    #: messages held per peer once its DEALER is full, before senders wait
    send_queue: int = 1_000_000
    #: octets held per peer once its DEALER is full, before senders wait (each message
    #: counts its frames plus 128 for bookkeeping): 100,000 100-byte whispers fit
    send_buffer: int = 64 * 1024 * 1024
    #: how long a send waits for room before the peer counts as not responding
    send_timeout: float = 5.0
    #: events held for the application before the node stops reading its mailbox
    event_queue: int = 100_000
    #: octets of WHISPER/SHOUT content held for the application, at most: a message that
    #: does not fit waits and the node stops reading its mailbox until it does (content
    #: larger than the whole bound is dropped, counted as ``events_dropped``)
    event_queue_bytes: int = 64 * 1024 * 1024
    #: peers in the table (said HELLO or found by discovery); over it, a new peer is
    #: refused (``peers_refused``; the node says so once), unless it said HELLO and a
    #: peer still waiting for HELLO (``pending_shed``) or an EVASIVE one
    #: (``evasive_shed``) can be shed. None: as many as the node can hold, on real
    #: sockets (descriptor limit, raised to the hard limit at start, less 64) / 3
    #: (nodes of one process share the descriptors); on the simulated network, which
    #: has no descriptors, no cap
    max_peers: Optional[int] = None
    #: peers at one address other than the node's own (the address a beacon came from, a
    #: HELLO names, or a mailbox connection comes from): over it, a new peer from there is
    #: refused, unless it said HELLO and a peer of that address still waiting for HELLO can
    #: be shed (``address_refused``); peers on the node's own host are not counted
    max_peers_per_address: int = 128
    #: peers found by discovery (beacon, mDNS, PEX) that have not said HELLO yet; over
    #: it, a new one replaces the oldest if that has waited ``interval`` (``pending_shed``),
    #: else it is ignored (``pending_refused``) until its next beacon. A LAN of up to
    #: this many hosts that boot at once meets in one beacon round
    max_pending: int = 1024
    #: peers that said HELLO before discovery reported them and have not proven since
    #: that a node lives at their endpoint (a PING-OK, or a report there): over it, a new
    #: one sheds the oldest if a PING to it went unanswered for ``hello_timeout``
    #: (``unproven_shed``), else its HELLO waits (at most ``max_pending`` of them) and it
    #: enters when a report comes from its endpoint, or is refused after
    #: ``hello_timeout`` (``unproven_refused``); and the mailbox connections that are no
    #: peer's (no HELLO yet, or refused): over it, the oldest quiet ones are closed
    #: (``connections_shed``)
    max_unproven: int = 256
    #: seconds a peer found by discovery, or a connection to the mailbox, has to say
    #: HELLO (or finish the ZeroMQ handshake) before it is dropped
    hello_timeout: float = 5.0
    #: largest HELLO accepted (octets; bounds its headers too); a bigger one is refused
    #: and its sender dropped (``hellos_refused``)
    max_hello: int = 64 * 1024
    #: groups one peer may be in; a HELLO listing more is refused, a JOIN past it
    #: removes the peer (``groups_refused``)
    max_groups: int = 1024
    #: connections to the mailbox, each peer's one among them (None: max_peers +
    #: max_pending; at most half the descriptors beyond 64 go to them); over it, the
    #: oldest that sent under 1 KiB, then those that sent the fewest octets, are closed
    #: (``connections_shed``)
    max_connections: Optional[int] = None
    #: largest mailbox message accepted (bytes, all frames); bigger ones are dropped
    #: and the sender disconnected
    max_message: int = 64 * 1024 * 1024
    #: secret CURVE certificate (``peermesh keygen`` writes it as ``PATH_secret``): with
    #: it every socket is encrypted and authenticated, and the node meets only nodes with
    #: keys (version-3 beacons, as Zyre's ``zyre_set_zcert``); None: plain ZRE
    key_file: Optional[str] = None
    #: directory of the public certificates of the nodes admitted (re-read when it
    #: changes); None: any node with a key. Only with ``key_file``
    allowed_keys: Optional[str] = None
    #: ZAP domain of the allowed keys (local to the process, never sent); None: one of the
    #: allowlist's own, so nodes of one process with other allowed keys never clash
    zap_domain: Optional[str] = None
    #: seconds between the PINGs that time each ready peer's round trip (``peers``, the
    #: metrics); 0: only the PINGs ZRE sends anyway (silent peers, ``flush``)
    rtt_probe: float = 10.0
    #: ``HOST:PORT`` (or ``PORT``: on 127.0.0.1) where a serving command exports Prometheus
    #: metrics over HTTP; None: no metrics. A host other than loopback needs
    #: ``metrics_public``
    metrics: Optional[str] = None
    #: allow ``metrics`` on an address other than loopback (the metrics name the peers)
    metrics_public: bool = False

    def __post_init__(self) -> None:
        self._check_types()
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be 1..65535, not {self.port}")
        for key in ("interval", "evasive", "silent", "expired", "send_timeout",
                    "hello_timeout"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be positive")
        if self.metrics is not None:
            parse_listen(self.metrics, self.metrics_public)
        if self.rtt_probe < 0:
            raise ValueError("rtt_probe must be 0 (off) or positive")
        if not self.evasive <= self.silent <= self.expired:
            raise ValueError("timeouts must satisfy evasive <= silent <= expired")
        for key in _COUNTS:
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ValueError(f"{key} must be at least 1")

    def _check_types(self) -> None:
        def bad(key: str, what: str) -> ValueError:
            return ValueError(f"{key} must be {what}, not {getattr(self, key)!r}")

        for key in ("name", "interface", "key_file", "allowed_keys", "zap_domain", "metrics"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise bad(key, "a non-empty string")
        for key in ("groups", "contest", "discovery", "seeds"):
            value = getattr(self, key)
            if isinstance(value, str) or not all(isinstance(g, str) and g for g in value):
                raise bad(key, "a list of non-empty strings")
        if self.zap_domain is not None and len(self.zap_domain.encode()) > 255:
            raise bad("zap_domain", "at most 255 UTF-8 octets")
        if self.allowed_keys is not None and self.key_file is None:
            raise ValueError("allowed_keys needs key_file: only a node with a keypair "
                             "checks the keys of its peers")
        unknown = set(self.discovery) - {"beacon", "mdns"}
        if unknown:
            raise ValueError(f"discovery: unknown source(s) {', '.join(sorted(unknown))}; "
                             "choose from beacon, mdns")
        if not isinstance(self.headers, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.headers.items()):
            raise bad("headers", "a table of strings")
        for key in ("port", *_COUNTS):
            value = getattr(self, key)
            if value is None and key in _FITTED:
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise bad(key, "an integer")
        for key in ("interval", "evasive", "silent", "expired", "send_timeout",
                    "hello_timeout", "rtt_probe"):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise bad(key, "a number")
        if not isinstance(self.metrics_public, bool):
            raise bad("metrics_public", "true or false")

    def replace(self, **changes: Any) -> "NodeConfig":
        """A copy with ``changes`` applied (None values are ignored)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        for key in ("groups", "contest", "discovery", "seeds"):
            if isinstance(changes.get(key), list):
                changes[key] = tuple(changes[key])
        return dataclasses.replace(self, **changes)

    def fitted(self, capacity: int) -> "NodeConfig":
        """A copy with ``max_peers`` (None: ``capacity``, the peers the node's transport
        can hold) and ``max_connections`` (None: ``max_peers + max_pending``) set."""
        peers = self.max_peers if self.max_peers is not None else capacity
        connections = self.max_connections if self.max_connections is not None \
            else peers + self.max_pending
        return self.replace(max_peers=peers, max_connections=connections)

    @classmethod
    def load(cls, path: Optional[os.PathLike[str] | str] = None,
             environ: Optional[Mapping[str, str]] = None, **overrides: Any) -> "NodeConfig":
        """Defaults, then the TOML file ``path``, then the environment, then ``overrides``."""
        config = cls()
        if path is not None:
            config = config.replace(**cls._from_toml(os.fspath(path)))
        config = config.replace(**cls._from_env(os.environ if environ is None else environ))
        return config.replace(**overrides)

    @classmethod
    def _from_toml(cls, path: str) -> dict[str, Any]:
        table = read_tables(path).get("node", {})
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(table) - set(fields)
        if unknown:
            raise ValueError(f"config file {path}: unknown key(s) {', '.join(sorted(unknown))}")
        return table

    @classmethod
    def _from_env(cls, environ: Mapping[str, str]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(f"PEERMESH_{f.name.upper()}")
            if not raw:
                continue
            try:
                result[f.name] = _parse(f.name, raw, cls.__dataclass_fields__[f.name].type)
            except ValueError as exc:
                raise ValueError(f"PEERMESH_{f.name.upper()}={raw!r} is not valid: {exc}") from None
        return result


def parse_discovery(text: str) -> tuple[str, ...]:
    """``"beacon,mdns"`` as ``("beacon", "mdns")``; ``"none"``: no source (seeds only)."""
    sources = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    if sources == ("none",):
        return ()
    unknown = set(sources) - {"beacon", "mdns"}
    if unknown or not sources:
        raise ValueError(f"unknown discovery source(s) {', '.join(sorted(unknown)) or repr(text)}"
                         "; choose from beacon, mdns (comma-separated), or none")
    return sources


def _parse(name: str, raw: str, kind: Any) -> Any:
    if name == "discovery":
        return parse_discovery(raw)
    if name in ("groups", "contest", "seeds"):
        return tuple(g.strip() for g in raw.split(",") if g.strip())
    if name == "headers":
        return dict(parse_header(item) for item in raw.split(",") if item)
    if kind in ("bool", bool):
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError("not one of 1, true, yes, on, 0, false, no, off")
    if kind in ("int", int, "Optional[int]"):
        return int(raw)
    if kind in ("float", float):
        return float(raw)
    return raw


def parse_header(item: str) -> tuple[str, str]:
    """``"K=V"`` as ``("K", "V")``; ValueError without ``=``."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ValueError(f"header {item!r} is not KEY=VALUE")
    return key, value


def parse_host_port(text: str, what: str = "address") -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT`` or ``PORT`` (on 127.0.0.1) as (host, port);
    ValueError naming ``what`` was malformed."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep:
        host, port_text = DEFAULT_METRICS_HOST, text.strip()
    host = host.strip("[]") or DEFAULT_METRICS_HOST
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not HOST:PORT or PORT "
                         "(e.g. 127.0.0.1:8470)") from None
    if not 0 <= port < 65536:
        raise ValueError(f"{what} port must be 0..65535, not {port}")
    return host, port


def parse_listen(text: str, public: bool = False) -> tuple[str, int]:
    """The metrics address (see ``parse_host_port``); ValueError also for a host that
    is not loopback unless ``public``: the metrics name every peer, so they stay on
    this host unless asked for."""
    host, port = parse_host_port(text, "metrics address")
    if not public and not is_loopback(host):
        raise ValueError(f"metrics address {host} is not loopback: the metrics name every "
                         "peer; add --metrics-public (metrics_public = true) to serve them "
                         "beyond this host")
    return host, port


def is_loopback(host: str) -> bool:
    """True for a loopback address or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_data_dir() -> Path:
    """Where stores live by default: ``$PEERMESH_DATA_DIR``, else
    ``$XDG_DATA_HOME/peermesh``, else ``~/.local/share/peermesh``."""
    from pathlib import Path

    env = os.environ.get("PEERMESH_DATA_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "share") / "peermesh"
