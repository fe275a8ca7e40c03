"""The agent's claim on its socket path: a private directory, a lock, no stale file.

The socket's directory is private whatever the umask: a missing one is
created with mode 0700, and an existing one must be a real directory owned by
the user with no group or other permissions, or the agent refuses to use it
(naming its owner and mode). The socket file gets mode 0600. So only the
agent's own user can drive it: other users run their own agent, or run as the
agent's user. Next to the socket, ``agent.sock.lock`` holds an
exclusive ``flock`` and the agent's pid for as long as the agent runs. A
socket file nobody answers on (a dead agent's) is removed; an agent that
answers at the path, or holds its lock, makes ``claim_path`` refuse with
``AgentRunning``. Where the path is: ``peermesh.agent.path``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import stat
from typing import Any, Optional

from ..errors import PeermeshError
from .client import PROBE_TIMEOUT, AgentClient, AgentMismatch, NoAgent

__all__ = ["AgentClaim", "claim_path", "AgentRunning", "AgentPathError"]

log = logging.getLogger(__name__)


class AgentRunning(PeermeshError, RuntimeError):
    """Another agent holds the socket path."""

    def __init__(self, path: str, pid: Optional[int], answering: bool = True) -> None:
        who = f"pid {pid}" if pid else "pid unknown"
        if not answering:
            who += "; it holds the lock but does not answer"
        super().__init__(f"an agent is already running at {path} ({who})")
        self.path = path
        self.pid = pid


class AgentPathError(PeermeshError, RuntimeError):
    """The socket path or its directory cannot be used safely."""


def _prepare_directory(path: str) -> None:
    """Create the socket's directory (0700, whatever the umask) or check that the existing
    one is private: a directory (not a link) of this user with no group or other bits."""
    directory = os.path.dirname(path) or "."
    try:
        os.makedirs(os.path.dirname(directory) or ".", exist_ok=True)
        try:
            os.mkdir(directory, 0o700)
            os.chmod(directory, 0o700)   # mkdir's mode is narrowed by the umask, never widened
        except FileExistsError:
            pass
        st = os.lstat(directory)
    except OSError as exc:
        raise AgentPathError(f"cannot create the agent directory {directory}: "
                             f"{exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "link or file"
        raise AgentPathError(
            f"{directory} is not a private directory of this user (a {kind} of owner uid "
            f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}; the agent needs one owned by "
            f"uid {os.getuid()} with mode 0700); fix it, remove it or choose another path "
            "with --agent or $PEERMESH_AGENT")


def _listening(path: str) -> bool:
    """True when something accepts connections on the Unix socket ``path`` (no ZeroMQ).

    PermissionError when we may not connect: someone may well be listening.
    """
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(PROBE_TIMEOUT)
        probe.connect(path)
        return True
    except PermissionError:
        raise
    except OSError:
        return False
    finally:
        probe.close()


class AgentClaim:
    """The right to serve at ``path``: a held ``flock`` on ``path + ".lock"``."""

    def __init__(self, path: str, lock_fd: int, removed_stale: bool) -> None:
        self.path = path
        self.lock_path = path + ".lock"
        self.removed_stale = removed_stale
        self._fd: Optional[int] = lock_fd
        self._socket_id: Optional[tuple[int, int]] = None

    def bound(self) -> None:
        """Remember which file our bind created, so release removes only that one."""
        try:
            st = os.stat(self.path)
            self._socket_id = (st.st_dev, st.st_ino)
        except OSError:
            self._socket_id = None

    def release(self) -> None:
        """Remove our socket file and the lock file, then drop the lock."""
        if self._fd is None:
            return
        try:
            st = os.lstat(self.path)
            if self._socket_id is not None and (st.st_dev, st.st_ino) == self._socket_id:
                os.unlink(self.path)
        except OSError:
            pass
        try:
            os.unlink(self.lock_path)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None


def claim_path(path: str, probe_timeout: float = PROBE_TIMEOUT) -> AgentClaim:
    """Make ``path`` ours: lock it, refuse if a live agent answers there, remove a stale file.

    Raises ``AgentRunning`` (another agent holds or answers at the path) or
    ``AgentPathError``.
    """
    _prepare_directory(path)
    lock_path = path + ".lock"
    for _ in range(10):
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise AgentPathError(f"cannot open the agent lock file {lock_path}: "
                                 f"{exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            info = _ping_answer(path, probe_timeout)
            if info is not None:
                raise AgentRunning(path, _int(info.get("pid")) or pid) from None
            raise AgentRunning(path, pid, answering=False) from None
        except OSError as exc:
            os.close(fd)
            raise AgentPathError(f"cannot lock {lock_path}: {exc.strerror or exc}") from None
        # The previous holder may have removed the file between our open and our lock.
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock_path))
        except OSError:
            same = False
        if same:
            break
        os.close(fd)
    else:
        raise AgentPathError(f"cannot lock {lock_path}: it keeps being replaced")
    try:
        removed = _clear_stale(path, probe_timeout)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except BaseException:
        os.close(fd)
        raise
    return AgentClaim(path, fd, removed)


def _clear_stale(path: str, probe_timeout: float) -> bool:
    """Remove a socket file nobody answers on; True if one was removed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        raise AgentPathError(f"{path} exists and is not a socket; remove it or choose "
                             "another path with --agent")
    try:
        _listening(path)
    except PermissionError:  # never remove what may be another user's live agent
        raise AgentPathError(f"{path} belongs to someone else (no permission to connect); "
                             "choose another path with --agent") from None
    info = _ping_answer(path, probe_timeout)
    if info is not None:  # an agent that does not use the lock (e.g. its lock file was deleted)
        raise AgentRunning(path, _int(info.get("pid")))
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise AgentPathError(f"cannot remove the stale agent socket {path}: "
                             f"{exc.strerror or exc}") from None
    log.info("removed the stale agent socket %s", path)
    return True


def _read_pid(fd: int) -> Optional[int]:
    try:
        return _int(os.pread(fd, 32, 0).decode("ascii", "replace").strip())
    except OSError:
        return None


def _int(value: Any) -> Optional[int]:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _ping_answer(path: str, timeout: float) -> Optional[dict[str, Any]]:
    """The ping answer of an agent at ``path``, or None when nobody answers in time."""
    try:
        client = AgentClient.connect(path, timeout, op="ping")
    except AgentMismatch as exc:  # an agent of another version: it runs all the same
        return {"pid": exc.pid}
    except NoAgent:
        return None
    try:
        return client.info
    finally:
        client.close()
