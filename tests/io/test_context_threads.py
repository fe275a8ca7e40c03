"""The shared context runs two libzmq I/O threads (connection churn under a flood)."""

from __future__ import annotations

import zmq

from peermesh.io.context import IO_THREADS, shared_context


def test_the_shared_context_has_two_io_threads() -> None:
    assert IO_THREADS == 2
    assert shared_context().get(zmq.IO_THREADS) == IO_THREADS
