"""``take_exact``: the agent's and its client's way to read a frame's octets off a socket."""

from __future__ import annotations

import socket
import threading

from peermesh.agent.protocol import frame, take_exact
from peermesh.wire.agent import HEAD_SIZE, frame_size


def test_frames_are_read_whole_across_chunks_and_what_follows_is_kept() -> None:
    left, right = socket.socketpair()
    try:
        right.settimeout(5)
        big = frame({"op": "x" * 300_000})       # more than one recv takes
        left.settimeout(5)
        sender = threading.Thread(target=left.sendall, args=(big + frame({"op": "next"}),),
                                  daemon=True)
        sender.start()                           # (more than the socket buffers hold)
        buffer = bytearray()
        head = take_exact(buffer, HEAD_SIZE, right.recv)
        assert head is not None
        body = take_exact(buffer, frame_size(head), right.recv)
        assert head + (body or b"") == big
        head = take_exact(buffer, HEAD_SIZE, right.recv)
        assert head is not None and take_exact(buffer, frame_size(head), right.recv) == \
            frame({"op": "next"})[HEAD_SIZE:]
        assert not buffer
        sender.join(5)
        left.sendall(b"\x00\x00")                # half a head, then the end of the stream
        left.close()
        assert take_exact(buffer, HEAD_SIZE, right.recv) is None
        assert buffer == b"\x00\x00"             # kept: nothing read is lost
    finally:
        left.close()
        right.close()
