"""The durable MTL content store on real SQLite files, including a writer killed with SIGKILL."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sqlitefiles import make_database
from peermesh.errors import PeermeshError, StoreError
from peermesh.mtl.store import (OVERHEAD, ContentStore, Delivery, StoreFull, gateway_store_path,
                                open_gateway_store, store_path)

REPO = Path(__file__).resolve().parents[2]
WAIT = 20.0   # upper bound for a child that normally answers in milliseconds


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return store_path(tmp_path / "data", "gw/1")


@pytest.fixture
def store(path: Path) -> Iterator[ContentStore]:
    opened = ContentStore(path)
    yield opened
    opened.close()


def bodies(deliveries: list[Delivery]) -> list[bytes]:
    return [d.body for d in deliveries]


def fill(store: ContentStore, resource: str, *texts: str) -> list[int]:
    ids = [store.append(resource, text.encode(), b"\x81\xa1k\xa1v") for text in texts]
    store.commit()
    return ids


def test_store_path_is_safe() -> None:
    assert store_path("/d", "gw/1 x") == Path("/d/mtl-gw_1_x.sqlite3")
    assert store_path("/d", "") == Path("/d/mtl-gateway.sqlite3")


def test_content_is_handed_out_in_order_once_committed(store: ContentStore) -> None:
    first = store.append("chat", b"a", b"props")
    assert store.take("L", "chat", 10) == [] and store.pending("chat") == 0
    store.commit()
    assert store.pending("chat") == 1
    ids = [first, *fill(store, "chat", "b", "c")]
    assert ids == sorted(ids) and len(set(ids)) == 3
    got = store.take("L", "chat", 2)
    assert [(d.sequence, d.id, d.resource, d.body) for d in got] == \
        [(1, ids[0], "chat", b"a"), (2, ids[1], "chat", b"b")]
    assert got[0].properties == b"props"
    assert bodies(store.take("M", "chat", 10)) == [b"c"]
    assert store.take("M", "news", 10) == [] and store.take("M", "chat", 0) == []
    assert store.held("L") == 2 and store.held("M") == 1 and store.pending("chat") == 0


def test_confirm_single_and_multiple(store: ContentStore) -> None:
    fill(store, "chat", *"abcdef")
    got = store.take("L", "chat", 6)
    assert store.confirm("L", 2) == 1                 # exactly one
    assert store.confirm("L", 2) == 0                 # not held any more: ignored
    assert store.confirm("L", 99) == 0 and store.confirm("nobody", 1, True) == 0
    assert store.confirm("L", 4, multiple=True) == 3  # 1, 3 and 4
    assert store.held("L") == 2
    store.commit()
    assert store.count == 2
    assert store.confirm("L", got[-1].sequence, multiple=True) == 2
    store.commit()
    assert store.count == 0 and store.size == 0 and store.resources() == []


def test_reject_recycles_before_newer_content_or_drops(store: ContentStore) -> None:
    fill(store, "chat", *"abcde")
    store.take("L", "chat", 3)                       # a b c
    assert store.reject("L", 2, recycle=True) == 1   # b back
    assert store.reject("L", 1, recycle=False) == 1  # a dropped
    again = store.take("L", "chat", 10)
    assert bodies(again) == [b"b", b"d", b"e"]
    assert [d.sequence for d in again] == [4, 5, 6]  # new sequences for the lease
    assert store.reject("L", 5, multiple=True, recycle=True) == 3   # c(3), b(4), d(5)
    assert bodies(store.take("M", "chat", 10)) == [b"b", b"c", b"d"]
    assert store.count == 4


def test_release_hands_a_leases_content_to_the_next_reader(store: ContentStore) -> None:
    fill(store, "chat", "a", "b")
    fill(store, "news", "n1")
    store.take("L", "chat", 1)
    store.take("L", "news", 1)
    store.take("L", "chat", 1)
    assert store.release("L") == 3 and store.held("L") == 0 and store.release("L") == 0
    assert bodies(store.take("M", "chat", 5)) == [b"a", b"b"]
    # one lease over two resources: confirm with multiple covers its own sequence order
    got = store.take("M", "news", 5)
    assert got[0].sequence == 3
    assert store.confirm("M", 2, multiple=True) == 2 and store.held("M") == 1


def test_reopen_brings_back_everything_not_confirmed(path: Path) -> None:
    store = ContentStore(path)
    ids = fill(store, "chat", *"abcdef")
    fill(store, "news", "n1")
    store.take("L", "chat", 4)
    store.confirm("L", 2, multiple=True)              # a b confirmed
    store.reject("L", 3)                              # c dropped
    store.commit()
    store.confirm("L", 4)                             # d confirmed, not committed
    store.append("chat", b"never committed")
    store._db.close()                                 # as a crash would: no close()
    store._checkpointer.stop()

    again = ContentStore(path)
    try:
        assert again.resources() == ["chat", "news"]
        got = again.take("N", "chat", 10)
        # d's confirm never reached the file: it is handed out again
        assert bodies(got) == [b"d", b"e", b"f"] and [d.id for d in got] == ids[3:]
        assert bodies(again.take("N", "news", 10)) == [b"n1"]
        assert again.size == 3 * (1 + 5 + OVERHEAD) + (2 + 5 + OVERHEAD)
        again.confirm("N", 4, multiple=True)
        again.commit()
        newer = again.append("chat", b"g")
        assert newer > max(ids) + 1                   # the uncommitted id is not reused
    finally:
        again.close()
    last = ContentStore(path)
    try:
        assert last.count == 1 and last.append("chat", b"h") == newer + 1
        last.commit()
        last.confirm("L", last.take("L", "chat", 5)[-1].sequence, multiple=True)
    finally:
        last.close()
    empty = ContentStore(path)                        # ids keep growing with nothing left
    try:
        assert empty.count == 0 and empty.append("chat", b"i") == newer + 2
    finally:
        empty.close()


def test_bounds(path: Path) -> None:
    each = 10 + OVERHEAD
    store = ContentStore(path, max_resource_bytes=3 * each, max_bytes=5 * each)
    try:
        for _ in range(3):
            store.append("a", b"x" * 10)
        with pytest.raises(StoreFull, match="resource 'a' holds"):
            store.append("a", b"x" * 10)
        store.append("b", b"x" * 10)
        store.append("c", b"x" * 10)
        with pytest.raises(StoreFull, match="the store holds"):
            store.append("d", b"x" * 10)
        assert isinstance(StoreFull("x"), PeermeshError)
        assert store.resources() == ["a", "b", "c"] and store.count == 5
        store.commit()
        got = store.take("L", "a", 1)
        store.confirm("L", got[0].sequence)           # room again, at once
        store.append("d", b"x" * 10)
        store.commit()
        assert store.count == 5
    finally:
        store.close()


def test_a_file_that_is_not_a_store_is_a_clear_error(tmp_path: Path) -> None:
    text = tmp_path / "text.sqlite3"
    text.write_bytes(b"not a database at all, " * 100)
    with pytest.raises(StoreError, match=f"{text} is not a usable MTL content store"):
        ContentStore(text)
    other = tmp_path / "other.sqlite3"
    make_database(other, "CREATE TABLE jobs (x)")
    with pytest.raises(StoreError, match=r"holds other tables \(jobs\)"):
        ContentStore(other)
    with pytest.raises(ValueError, match="synchronous"):
        ContentStore(tmp_path / "s.sqlite3", synchronous="OFF")


# --- SIGKILL ------------------------------------------------------------

CHILD = """
import sys
from peermesh.mtl.store import ContentStore
store = ContentStore(sys.argv[1])
batch = 0
while True:
    batch += 1
    ids = [store.append("chat", b"body-%d" % (batch * 1000 + i)) for i in range(50)]
    store.commit()
    print("stored", ids[0], ids[-1], flush=True)      # acknowledged only after the commit
    got = store.take("reader", "chat", 50)
    done = got[:25]                                    # the rest stays held
    for delivery in done:
        store.confirm("reader", delivery.sequence)
    store.commit()
    print("confirmed", " ".join(str(d.id) for d in done), flush=True)
