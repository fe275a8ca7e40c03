"""The serving gateway's replicas and the answers that wait for them, as a sans-io core.

How it works
------------
A standby gateway that holds a copy of the serving gateway's content and
follows its commits is a *replica* (see ``peermesh.mtl.gateway`` for the
copy and the whispers). After each commit the serving gateway sends its
replicas what the commit wrote, then a numbered *mark* to each; a replica
acknowledges a mark once it has committed everything before it. Answers to
``confirm: full`` links from that commit (a writer's Confirm, a reader's
Content, a Pong) are *held* until one replica acknowledged its mark, so that
a Confirm means the content is committed on two gateways.

``Replicas`` keeps that state and decides; the gateway whispers the marks it
numbers and sends the answers it releases:

* ``hold(answers, now)`` - the marks to send now (one per replica); the
  answers wait in order behind any held before;
* ``acknowledged(peer, number)`` then ``release()`` - the answers that may
  go: those a replica acknowledged, or that no replica in step can any more
  (it stopped being one, or left);
* ``late(now)`` - replicas that left the oldest held mark unanswered for
  ``wait`` seconds: no longer replicas (the gateway tells them to copy
  again), so what they held up can be released.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator, TypeVar
from uuid import UUID

__all__ = ["Replicas"]

A = TypeVar("A")


class Replicas:
    """Replicas in step, the marks sent to each standby and acknowledged, held answers."""

    def __init__(self, wait: float) -> None:
        """``wait``: seconds a replica may leave a mark unanswered before it stops being one."""
        self.wait = wait
        self._in_step: set[UUID] = set()
        self._marks: dict[UUID, int] = {}     # last mark numbered for each standby
        self._acks: dict[UUID, int] = {}      # last mark each standby acknowledged
        self._held: deque[tuple[dict[UUID, int], list, float]] = deque()

    # --- who is a replica ---------------------------------------------------------

    def __contains__(self, peer: object) -> bool:
        return peer in self._in_step

    def __iter__(self) -> Iterator[UUID]:
        return iter(list(self._in_step))

    def __len__(self) -> int:
        return len(self._in_step)

    def add(self, peer: UUID) -> None:
        """``peer`` holds a complete copy: it follows every commit from now on."""
        self._in_step.add(peer)

    def discard(self, peer: UUID) -> None:
        """``peer`` is no replica any more (its marks still count if it answers them)."""
        self._in_step.discard(peer)

    def clear(self) -> None:
        """No standby is a replica any more (the gateway stopped serving)."""
        self._in_step.clear()

    def forget(self, peer: UUID) -> None:
        """``peer`` left the mesh: no replica, no marks."""
        self._in_step.discard(peer)
        self._marks.pop(peer, None)
        self._acks.pop(peer, None)

    # --- marks --------------------------------------------------------------------

    def next_mark(self, peer: UUID) -> int:
        """The number of the next mark to send ``peer`` (a replica, or a standby being
        copied)."""
        number = self._marks[peer] = self._marks.get(peer, 0) + 1
        return number

    def acknowledged(self, peer: UUID, number: int) -> None:
        """``peer`` committed everything up to its mark ``number``."""
        if number > self._acks.get(peer, 0):
            self._acks[peer] = number

    def reached(self, peer: UUID, number: int) -> bool:
        """True once ``peer`` acknowledged mark ``number`` (or a later one)."""
        return self._acks.get(peer, 0) >= number

    # --- held answers ---------------------------------------------------------------

    @property
    def holding(self) -> bool:
        """True while some answers wait for a replica."""
        return bool(self._held)

    def hold(self, answers: list[A], now: float) -> dict[UUID, int]:
        """Hold ``answers`` until a replica acknowledges the marks returned (one per
        replica, to send now)."""
        marks = {peer: self.next_mark(peer) for peer in self._in_step}
        self._held.append((marks, answers, now))
        return marks

    def release(self) -> list[list]:
        """The held answers that may go now, oldest first: acknowledged by a replica,
        or waiting for none still in step."""
        out = []
        held = self._held
        while held:
            marks, answers, _ = held[0]
            if not any(self.reached(peer, number) for peer, number in marks.items()) \
                    and any(peer in self._in_step for peer in marks):
                break                              # a replica in step has yet to answer
            held.popleft()
            out.append(answers)
        return out

    def late(self, now: float) -> list[UUID]:
        """Replicas that left the oldest held mark unanswered for ``wait`` seconds: they
        stop being replicas (``release`` may then let answers go)."""
        if not self._held or now - self._held[0][2] < self.wait:
            return []
        slow = [peer for peer, number in self._held[0][0].items()
                if peer in self._in_step and not self.reached(peer, number)]
        for peer in slow:
            self._in_step.discard(peer)
        return slow
