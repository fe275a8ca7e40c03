"""Tasks and jobs of an NFP worker: the task registry, a job's state, what a task gets.

``Tasks`` maps names to plain functions ``fn(job, *args, **kwargs)``; a
``Job`` is one job as its worker holds it; a task's first argument is a
``JobContext`` (its UUID, arguments, caller key, ``event`` for progress,
``check`` and ``cancelled`` for DELETE, ``run_blocking`` for blocking calls).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol

import gevent

from .store import PENDING, RUNNING

__all__ = ["Tasks", "TaskFunction", "Job", "JobContext", "JobCancelled", "JobOwner", "Interrupt"]

TaskFunction = Callable[..., Any]


class JobOwner(Protocol):
    """The worker a ``JobContext`` reports to."""

    name: str

    def _send_event(self, job: "Job", body: dict[str, Any]) -> None: ...


class JobCancelled(Exception):
    """Raised by ``JobContext.check`` once the job was cancelled (DELETE)."""


class Interrupt(BaseException):
    """Thrown into a running task: it was cancelled (DELETE) or timed out."""


class Tasks:
    """Task functions by name: ``@tasks.task()`` or ``tasks.add(name, fn)``."""

    def __init__(self, functions: Optional[Mapping[str, TaskFunction]] = None) -> None:
        self._functions: dict[str, TaskFunction] = {}
        for name, fn in (functions or {}).items():
            self.add(name, fn)

    def add(self, name: str, fn: TaskFunction) -> None:
        """Register ``fn(job, *args, **kwargs)`` as task ``name``."""
        if not name or not isinstance(name, str):
            raise ValueError("a task needs a non-empty name")
        if not callable(fn):
            raise TypeError(f"task {name!r} is not callable")
        self._functions[name] = fn

    def task(self, name: Optional[str] = None) -> Callable[[TaskFunction], TaskFunction]:
        """Decorator: register the function under ``name`` (default: its own name)."""
        def register(fn: TaskFunction) -> TaskFunction:
            self.add(name or fn.__name__, fn)
            return fn
        return register

    def update(self, other: "Tasks") -> None:
        """Add every task of ``other``."""
        self._functions.update(other._functions)

    def get(self, name: str) -> Optional[TaskFunction]:
        """The task called ``name``, or None."""
        return self._functions.get(name)

    def names(self) -> list[str]:
        """Names of the registered tasks."""
        return sorted(self._functions)

    def __contains__(self, name: object) -> bool:
        return name in self._functions

    @classmethod
    def from_module(cls, path: str) -> "Tasks":
        """Tasks of module ``path``: its ``tasks`` (a ``Tasks`` or a dict of functions)."""
        module = importlib.import_module(path)
        found = getattr(module, "tasks", None)
        if found is None:
            found = getattr(module, "TASKS", None)
        if isinstance(found, Tasks):
            return found
        if isinstance(found, Mapping):
            return cls(found)
        raise ValueError(f"module {path} has no 'tasks' (a peermesh.nfp.Tasks or a dict)")


@dataclass(eq=False, slots=True)
class Job:
    uuid: str
    service: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    timeout: Optional[float]
    notify: bool
    origin: Optional[tuple[Any, ...]]
    state: str = PENDING
    greenlet: Optional[gevent.Greenlet] = None
    waiters: list[Callable[[], None]] = field(default_factory=list)
    cancelled: bool = False
    acknowledged: bool = True    # False while its 202 waits for the commit (see _accept)
    final: Optional[str] = None  # the final body, when it rides on the 202
    recovered: bool = False      # found unfinished on disk at start (see start)
    caller: Optional[str] = None  # the key the request came with (a mesh with keys)
    revoked: bool = False        # its caller's key was removed from the allowlist


class JobContext:
    """What a task function gets as its first argument."""

    __slots__ = ("uuid", "task", "args", "kwargs", "worker", "caller", "_job", "_owner")

    def __init__(self, owner: JobOwner, job: Job) -> None:
        self.uuid = job.uuid
        self.task = job.task
        self.args = job.args
        self.kwargs = job.kwargs
        self.worker = owner.name
        #: the public key (Z85) the request was authenticated with, on a mesh with keys
        self.caller = job.caller
        self._job = job
        self._owner = owner

    @property
    def cancelled(self) -> bool:
        """True once a DELETE cancelled this job."""
        return self._job.cancelled

    def check(self) -> None:
        """Raise ``JobCancelled`` if the job was cancelled (for long loops)."""
        if self._job.cancelled:
            raise JobCancelled(self.uuid)

    def event(self, message: str = "", **data: Any) -> None:
        """Send a progress EVENT to whoever posted the job."""
        self._owner._send_event(self._job, {"state": RUNNING, "message": message, **data})

    def run_blocking(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run blocking ``fn`` in the hub's thread pool, so the worker keeps answering."""
        return gevent.get_hub().threadpool.apply(fn, args, kwargs)
