"""mDNS / DNS-SD discovery through the ``zeroconf`` package.

What goes on the network
------------------------
Every node registers one DNS-SD service and browses for the same type:

* service type ``_peermesh._tcp.local.`` (``SERVICE_TYPE``);
* instance name ``<name>-<first 8 hex digits of the UUID>``, e.g.
  ``alice-3f2a9c01._peermesh._tcp.local.`` (the node name with ``.``, ``\\``
  and control characters replaced by ``-`` and cut to 54 UTF-8 octets; the
  instance name only has to be unique, peers never read it);
* host name ``pm-<UUID hex>.local.``, SRV port = the mailbox port, one A
  record = the IPv4 address of the node's interface;
* TXT record (``TXT_FIELDS``), every value ASCII except ``name``:

  - ``v`` = ``1``, the version of this record format;
  - ``uuid`` = the node's UUID, 32 hex digits;
  - ``endpoint`` = the mailbox, ``tcp://<IPv4>:<port>``;
  - ``name`` = the node's name (UTF-8, at most 250 octets; informative only:
    the name peers show is the one in HELLO).

A record is used only when it passes ``parse_txt``: the whole TXT at most
``MAX_TXT`` octets, ``v`` is ``1``, ``uuid`` is exactly 32 hex digits,
``endpoint`` is ``tcp://`` + a dotted-quad IPv4 address inside the node's
own interface network (as for broadcast beacons) + ``:`` + a port 1..65535,
and ``name``, if present, is UTF-8 of at most 255 octets. Keys are
case-insensitive and the first occurrence of a key counts (RFC 6763 §6.4).
Anything else, and our own record, is ignored with a debug log.

What the node is told
---------------------
* a service appears or its TXT changes -> ``node.peer_appeared(uuid, endpoint)``;
* a service goes away (goodbye packet, or its records expire) ->
  ``node.peer_left(uuid, address)`` with the address of the endpoint that
  service advertised, unless another live service still claims that UUID:
  the node heeds it only when that is the peer's own address, so a record
  made up for a live peer's UUID elsewhere cannot take the peer away when it
  goes (zeroconf does not tell which host sent a packet). A node found by
  both beacons and mDNS therefore leaves when either source says it left;
  that is deliberate: both only say so when it stops.
* mDNS gives no heartbeat, so liveness stays with ZRE (PING, EVASIVE,
  expiry). When the node removes a peer for any reason other than "left"
  while its service is still advertised, it is offered to the node again
  once, ``config.interval`` later (beacons would rediscover it the same way),
  so a link dropped by, say, a sequence gap heals on an mDNS-only mesh.

Threads
-------
zeroconf runs its own asyncio loop in a thread and calls browser handlers
from another thread; its registration probes for about 1.6 s. None of that
runs on the gevent hub: ``Zeroconf()`` construction, browsing and
registration happen in a daemon thread started by ``start`` (which returns
at once; failures are logged), every report is handed to the node's hub with
``loop.run_callback_threadsafe`` and runs there in a greenlet, and ``stop``
unregisters (goodbye packets) and closes zeroconf in another daemon thread,
waiting at most ``stop_timeout`` seconds for it. Do not use this source in a
program where gevent has monkey-patched ``threading``.

Network
-------
zeroconf is bound to the node's interface only (``interfaces=[address]``,
IPv4): queries and answers go out of that interface alone, and the shared
listening socket is told to accept multicast only for the groups it joined
there (``IP_MULTICAST_ALL`` off, Linux). Browsing uses QM questions so that
answers come by multicast and reach every node on a host, not just the one
socket that the kernel would pick for a unicast answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import logging
import re
import socket
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional
from uuid import UUID

import gevent
import gevent.event

from ..errors import PeermeshError
from ..events import EventType

from . import PeerSink

if TYPE_CHECKING:
    from ..events import Event

__all__ = ["MdnsDiscovery", "SERVICE_TYPE", "TXT_FIELDS", "MAX_TXT", "instance_name",
           "parse_txt", "txt_properties"]

log = logging.getLogger(__name__)

#: DNS-SD service type every peermesh node registers and browses
SERVICE_TYPE = "_peermesh._tcp.local."
#: version of the TXT record format (the ``v`` field)
TXT_VERSION = "1"
#: keys of the TXT record
TXT_FIELDS = ("v", "uuid", "endpoint", "name")
#: largest TXT record (octets, wire form) that is looked at
MAX_TXT = 1024
#: longest ``name`` value we publish (a TXT string is at most 255 octets with its key)
MAX_TXT_NAME = 250

_UUID_RE = re.compile(rb"[0-9a-fA-F]{32}")
_ENDPOINT_RE = re.compile(rb"tcp://([0-9]{1,3}(?:\.[0-9]{1,3}){3}):([0-9]{1,5})")
_INSTANCE_BYTES = 54  # 63-octet DNS label minus "-" and 8 hex digits
_REGISTER_WAIT = 30  # s; probing takes ~1.6 s, longer only when names clash
_RESOLVE_MS = 3000  # how long a service's records may take to arrive once it is announced
_IP_MULTICAST_ALL = getattr(socket, "IP_MULTICAST_ALL", 49)


class TxtError(PeermeshError, ValueError):
    """Why a TXT record is not a usable peermesh record."""


def _cut_utf8(text: str, limit: int) -> str:
    return text.encode("utf-8")[:limit].decode("utf-8", "ignore")


def instance_name(name: str, uuid: UUID) -> str:
    """The DNS-SD instance label for a node: ``<safe name>-<8 hex digits>``."""
    safe = "".join("-" if ch in ".\\" or ord(ch) < 32 or ord(ch) == 127 else ch for ch in name)
    safe = _cut_utf8(safe, _INSTANCE_BYTES) or "peermesh"
    return f"{safe}-{uuid.hex[:8]}"


def txt_properties(uuid: UUID, endpoint: str, name: str) -> dict[str, str]:
    """The TXT record of a node, as key -> value."""
    return {"v": TXT_VERSION, "uuid": uuid.hex, "endpoint": endpoint,
            "name": _cut_utf8(name, MAX_TXT_NAME)}


def _split_txt(text: bytes) -> dict[bytes, Optional[bytes]]:
    """RFC 6763 §6 strings as key -> value (None: key without ``=``); first key wins."""
    result: dict[bytes, Optional[bytes]] = {}
    offset, end = 0, len(text)
    while offset < end:
        length = text[offset]
        item = text[offset + 1:offset + 1 + length]
        if len(item) != length:
            raise TxtError("truncated TXT string")
        offset += 1 + length
        if not item:
            continue
        key, sep, value = item.partition(b"=")
        key = key.lower()
        if key and key not in result:
            result[key] = value if sep else None
    return result


def parse_txt(text: bytes, network: Optional[ipaddress.IPv4Network] = None) -> tuple[UUID, str]:
    """``(uuid, endpoint)`` from a peermesh TXT record in wire form; ``TxtError`` says why not.

    With ``network``, the endpoint's address must lie in it.
    """
    if len(text) > MAX_TXT:
        raise TxtError(f"TXT record of {len(text)} octets (limit {MAX_TXT})")
    fields = _split_txt(text)
    version = fields.get(b"v")
    if version != TXT_VERSION.encode():
        raise TxtError(f"v is {version!r}, not {TXT_VERSION!r}")
    raw_uuid = fields.get(b"uuid")
    if raw_uuid is None or not _UUID_RE.fullmatch(raw_uuid):
        raise TxtError(f"uuid {raw_uuid[:40] if raw_uuid else raw_uuid!r} is not 32 hex digits")
    raw_endpoint = fields.get(b"endpoint")
    found = _ENDPOINT_RE.fullmatch(raw_endpoint) if raw_endpoint is not None else None
    if found is None:
        shown = raw_endpoint[:60] if raw_endpoint else raw_endpoint
        raise TxtError(f"endpoint {shown!r} is not tcp://IPv4:port")
    try:
        address = ipaddress.IPv4Address(found.group(1).decode("ascii"))
    except ValueError:
        raise TxtError(f"endpoint {raw_endpoint!r}: bad IPv4 address") from None
    port = int(found.group(2))
    if not 0 < port < 65536:
        raise TxtError(f"endpoint {raw_endpoint!r}: port must be 1..65535")
    if address.is_unspecified or address.is_multicast or address == ipaddress.IPv4Address(
            "255.255.255.255"):
        raise TxtError(f"endpoint {raw_endpoint!r}: not a unicast address")
    if network is not None and address not in network:
        raise TxtError(f"endpoint {raw_endpoint!r} is outside {network}")
    name = fields.get(b"name", b"")
    if name is not None:
        if len(name) > 255:
            raise TxtError("name over 255 octets")
        try:
            name.decode("utf-8")
        except UnicodeDecodeError:
            raise TxtError("name is not UTF-8") from None
    return UUID(hex=raw_uuid.decode("ascii")), f"tcp://{address}:{port}"


class MdnsDiscovery:
    """Announces the node as a DNS-SD service and reports the peers it browses.

    ``service_type`` (default ``SERVICE_TYPE``) lets tests or separate meshes
    on one link keep apart; ``stop_timeout`` bounds how long ``stop`` waits
    for the goodbye packets and zeroconf's shutdown.
    """

    def __init__(self, service_type: str = SERVICE_TYPE, stop_timeout: float = 2.0) -> None:
        self.service_type = service_type
        self.stop_timeout = stop_timeout
        self._node: Optional[PeerSink] = None
        self._hub: Any = None
        self._network: Optional[ipaddress.IPv4Network] = None
        self._info: Any = None
        # shared with zeroconf's threads, guarded by _lock
        self._lock = threading.Lock()
        self._zc: Any = None
        self._browser: Any = None
        self._registering: Optional[concurrent.futures.Future[None]] = None
        self._closing = False  # stop() began: zeroconf threads hand nothing more to the hub
        self._live: set[str] = set()  # services present (browser thread)
        # hub-side state
        self._services: dict[str, tuple[UUID, str]] = {}  # instance -> (uuid, endpoint)
        self._retries: list[gevent.Greenlet] = []
        #: set once probing is over and our record is being announced (for tests and tools)
        self.registered = threading.Event()

    # --- life cycle (on the node's hub) ---------------------------------

    def start(self, node: PeerSink) -> None:
        if self._node is not None:
            raise RuntimeError("an MdnsDiscovery serves one node once")
        interface = node.interface
        assert interface is not None and node.endpoint is not None
        self._node = node
        self._hub = gevent.get_hub()
        self._network = interface.network
        instance = instance_name(node.name, node.uuid)
        record = {"type_": self.service_type, "name": f"{instance}.{self.service_type}",
                  "port": node.mailbox_port,
                  "properties": txt_properties(node.uuid, node.endpoint, node.name),
                  "server": f"pm-{node.uuid.hex}.local.",
                  "addresses": [socket.inet_aton(interface.address)]}
        node.add_listener(self._on_event, messages=False)
        # zeroconf is imported there too: the first import costs the hub ~0.1 s otherwise
        threading.Thread(target=self._open, args=(interface.address, record),
                         name=f"peermesh-mdns-{instance}", daemon=True).start()

    def stop(self) -> None:
        node = self._node
        if node is None or self._closing:
            return
        with self._lock:
            self._closing = True
        try:
            node.remove_listener(self._on_event)
        except ValueError:
            pass
        gevent.killall(self._retries, block=False)
        self._retries = []
        done = gevent.event.Event()
        finished = threading.Event()
        loop = self._hub.loop

        def close() -> None:
            try:
                self._close()
            finally:
                finished.set()
                with self._lock:
                    if self._hub is not None:
                        try:
                            loop.run_callback_threadsafe(done.set)
                        except Exception:  # the hub is gone
                            pass

        threading.Thread(target=close, name="peermesh-mdns-close", daemon=True).start()
        if not done.wait(self.stop_timeout) and not finished.is_set():
            log.warning("mDNS: zeroconf did not shut down within %.1f s; left to finish "
                        "in the background", self.stop_timeout)
        with self._lock:
            self._hub = None  # nothing may reach the hub's loop after this
        self._services.clear()

    # --- zeroconf side (its own threads) --------------------------------

    def _open(self, address: str, record: dict[str, Any]) -> None:
        from zeroconf import DNSQuestionType, IPVersion, ServiceBrowser, ServiceInfo, Zeroconf

        try:
            self._info = ServiceInfo(**record)
        except Exception as exc:
            log.error("mDNS: cannot describe this node as %r: %s", record["name"], exc)
            return
        try:
            # in this thread no asyncio loop runs, so zeroconf starts its own loop thread
            zc = Zeroconf(interfaces=[address], ip_version=IPVersion.V4Only)
        except Exception as exc:
            log.error("mDNS discovery unavailable on %s: %s", address, exc)
            return
        _restrict_listen_socket(zc)
        with self._lock:
            closing = self._closing
            if not closing:
                self._zc = zc
                try:
                    self._browser = ServiceBrowser(zc, self.service_type,
                                                   handlers=[self._on_change],
                                                   question_type=DNSQuestionType.QM)
                except Exception as exc:
                    log.error("mDNS: cannot browse %s: %s", self.service_type, exc)
        if closing:
            zc.close()
            return
        with self._lock:
            if self._closing:
                return  # _close has zc and shuts it down
            loop = zc.loop
            if loop is None:  # zeroconf failed to start its loop thread
                log.error("mDNS: zeroconf's event loop is not running; not registered")
                return
            future = asyncio.run_coroutine_threadsafe(self._register(zc), loop)
            self._registering = future
        try:
            future.result(_REGISTER_WAIT)
        except (asyncio.CancelledError, concurrent.futures.CancelledError):
            pass  # stop() came first
        except concurrent.futures.TimeoutError:
            log.error("mDNS: registering %s took over %d s", self._info.name, _REGISTER_WAIT)
        except Exception as exc:
            if not self._closing:
                log.error("mDNS: cannot register %s: %r", self._info.name, exc)

    async def _register(self, zc: Any) -> None:
        """zeroconf's loop: probe (~1.6 s), then announce; cancelled by stop()."""
        announcing = await zc.async_register_service(self._info, allow_name_change=True)
        log.debug("mDNS: registered %s", self._info.name)
        self.registered.set()
        await announcing

    def _close(self) -> None:
        with self._lock:
            zc, browser, registering = self._zc, self._browser, self._registering
            self._zc = self._browser = self._registering = None
        if zc is None:
            return  # _open sees _closing and closes what it made
        if registering is not None:
            registering.cancel()  # probing or announcing: stop it, goodbyes follow if announced
        try:
            if browser is not None:
                browser.cancel()
        except Exception as exc:
            log.debug("mDNS: browser cancel failed: %r", exc)
        try:
            zc.close()  # goodbye packets for what was registered, then shut down
        except Exception as exc:
            log.debug("mDNS: close failed: %r", exc)

    def _on_change(self, zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
        """Browser thread: a service of our type appeared, changed or went away."""
        from zeroconf import ServiceStateChange

        if state_change is ServiceStateChange.Removed:
            self._live.discard(name)
            self._to_hub(self._removed, name, self._cached(zeroconf, service_type, name))
            return
        self._live.add(name)
        loop = zeroconf.loop
        try:
            asyncio.run_coroutine_threadsafe(self._resolve(zeroconf, service_type, name), loop)
        except RuntimeError:  # loop closed: we are stopping
            pass

    async def _resolve(self, zc: Any, service_type: str, name: str) -> None:
        """zeroconf's loop: read the service's TXT (usually already cached) and check it."""
        from zeroconf.asyncio import AsyncServiceInfo

        info = AsyncServiceInfo(service_type, name)
        try:
            complete = await info.async_request(zc, _RESOLVE_MS)
        except Exception as exc:
            log.debug("mDNS: cannot resolve %s: %r", name, exc)
            return
        if not complete or info.text is None:
            log.debug("mDNS: ignored %s: no TXT and address within %d ms", name, _RESOLVE_MS)
            return
        try:
            uuid, endpoint = parse_txt(info.text, self._network)
        except TxtError as exc:
            log.debug("mDNS: ignored %s: %s", name, exc)
            return
        if name in self._live:
            self._to_hub(self._appeared, name, uuid, endpoint)

    def _cached(self, zc: Any, service_type: str, name: str) -> Optional[tuple[UUID, str]]:
        """The UUID and endpoint in a service's TXT while goodbye records linger (~1 s).

        Lets a removal be reported even when it overtook the service's resolution.
        """
        from zeroconf import ServiceInfo

        try:
            info = ServiceInfo(service_type, name)
            info.load_from_cache(zc)
            return parse_txt(info.text, self._network) if info.text else None
        except Exception:  # TxtError, or anything odd in a hostile record
            return None

    def _to_hub(self, fn: Callable[..., None], *args: Any) -> None:
        with self._lock:
            if self._closing or self._hub is None:
                return
            try:
                self._hub.loop.run_callback_threadsafe(gevent.spawn, fn, *args)
            except Exception as exc:
                log.debug("mDNS: cannot reach the hub: %r", exc)

    # --- reports (greenlets on the node's hub) --------------------------

    def _appeared(self, name: str, uuid: UUID, endpoint: str) -> None:
        node = self._node
        if node is None or self._closing:
            return
        if uuid == node.uuid:
            log.debug("mDNS: ignored %s: our own UUID", name)
            return
        self._services[name] = (uuid, endpoint)
        log.debug("mDNS: %s is %s at %s", name, uuid.hex, endpoint)
        node.peer_appeared(uuid, endpoint)

    def _removed(self, name: str, cached: Optional[tuple[UUID, str]]) -> None:
        node = self._node
        entry = self._services.pop(name, None) or cached
        if node is None or self._closing or entry is None or entry[0] == node.uuid:
            return
        uuid, endpoint = entry
        if any(other[0] == uuid for other in self._services.values()):
            log.debug("mDNS: %s went away; %s is still advertised elsewhere", name, uuid.hex)
            return
        log.debug("mDNS: %s (%s at %s) went away", name, uuid.hex, endpoint)
        node.peer_left(uuid, endpoint[len("tcp://"):].rpartition(":")[0])  # checked: tcp://IP:PORT

    def _advertised(self, uuid: UUID) -> Optional[str]:
        for other, endpoint in self._services.values():
            if other == uuid:
                return endpoint
        return None

    def _on_event(self, event: "Event") -> None:
        """Node listener: offer a peer dropped while still advertised once more."""
        if event.type is not EventType.EXIT or event.reason == "left" or self._closing:
            return
        if event.peer is None or self._advertised(event.peer) is None:
            return
        node = self._node
        assert node is not None
        self._retries = [g for g in self._retries if not g.dead]
        self._retries.append(gevent.spawn_later(node.config.interval, self._retry, event.peer))

    def _retry(self, uuid: UUID) -> None:
        node = self._node
        endpoint = self._advertised(uuid)
        if node is None or self._closing or endpoint is None:
            return
        log.debug("mDNS: offering %s at %s again", uuid.hex, endpoint)
        node.peer_appeared(uuid, endpoint)


def _restrict_listen_socket(zc: Any) -> None:
    """Linux: the wildcard listener only takes multicast for the groups it joined itself."""
    if not sys.platform.startswith("linux"):
        return
    sock = getattr(zc.engine, "_listen_socket", None)
    if sock is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_IP, _IP_MULTICAST_ALL, 0)
    except OSError as exc:
        log.debug("mDNS: cannot clear IP_MULTICAST_ALL: %s", exc)
