"""Simulated LAN hosts on one machine, built from Linux network namespaces.

Layout of one :class:`Lan` (``<tag>`` is ``pmt`` + 6 random hex digits, new
for every ``Lan``, so concurrent runs and other jobs never share a name)::

    namespace <tag>-sw    bridge <tag>br (no IP address), ports <tag>p0, <tag>p1, ...
                              |                 |
    namespace <tag>-h0    eth0 10.88.K.10/24    |
    namespace <tag>-h1                      eth0 10.88.K.11/24      ...

* ``K`` is picked at random in 100..250 per ``Lan``; the broadcast address is
  ``10.88.K.255``.
* Every host namespace has ``lo`` up and a default route ``dev eth0`` so that
  sending to 255.255.255.255 works (without it: ENETUNREACH).
* Nothing is created in the root namespace: the veth pairs are created inside
  the switch namespace with their host end placed straight into the host
  namespace. No traffic can reach the machine's real interfaces.
* :meth:`Host.pull_cable` sets the switch-side veth end down: the host's eth0
  loses carrier, traffic stops, and ``sendto`` still succeeds silently.
* :meth:`Lan.link_root` is the one exception to "nothing in the root
  namespace": it plugs this process's namespace into the switch with a veth
  ``<tag>r`` at ``10.88.K.1/24`` (no other address, no IPv6, no route but
  the LAN's own), so a program there (a Spark driver and master, say) talks
  to the hosts as one more host. It refuses when the root namespace already
  has an address or route in ``10.88.K.0/24``. The veth goes with the switch
  namespace (deleting one end deletes both); ``close`` checks it is gone.

Cleanup (:meth:`Lan.close`, run by the context manager's ``finally``, by the
``lan_factory`` fixture finaliser, and at interpreter exit as a last resort)
first ends every process started with :meth:`Host.popen` (SIGTERM to its
process group, SIGKILL after a grace period), then every other process still
inside one of this Lan's namespaces, and finally deletes exactly the
namespaces this Lan created. Deleting the namespaces removes the veths and
the bridge with them.

Example::

    from netlab import Lan, lan_available

    if lan_available() is None:
        with Lan(3) as lan:
            a, b, c = lan.hosts
            rx = a.popen_python(RECEIVER_CODE, stdout=subprocess.PIPE)
            b.run_python(SENDER_CODE, lan.broadcast, check=True)

Requires root and iproute2 ``ip``; :func:`lan_available` says why not when
they are missing.
"""

from __future__ import annotations

import atexit
import functools
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "Host",
    "Lan",
    "NetlabError",
    "REPO_ROOT",
    "lan_available",
    "subprocess_env",
]

#: The project root (parent of ``tests/``); put on PYTHONPATH of every
#: subprocess so ``import peermesh`` works without installation.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Name of every host's LAN interface.
INTERFACE = "eth0"

#: Seconds a process gets between SIGTERM and SIGKILL during cleanup.
TERM_GRACE = 2.0

_IP_TIMEOUT = 30.0
_NETNS_DIRS = ("/run/netns", "/var/run/netns")
_MAX_HOSTS = 245  # .10 ... .254


class NetlabError(RuntimeError):
    """An ``ip`` command failed while building or tearing down a Lan."""


# --------------------------------------------------------------------------
# helpers


def _find_ip() -> str | None:
    found = shutil.which("ip")
    if found:
        return found
    for candidate in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


IP = _find_ip() or "ip"


