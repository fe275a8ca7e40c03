"""Demo tasks for ``peermesh worker`` (its default ``--tasks``).

Each task takes the job context first (``job.event`` sends progress).
"""

from __future__ import annotations

import os
import socket
from typing import Any

import gevent

from .worker import JobContext, Tasks

__all__ = ["tasks"]

tasks = Tasks()


@tasks.task()
def echo(job: JobContext, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Return the arguments as given."""
    return {"args": list(args), "kwargs": kwargs}


@tasks.task()
def add(job: JobContext, *numbers: float) -> float:
    """The sum of the arguments."""
    return sum(numbers)


@tasks.task()
def sleep(job: JobContext, seconds: float = 1.0) -> float:
    """Sleep (cooperatively) and return the seconds slept; cancellable."""
    gevent.sleep(float(seconds))
    return float(seconds)


@tasks.task()
def progress(job: JobContext, steps: int = 5, delay: float = 0.1) -> int:
    """Send ``steps`` progress EVENTs, ``delay`` seconds apart."""
    for step in range(1, int(steps) + 1):
        gevent.sleep(float(delay))
        job.event(f"step {step} of {steps}", step=step, steps=int(steps))
    return int(steps)


@tasks.task()
def fail(job: JobContext, message: str = "failed on purpose") -> None:
    """Raise an error (the job ends ``failed``)."""
    raise RuntimeError(message)


@tasks.task()
def whoami(job: JobContext) -> dict[str, Any]:
    """The worker, host and process that ran the job."""
    return {"worker": job.worker, "host": socket.gethostname(), "pid": os.getpid()}