"""


def test_a_writer_killed_mid_write_loses_nothing_acknowledged(path: Path) -> None:
    path.parent.mkdir(parents=True)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    stored: set[int] = set()
    confirmed: set[int] = set()
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + WAIT
        buffer = b""
        while len(stored) < 2000:
            ready, _, _ = select.select([child.stdout], [], [], deadline - time.monotonic())
            assert ready, f"the child acknowledged only {len(stored)} contents in {WAIT} s"
            chunk = os.read(child.stdout.fileno(), 65536)
            assert chunk, "the child ended"
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                word, *numbers = line.split()
                if word == b"stored":
                    stored.update(range(int(numbers[0]), int(numbers[1]) + 1))
                else:
                    confirmed.update(int(n) for n in numbers)
    finally:
        child.send_signal(signal.SIGKILL)   # mid-write: it never stops appending
        child.wait(WAIT)
    assert child.returncode == -signal.SIGKILL

    store = ContentStore(path)
    try:
        rows = dict(store._db.execute("SELECT id, body FROM mtl_content"))
        present = set(rows)
        assert stored - confirmed <= present               # nothing acknowledged is lost
        assert not present & confirmed                     # nothing confirmed comes back
        # every row is whole: its body is the one written for its id
        first = min(stored)
        for content_id, body in rows.items():
            batch, index = divmod(content_id - first, 50)
            assert body == b"body-%d" % ((batch + 1) * 1000 + index)
        got = store.take("again", "chat", len(present) + 10)
        assert [d.id for d in got] == sorted(present)
    finally:
        store.close()


def test_copies_keep_their_content_id_and_are_never_stored_twice(tmp_path: Path) -> None:
    from peermesh.mtl.store import make_cid, split_cid

    first = ContentStore(tmp_path / "a.sqlite3")
    second = ContentStore(tmp_path / "b.sqlite3")
    try:
        assert first.origin != second.origin
        first.record = True
        ids = [first.append("jobs", b"job %d" % i) for i in range(1, 4)]
        first.commit()
        written = first.committed
        assert [(i, c, b) for i, c, _, _, b in written] == [
            (i, make_cid(first.origin, i), b"job %d" % n) for n, i in enumerate(ids, 1)]
        for _, cid, resource, properties, body in written:   # copied to the second store
            assert not second.knows(cid)
            second.append(resource, body, properties, cid)
        second.commit()
        assert all(second.knows(cid) for _, cid, _, _, _ in written)
        # a reader of the second confirms the first copy: deleted, and still known
        [delivery] = second.take("L", "jobs", 1)
        assert second.cid(delivery.id) == written[0][1]
        second.confirm("L", delivery.sequence)
        second.commit()
        assert second.knows(written[0][1]) and second.count == 2
        # the first store forgets by content id what a reader confirmed elsewhere
        assert first.forget([written[0][1], make_cid(12345, 1)]) == 1
        first.commit()
        assert first.deleted == [] and first.count == 2
        rows, after = first.snapshot(0, 10)
        assert [split_cid(cid)[1] for _, cid, _, _, _ in rows] == ids[1:] and after == ids[-1]
        assert first.snapshot(after, 10) == ([], after)
    finally:
        first.close()
        second.close()
    # after a restart: the same origin, the copies' ids, and what was deleted still known
    reopened = ContentStore(tmp_path / "b.sqlite3")
    try:
        assert reopened.all_cids() == {cid for _, cid, _, _, _ in written[1:]}
        assert reopened.knows(written[0][1]) and reopened.origin == second.origin
    finally:
        reopened.close()


# --------------------------------------------------------------------------
# The gateway's store: named by something stable, earlier stores taken in


def _earlier(data: Path, name: str, *texts: str) -> None:
    """A store of the earlier default name (a random node name) holding ``texts``."""
    old = ContentStore(data / f"mtl-{name}.sqlite3")
    fill(old, "jobs", *texts)
    old.close()


def test_a_gateway_store_is_named_by_its_data_directory_or_configured_name(
        tmp_path: Path) -> None:
    assert gateway_store_path(tmp_path, None) == tmp_path / "mtl.sqlite3"
    assert gateway_store_path(tmp_path, "gw") == tmp_path / "mtl-gw.sqlite3"
    first = open_gateway_store(tmp_path, None)
    fill(first, "jobs", "kept")
    first.close()
    again = open_gateway_store(tmp_path, None)  # a restart, whatever its node is called
    assert bodies(again.take("l", "jobs", 10)) == [b"kept"]
    again.close()


def test_the_one_store_of_the_earlier_default_name_is_renamed_on_upgrade(
        tmp_path: Path) -> None:
    _earlier(tmp_path, "36AE6D", "a", "b")
    store = open_gateway_store(tmp_path, None)
    try:
        assert store.path == tmp_path / "mtl.sqlite3"
        assert bodies(store.take("l", "jobs", 10)) == [b"a", b"b"]
    finally:
        store.close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("mtl-")) == []


def test_several_stores_of_the_earlier_default_name_are_taken_in_and_removed(
        tmp_path: Path) -> None:
    _earlier(tmp_path, "36AE6D", "a", "b")
    _earlier(tmp_path, "4ED0BE", "c")
    store = open_gateway_store(tmp_path, None)
    try:
        assert sorted(bodies(store.take("l", "jobs", 10))) == [b"a", b"b", b"c"]
    finally:
        store.close()
    assert not any(p.name.startswith("mtl-") for p in tmp_path.iterdir())
    store = open_gateway_store(tmp_path, None)  # and only once
    try:
        assert sorted(bodies(store.take("l", "jobs", 10))) == [b"a", b"b", b"c"]
    finally:
        store.close()


def test_a_gateway_with_a_configured_name_leaves_other_stores_alone(tmp_path: Path) -> None:
    _earlier(tmp_path, "36AE6D", "theirs")
    store = open_gateway_store(tmp_path, "gw")
    try:
        assert store.take("l", "jobs", 10) == []
    finally:
        store.close()
    assert (tmp_path / "mtl-36AE6D.sqlite3").exists()


def test_two_gateways_never_serve_one_store(tmp_path: Path) -> None:
    first = open_gateway_store(tmp_path, None)
    try:
        with pytest.raises(StoreError, match="in use by another gateway"):
            open_gateway_store(tmp_path, None)
        other = open_gateway_store(tmp_path, "gw")  # a store of its own
        other.close()
    finally:
        first.close()
    open_gateway_store(tmp_path, None).close()  # free again once the first stopped


def test_what_waits_for_a_confirm_is_counted_and_its_age_never_understated(
        store: ContentStore) -> None:
    assert (store.stored, store.confirmed, store.handed_out, store.oldest_age()) == (0, 0, 0, 0)
    store.append("jobs", b"first")
    assert store.oldest_age() == 0  # staged only: nothing waits yet
    store.commit()
    first_committed = time.monotonic()
    for i in range(3000):  # many commits while the first content waits: times are thinned
        store.append("other", b"%d" % i)
        store.commit()
    assert len(store._commit_times) <= 1024
    before = time.monotonic()
    assert store.oldest_age() >= before - first_committed
    taken = store.take("lease", "jobs", 10)
    assert store.handed_out == 1 and store.stored == 3001
    store.confirm("lease", taken[0].sequence)
    assert store.confirmed == 1 and store.handed_out == 0 and store.count == 3000
