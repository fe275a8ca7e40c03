"""An MTL client for asyncio: ``AsyncClient``, ``AsyncReader``, ``AsyncWriter``.

The same API as ``Client``, ``Reader`` and ``Writer`` as coroutines: the
control session and each lease run their blocking calls on a thread of
their own.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, Mapping, Optional, Sequence, TypeVar

from .control import Client
from .leases import Reader, Received, Writer

__all__ = ["AsyncClient", "AsyncReader", "AsyncWriter"]

T = TypeVar("T")


class _OnThread:
    """Runs one object's blocking calls on a thread of its own, for asyncio."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _shutdown(self) -> None:
        self._executor.shutdown(wait=False)


class _AsyncLease(_OnThread):
    """A lease on a thread of its own; ``close`` ends both (its client forgets it)."""

    lease: "Reader | Writer"

    def __init__(self, name: str, owner: list["_AsyncLease"]) -> None:
        super().__init__(name)
        self._owner = owner

    async def close(self) -> None:
        """As the lease's ``close``; its thread ends too."""
        await self._run(self.lease.close)
        self._shutdown()
        if self in self._owner:
            self._owner.remove(self)


class AsyncClient(_OnThread):
    """``Client`` for asyncio: the same arguments, every call a coroutine."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("peermesh-mtl-control")
        self.client = Client(*args, **kwargs)
        self._leases: list[_AsyncLease] = []

    async def connect(self) -> "AsyncClient":
        await self._run(self.client.connect)
        return self

    async def reader(self, resources: Sequence[str] = (), confirm: str = "none"
                     ) -> "AsyncReader":
        """As ``Client.reader``."""
        lease = AsyncReader(self._leases)
        try:
            lease.lease = await lease._run(self.client.reader, resources, confirm)
        except BaseException:
            lease._shutdown()
            raise
        self._leases.append(lease)
        return lease

    async def writer(self, resources: Sequence[str] = (), confirm: str = "none"
                     ) -> "AsyncWriter":
        """As ``Client.writer``."""
        lease = AsyncWriter(self._leases)
        try:
            lease.lease = await lease._run(self.client.writer, resources, confirm)
        except BaseException:
            lease._shutdown()
            raise
        self._leases.append(lease)
        return lease

    async def close(self) -> None:
        await self._run(self.client.close)
        for lease in self._leases:
            lease._shutdown()
        self._shutdown()

    async def __aenter__(self) -> "AsyncClient":
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncReader(_AsyncLease):
    """``Reader`` for asyncio (``async for received in reader``)."""

    lease: Reader

    def __init__(self, owner: list[_AsyncLease]) -> None:
        super().__init__("peermesh-mtl-reader", owner)

    async def summon(self, resource: str) -> None:
        await self._run(self.lease.summon, resource)

    async def dismiss(self, resource: str) -> None:
        await self._run(self.lease.dismiss, resource)

    async def receive(self, timeout: Optional[float] = None) -> Optional[Received]:
        """As ``Reader.receive``; waits in slices of 50 ms so other calls get their turn."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = 0.05 if deadline is None else max(0.0, min(0.05, deadline - time.monotonic()))
            received = await self._run(self.lease.receive, wait)
            if received is not None or (deadline is not None and time.monotonic() >= deadline):
                return received

    async def confirm(self, received: Received, multiple: bool = False) -> bool:
        return await self._run(self.lease.confirm, received, multiple)

    async def ping(self, timeout: Optional[float] = None) -> bool:
        return await self._run(self.lease.ping, timeout)

    async def reject(self, received: Received, multiple: bool = False,
                     recycle: bool = False) -> bool:
        return await self._run(self.lease.reject, received, multiple, recycle)

    async def __aiter__(self) -> AsyncIterator[Received]:
        while True:
            received = await self.receive()
            if received is not None:
                yield received


class AsyncWriter(_AsyncLease):
    """``Writer`` for asyncio."""

    lease: Writer

    def __init__(self, owner: list[_AsyncLease]) -> None:
        super().__init__("peermesh-mtl-writer", owner)

    async def send(self, body: bytes, resource: str = "",
                   properties: Optional[Mapping[str, Any]] = None) -> int:
        return await self._run(self.lease.send, body, resource, properties)

    async def wait(self, timeout: Optional[float] = None) -> bool:
        return await self._run(self.lease.wait, timeout)

    async def ping(self, timeout: Optional[float] = None) -> bool:
        return await self._run(self.lease.ping, timeout)
