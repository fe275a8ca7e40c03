"""JobStore: SQLite in WAL mode, one file per node, persistence, retention and purge."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sqlitefiles import journal_mode, make_database, other_view
from peermesh.nfp import StoreError
from peermesh.nfp.store import (_PURGE_CHUNK, CANCELLED, COMPLETED, PENDING, JobStore,
                                 store_path)


def test_store_path_is_per_node_and_safe(tmp_path: Path) -> None:
    assert store_path(tmp_path, "w1") == tmp_path / "nfp-w1.sqlite3"
    assert store_path(tmp_path, "../etc/x y") == tmp_path / "nfp-.._etc_x_y.sqlite3"


def test_wal_mode_and_reopen(tmp_path: Path) -> None:
    path = store_path(tmp_path, "w1")
    store = JobStore(path)
    assert store.add_worker_job("w1", "u1", "svc", "echo", {"task": "echo", "args": [1]})
    assert not store.add_worker_job("w1", "u1", "svc", "echo", {"task": "echo"})  # duplicate
    assert store.add_worker_job("w2", "u1", "svc", "echo", {"task": "echo"})      # other worker
    store.finish_worker_job("w1", "u1", COMPLETED, {"result": 3, "failed": False})
    store.add_worker_job("w1", "u2", "svc", "sleep", {"task": "sleep"})
    store.close()
    assert journal_mode(path) == "wal"
    again = JobStore(path)
    job = again.worker_job("w1", "u1")
    assert job is not None and job.state == COMPLETED and job.result == {"result": 3,
                                                                         "failed": False}
    assert [j.uuid for j in again.unfinished_worker_jobs("w1")] == ["u2"]
    assert again.unfinished_worker_jobs("w1")[0].state == PENDING
    assert again.count_worker_jobs("w1") == {COMPLETED: 1, PENDING: 1}
    assert again.delete_worker_job("w1", "u1") and again.worker_job("w1", "u1") is None
    again.close()


def test_a_file_that_is_not_a_job_store_is_refused_clearly(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"not a database at all, " * 100)
    with pytest.raises(StoreError, match="garbage.sqlite3 is not a usable peermesh job store"):
        JobStore(garbage)
    for name, table, error in (("other", "notes", "it holds other tables \\(notes\\)"),
                               ("clash", "worker_jobs", "no such column")):
        foreign = tmp_path / f"{name}.sqlite3"
        make_database(foreign, f"CREATE TABLE {table} (worker TEXT, uuid TEXT, note TEXT)")
        before = foreign.read_bytes()
        with pytest.raises(StoreError, match=error):
            JobStore(foreign)
        assert foreign.read_bytes() == before     # left as it was
    with pytest.raises(StoreError, match="cannot open|not a usable"):
        JobStore(tmp_path)    # a directory


def test_purge_keeps_unfinished_and_recent(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "s.sqlite3", retention=60)
    for uuid in ("old-done", "old-pending", "new-done"):
        store.add_worker_job("w", uuid, "svc", "t", {})
    store.finish_worker_job("w", "old-done", COMPLETED, {})
    store.finish_worker_job("w", "new-done", CANCELLED, {})
    store._db.execute("UPDATE worker_jobs SET created = created - 3600, finished = finished - "
                      "3600 WHERE uuid = 'old-done'")
    store._db.execute("UPDATE worker_jobs SET created = created - 3600 WHERE uuid = 'old-pending'")
    for uuid, state in (("c-old", "completed"), ("c-mixed", "mixed"), ("c-expired", "expired"),
                        ("c-unknown", "unknown"), ("c-unreachable", "unreachable")):
        store.add_client_job(uuid, "svc", "t", "all", {})
        store.update_client_job(uuid, state=state)
    store.commit()   # client records are held until the commit; the file is edited below
    store._db.execute("UPDATE client_jobs SET updated = updated - 3600")
    store.add_client_job("c-posting", "svc", "t", "all", {})
    store.commit()
    store._db.execute("UPDATE client_jobs SET updated = updated - 3600 WHERE uuid='c-posting'")
    assert store.purge() == 5
    assert store.worker_job("w", "old-done") is None
    assert store.worker_job("w", "old-pending") is not None   # never purged while unfinished
    assert store.worker_job("w", "new-done") is not None
    assert sorted(j.uuid for j in store.client_jobs()) == ["c-posting", "c-unreachable"]
    store.close()


def test_client_jobs(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "c.sqlite3")
    store.add_client_job("abc123", "svc", "echo", "any", {"task": "echo", "args": [1]})
    store.update_client_job("abc123", state="accepted", status=202, workers=["w1"])
    store.update_client_job("abc123", state="completed", status=200, result={"w1": {"r": 1}})
    time.sleep(0.001)
    store.add_client_job("abd999", "svc", "echo", "all", {})
    job = store.client_job("abc123")
    assert job is not None
    assert (job.state, job.status, job.workers, job.result) == ("completed", 200, ["w1"],
                                                                {"w1": {"r": 1}})
    assert job.to_dict()["args"] == [1]
    assert [j.uuid for j in store.client_jobs()] == ["abd999", "abc123"]
    assert [j.uuid for j in store.find_client_jobs("ab")] == ["abc123", "abd999"] or \
        sorted(j.uuid for j in store.find_client_jobs("ab")) == ["abc123", "abd999"]
    assert [j.uuid for j in store.find_client_jobs("abc")] == ["abc123"]
    assert store.find_client_jobs("%") == [] and store.find_client_jobs("_") == []
    store.close()


def test_group_commit_and_after_commit_order(tmp_path: Path) -> None:
    """Writes wait for the hub to be idle; what waits for them runs after the commit, in order."""
    import gevent

    path = tmp_path / "g.sqlite3"
    store = JobStore(path)
    with other_view(path) as other:                 # another process's view of the file
        seen: list[str] = []
        store.after_commit(seen.append, "nothing pending: at once")
        assert seen == ["nothing pending: at once"] and not store.pending
        assert store.add_worker_job("w", "u1", "svc", "t", {})
        store.add_client_job("c1", "svc", "t", "any", {})
        store.after_commit(seen.append, "ack 1")
        store.after_commit(seen.append, "ack 2")
        assert store.pending and seen == ["nothing pending: at once"]
        assert other.execute("SELECT count(*) FROM worker_jobs").fetchone() == (0,)  # not yet
        assert store.client_job("c1") is not None       # this process reads its own writes
        gevent.sleep(0.01)                              # the hub gets idle: one commit
        assert seen[1:] == ["ack 1", "ack 2"] and not store.pending
        assert other.execute("SELECT count(*) FROM worker_jobs").fetchone() == (1,)
        assert other.execute("SELECT count(*) FROM client_jobs").fetchone() == (1,)
        store.update_client_job("c1", state="completed")
        store.close()                                   # commits what is left
        assert other.execute("SELECT state FROM client_jobs").fetchone() == ("completed",)


def test_a_busy_hub_still_commits_within_commit_delay(tmp_path: Path) -> None:
    import gevent

    store = JobStore(tmp_path / "b.sqlite3", commit_delay=0.01)
    acked: list[float] = []
    store.add_worker_job("w", "u1", "svc", "t", {})
    start = time.monotonic()
    store.after_commit(lambda: acked.append(time.monotonic() - start))
    while not acked and time.monotonic() - start < 2:
        gevent.sleep(0)                              # never idle: the timer commits
    assert acked and acked[0] < 0.5
    store.close()


def test_client_records_are_held_merged_and_written_at_the_commit(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "h.sqlite3")
    store.add_client_job("j1", "svc", "echo", "any", {"task": "echo"})
    store.update_client_job("j1", state="completed", status=200, workers=["w1"],
                            result={"w1": {"result": 1}})
    with other_view(tmp_path / "h.sqlite3") as raw:
        assert raw.execute("SELECT count(*) FROM client_jobs").fetchone() == (0,)   # held
        store.commit()
        row = raw.execute("SELECT state, status, workers, result FROM client_jobs").fetchall()
        assert row == [("completed", 200, '["w1"]', '{"w1":{"result":1}}')]
        # a record already in the file gets only the changed columns
        store.update_client_job("j1", reason="why")
        job = store.client_job("j1")          # reads see held changes
        assert job is not None and job.reason == "why" and job.state == "completed"
        store.close()
        assert raw.execute("SELECT reason, state FROM client_jobs").fetchall() == [("why",
                                                                                     "completed")]
        raw.close()


def test_purge_in_chunks_and_no_time_index_on_worker_jobs(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    make_database(path,                       # a file made before the index was dropped
                  "CREATE TABLE worker_jobs (worker TEXT NOT NULL, uuid TEXT NOT NULL, "
                  "service TEXT NOT NULL, task TEXT NOT NULL, body TEXT NOT NULL, "
                  "state TEXT NOT NULL, result TEXT, created REAL NOT NULL, finished REAL, "
                  "PRIMARY KEY (worker, uuid)) WITHOUT ROWID; CREATE INDEX "
                  "worker_jobs_created ON worker_jobs (created);")
    store = JobStore(path, retention=60)
    indexes = store._db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND "
                                "tbl_name = 'worker_jobs' AND sql IS NOT NULL").fetchall()
    assert indexes == []
    count = 2 * _PURGE_CHUNK + 7
    for i in range(count):
        store.add_worker_job("w", f"{i:032x}", "svc", "t", {})
        store.finish_worker_job("w", f"{i:032x}", COMPLETED, {})
    store.add_worker_job("w", "recent", "svc", "t", {})
    store.finish_worker_job("w", "recent", COMPLETED, {})
    store.commit()
    store._db.execute("UPDATE worker_jobs SET created = created - 3600, finished = finished - "
                      "3600 WHERE uuid != 'recent'")
    assert store.purge() == count
    assert [j.uuid for j in store.worker_jobs()] == ["recent"]
    store.close()