def _ip(*args: str, batch: Iterable[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` (feeding ``batch`` lines to ``-batch -``); raise on failure."""
    argv = [IP, *args]
    stdin = None
    if batch is not None:
        argv += ["-batch", "-"]
        stdin = "".join(line + "\n" for line in batch)
    proc = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=_IP_TIMEOUT
    )
    if proc.returncode != 0:
        raise NetlabError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _ip_batches(jobs: Sequence[tuple[str, Sequence[str]]]) -> None:
    """Run ``ip -n NS -batch -`` for every (NS, lines) job concurrently."""
    running = []
    for netns, lines in jobs:
        argv = [IP, "-n", netns, "-batch", "-"]
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )
        running.append((argv, proc, "".join(line + "\n" for line in lines)))
    errors = []
    for argv, proc, stdin in running:
        try:
            _, err = proc.communicate(stdin, timeout=_IP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode != 0:
            errors.append(f"{' '.join(argv)} failed ({proc.returncode}): {err.strip()}")
    if errors:
        raise NetlabError("; ".join(errors))


def _netns_path(name: str) -> str | None:
    for directory in _NETNS_DIRS:
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    return None


def _netns_keys(names: Iterable[str]) -> set[tuple[int, int]]:
    """(st_dev, st_ino) identities of the named namespaces that still exist."""
    keys = set()
    for name in names:
        path = _netns_path(name)
        if path is None:
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue
        keys.add((st.st_dev, st.st_ino))
    return keys


def _pid_in(pid: int, keys: set[tuple[int, int]]) -> bool:
    try:
        st = os.stat(f"/proc/{pid}/ns/net")
    except OSError:  # gone, or a zombie
        return False
    return (st.st_dev, st.st_ino) in keys


def _pids_in(keys: set[tuple[int, int]]) -> list[int]:
    """Live processes whose network namespace is one of ``keys``."""
    if not keys:
        return []
    me = os.getpid()
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            pid = int(entry.name)
            if pid != me and _pid_in(pid, keys):
                found.append(pid)
    return found


def _signal_pids_in(keys: set[tuple[int, int]], sig: int) -> int:
    """Send ``sig`` to every process inside the namespaces ``keys``.

    A pidfd is opened first and the namespace re-checked afterwards, so a pid
    that was recycled in between is never signalled. Returns how many
    processes were found.
    """
    pids = _pids_in(keys)
    for pid in pids:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if _pid_in(pid, keys):
                signal.pidfd_send_signal(pidfd, sig)
        except OSError:
            pass
        finally:
            os.close(pidfd)
    return len(pids)


def subprocess_env(overrides: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """The environment for subprocesses in a host.

    It is this process's environment with the project root prepended to
    ``PYTHONPATH`` and ``PYTHONUNBUFFERED=1`` (unless already set, so that a
    child's "ready" line arrives at once); then ``overrides`` applied, where
    a value of ``None`` removes the variable.
    """
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if REPO_ROOT not in parts:
        parts.insert(0, REPO_ROOT)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.setdefault("PYTHONUNBUFFERED", "1")
    for key, value in (overrides or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _argv(argv: Sequence[str | os.PathLike[str]]) -> list[str]:
    if isinstance(argv, (str, bytes)):
        raise TypeError("argv must be a sequence of arguments, not a string (no shell is used)")
    return [os.fspath(a) for a in argv]


# --------------------------------------------------------------------------
# availability


@functools.lru_cache(maxsize=1)
def lan_available() -> str | None:
    """None if namespaces, veths and bridges can be created here, else why not.

    The answer is a human-readable reason suitable for ``pytest.skip``. The
    check (which creates and deletes one probe namespace) runs once per
    process.
    """
    hint = "needs root and iproute2 `ip` to create network namespaces"
    if not sys.platform.startswith("linux"):
        return f"{hint} (not Linux)"
    if os.geteuid() != 0:
        return f"{hint} (not running as root)"
    if _find_ip() is None:
        return f"{hint} (`ip` not found)"
    probe = f"pmt{secrets.token_hex(3)}-probe"
    try:
        _ip("netns", "add", probe)
    except (NetlabError, OSError, subprocess.SubprocessError) as exc:
        return f"{hint}: {exc}"
    try:
        _ip("-n", probe, batch=[
            "link add name pmtbr type bridge",
            "link add name pmtv0 type veth peer name pmtv1",
            "link set pmtv0 master pmtbr",
        ])
    except (NetlabError, OSError, subprocess.SubprocessError) as exc:
        return f"{hint} (bridge/veth unavailable): {exc}"
    finally:
        try:
            _ip("netns", "del", probe)
        except (NetlabError, OSError, subprocess.SubprocessError):
            pass
    return None


# --------------------------------------------------------------------------
# hosts and the LAN


class Host:
    """One simulated LAN host: a network namespace with ``eth0`` on the switch.

    Attributes: ``name`` (namespace name), ``address`` ("10.88.K.N"),
    ``broadcast`` ("10.88.K.255"), ``prefixlen`` (24), ``interface``
    ("eth0"), ``index`` (0-based position in the Lan), ``port`` (name of the
    switch-side veth end, inside the switch namespace) and ``lan``.
    """

    def __init__(self, lan: Lan, index: int, name: str, address: str, port: str) -> None:
        self.lan = lan
        self.index = index
        self.name = name
        self.address = address
        self.broadcast = lan.broadcast
        self.prefixlen = lan.prefixlen
        self.interface = INTERFACE
        self.port = port
        self._plugged = True

    def __repr__(self) -> str:
        return f"<Host {self.name} {self.address}/{self.prefixlen}>"

    # -- running things inside the namespace

    def command(self, argv: Sequence[str | os.PathLike[str]]) -> list[str]:
        """The argv that runs ``argv`` inside this host (``ip netns exec``)."""
        return [IP, "netns", "exec", self.name, *_argv(argv)]

    def run(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        env: Mapping[str, str | None] | None = None,
        timeout: float | None = 60.0,
        **kw: Any,
    ) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run(argv)`` inside this host and wait for it.

        Unlike plain ``subprocess.run``: ``env`` holds overrides merged into
        :func:`subprocess_env` (the inherited environment plus PYTHONPATH),
        and ``timeout`` defaults to 60 s so a hung child cannot hang the
        test run (pass ``timeout=None`` to wait forever). Other keyword
        arguments go to ``subprocess.run`` unchanged.
        """
        return subprocess.run(
            self.command(argv), env=subprocess_env(env), timeout=timeout, **kw
        )

    def popen(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        env: Mapping[str, str | None] | None = None,
        **kw: Any,
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` inside this host and return the ``Popen``.

        The child runs in its own session and process group (its pid is the
        group id) and is tracked: :meth:`Lan.close` terminates the whole
        group. ``env`` is merged as in :meth:`run`; other keyword arguments
        go to ``subprocess.Popen`` (``start_new_session``/``process_group``
        may not be overridden).
        """
        if "start_new_session" in kw or "process_group" in kw or "preexec_fn" in kw:
            raise TypeError("popen() always starts the child in its own process group")
        self.lan._check_open()
        proc = subprocess.Popen(
            self.command(argv), env=subprocess_env(env), start_new_session=True, **kw
        )
        self.lan._procs.append(proc)
        return proc

    def run_python(self, code: str, *args: str, **kw: Any) -> subprocess.CompletedProcess[Any]:
        """``run([sys.executable, "-c", code, *args], **kw)``."""
        return self.run([sys.executable, "-c", code, *args], **kw)

    def popen_python(self, code: str, *args: str, **kw: Any) -> subprocess.Popen[Any]:
        """``popen([sys.executable, "-c", code, *args], **kw)``."""
        return self.popen([sys.executable, "-c", code, *args], **kw)

    # -- the cable

    @property
    def plugged(self) -> bool:
        """False between :meth:`pull_cable` and :meth:`plug_cable`."""
        return self._plugged

    def pull_cable(self) -> None:
        """Set the switch-side veth end down: eth0 loses carrier, traffic stops.

        Takes effect when this returns. Sockets stay open and ``sendto`` keeps
        succeeding; datagrams are silently dropped.
        """
        _ip("-n", self.lan.switch, "link", "set", self.port, "down")
        self._plugged = False

    def plug_cable(self) -> None:
        """Set the switch-side veth end up again (forwarding resumes at once)."""
        _ip("-n", self.lan.switch, "link", "set", self.port, "up")
        self._plugged = True


_LIVE: set[Lan] = set()


@atexit.register
def _close_leftovers() -> None:  # last resort; normally the context manager did it
    for lan in list(_LIVE):
        try:
            lan.close()
        except Exception:
            pass


class Lan:
    """A switch plus ``hosts`` hosts, each in its own network namespace.

    Use as a context manager (``with Lan(3) as lan:``), or call
    :meth:`start` and make sure :meth:`close` runs. ``subnet`` picks K in
    10.88.K.0/24 (default: random in 100..250).

    Attributes: ``tag`` (unique name prefix), ``hosts`` (list of
    :class:`Host`), ``switch`` (switch namespace name), ``bridge``,
    ``prefix`` ("10.88.K"), ``network`` ("10.88.K.0/24"), ``broadcast``,
    ``prefixlen``, ``namespaces`` (names this Lan created and has not yet
    deleted).
    """

    prefixlen = 24

    def __init__(self, hosts: int = 2, *, subnet: int | None = None) -> None:
        if not 0 <= hosts <= _MAX_HOSTS:
            raise ValueError(f"hosts must be in 0..{_MAX_HOSTS}")
        k = random.randint(100, 250) if subnet is None else subnet
        if not 0 <= k <= 255:
            raise ValueError("subnet must be in 0..255")
        self.prefix = f"10.88.{k}"
        self.network = f"{self.prefix}.0/{self.prefixlen}"
        self.broadcast = f"{self.prefix}.255"
        self.hosts: list[Host] = []
        self._initial_hosts = hosts
        self._namespaces: list[str] = []  # created by us and not yet deleted
        #: the root namespace's veth end (``link_root``), None without one
        self.root_link: str | None = None
        self._procs: list[subprocess.Popen[Any]] = []
        self._started = False
        self._closed = False
        self._set_tag()

    def _set_tag(self) -> None:
        self.tag = "pmt" + secrets.token_hex(3)
        self.switch = f"{self.tag}-sw"
        self.bridge = f"{self.tag}br"

    def __repr__(self) -> str:
        return f"<Lan {self.tag} {self.network} hosts={len(self.hosts)}>"

    def __enter__(self) -> Lan:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def namespaces(self) -> tuple[str, ...]:
        return tuple(self._namespaces)

    def _check_open(self) -> None:
        if self._closed:
            raise NetlabError(f"{self!r} is closed")

    def _create_namespace(self, name: str) -> None:
        _ip("netns", "add", name)  # fails if the name exists: never adopt others' names
        self._namespaces.append(name)

    # -- setup

    def start(self) -> Lan:
        """Build the switch and the initial hosts. On any failure (including
        KeyboardInterrupt) everything created so far is removed again."""
        self._check_open()
        if self._started:
            return self
        self._started = True
        _LIVE.add(self)
        try:
            for attempt in range(5):
                try:
                    self._create_namespace(self.switch)
                    break
                except NetlabError:
                    if attempt == 4 or _netns_path(self.switch) is None:
                        raise
                    self._set_tag()  # astronomically unlikely name clash: new tag
            br = self.bridge
            _ip("-n", self.switch, batch=[
                f"link add name {br} type bridge stp_state 0 mcast_snooping 0",
                f"link set {br} addrgenmode none",  # no IPv6 link-local: no address at all
                f"link set {br} up",
            ])
            self._add_hosts(self._initial_hosts)
        except BaseException:
            self.close()
            raise
        return self

    def add_host(self) -> Host:
        """Connect one more host to the running Lan (e.g. a late joiner)."""
        self._check_open()
        if not self._started:
            raise NetlabError("start the Lan first")
        return self._add_hosts(1)[0]

    def _add_hosts(self, count: int) -> list[Host]:
        first = len(self.hosts)
        if first + count > _MAX_HOSTS:
            raise NetlabError(f"at most {_MAX_HOSTS} hosts per Lan")
        new = []
        for i in range(first, first + count):
            name = f"{self.tag}-h{i}"
            self._create_namespace(name)
            new.append(Host(self, i, name, f"{self.prefix}.{10 + i}", f"{self.tag}p{i}"))
        if not new:
            return new
        switch_lines = []
        for h in new:
            switch_lines += [
                # created in the switch namespace, host end placed straight
                # into the host namespace: nothing ever exists in the root one
                f"link add name {h.port} type veth peer name {INTERFACE} netns {h.name}",
                f"link set {h.port} addrgenmode none",
                f"link set {h.port} master {self.bridge} up",
            ]
        _ip("-n", self.switch, batch=switch_lines)
        _ip_batches([
            (h.name, [
                "link set lo up",
                f"addr add {h.address}/{self.prefixlen} broadcast {h.broadcast} dev {INTERFACE}",
                f"link set {INTERFACE} up",
                f"route add default dev {INTERFACE}",
            ])
            for h in new
        ])
        self.hosts.extend(new)
        return new

    def link_root(self) -> str:
        """Plug this process's (root) namespace into the switch; its address there."""
        self._check_open()
        if not self._started:
            raise NetlabError("start the Lan first")
        if self.root_link is not None:
            return f"{self.prefix}.1"
        used = _ip("-4", "-o", "addr", "show").stdout + _ip("-4", "route", "show").stdout
        if f"{self.prefix}." in used:
            raise NetlabError(f"the root namespace already uses {self.network}")
        name, port = f"{self.tag}r", f"{self.tag}pr"
        _ip("-n", self.switch, batch=[
            f"link add name {port} type veth peer name {name} netns {os.getpid()}",
            f"link set {port} addrgenmode none",
            f"link set {port} master {self.bridge} up",
        ])
        self.root_link = name
        _ip(batch=[
            f"link set {name} addrgenmode none",
            f"addr add {self.prefix}.1/{self.prefixlen} broadcast {self.broadcast} dev {name}",
            f"link set {name} up",
        ])
        return f"{self.prefix}.1"

    # -- teardown

    def close(self) -> None:
        """End all processes in this Lan, then delete its namespaces.

        Idempotent. Only namespaces this Lan created are deleted.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._stop_processes()
        finally:
            try:
                self._delete_namespaces()
                self._delete_root_link()
            finally:
                _LIVE.discard(self)

    def _delete_root_link(self) -> None:
        """The root end of ``link_root`` went with the switch; delete it if it did not."""
        name = self.root_link
        if name is None:
            return
        try:
            _ip("link", "del", "dev", name)
        except NetlabError:
            # gone meanwhile (the kernel removes it with its peer's namespace): fine;
            # anything else is a link left behind
            if subprocess.run([IP, "link", "show", "dev", name], capture_output=True,
                              timeout=_IP_TIMEOUT).returncode == 0:
                raise
        self.root_link = None

    def _stop_processes(self) -> None:
        keys = _netns_keys(self._namespaces)
        tracked = [p for p in self._procs if p.poll() is None]
        # Our popen children are unreaped while poll() is None, so their pid
        # (= process group id) cannot have been recycled.
        for proc in tracked:
            _signal_group(proc.pid, signal.SIGTERM)
        strays = _signal_pids_in(keys, signal.SIGTERM)
        if tracked or strays:
            deadline = time.monotonic() + TERM_GRACE
            while time.monotonic() < deadline:
                tracked = [p for p in tracked if p.poll() is None]
                if not tracked and not _pids_in(keys):
                    break
                time.sleep(0.02)
            for proc in tracked:
                if proc.poll() is None:
                    _signal_group(proc.pid, signal.SIGKILL)
            if _signal_pids_in(keys, signal.SIGKILL):
                deadline = time.monotonic() + 1.0
                while _pids_in(keys) and time.monotonic() < deadline:
                    time.sleep(0.02)
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass

    def _delete_namespaces(self) -> None:
        names = [n for n in reversed(self._namespaces) if _netns_path(n) is not None]
        if names:
            try:
                _ip("-force", batch=[f"netns del {n}" for n in names])
            except NetlabError:
                for name in names:  # fall back to one by one, keep going on errors
                    subprocess.run([IP, "netns", "del", name], capture_output=True,
                                   timeout=_IP_TIMEOUT)
        left = [n for n in self._namespaces if _netns_path(n) is not None]
        self._namespaces = left
        if left:
            raise NetlabError(f"could not delete namespaces {left}")


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
