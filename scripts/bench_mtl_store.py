#!/usr/bin/env python3
"""The MTL content store alone: appended + confirmed contents per second, by commit batch.

    python scripts/bench_mtl_store.py                    # batches 1, 10, 100, 1000 (~20 s)
    python scripts/bench_mtl_store.py --batches 50,200 --messages 100000
    python scripts/bench_mtl_store.py --synchronous FULL # an fsync per commit

One writer and one reader in one process, as the gateway drives the store:
per batch of B 100-byte contents, ``append`` each, ``commit()`` (the point
where the gateway would confirm to the writer), ``take`` them for a reader
lease and ``confirm`` the last with ``multiple`` (its delete reaches the file
with the next batch's commit). The ceiling is raw ``sqlite3`` doing the same
rows in the same transactions on a file with the same settings (WAL,
``synchronous``), without the store's bookkeeping. Both run in the same
rounds, interleaved; the table shows the median round, the ratio is the
median of per-round ratios. The target (>= 20,000 msg/s) is the issue's
"confirm full from one writer".
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Optional

import harness

TARGET = 20_000.0
BODY = b"x" * 100


def run_store(directory: str, batch: int, messages: int, synchronous: str) -> float:
    from peermesh.mtl.store import ContentStore

    store = ContentStore(os.path.join(directory, "store.sqlite3"), synchronous=synchronous)
    try:
        started = time.perf_counter()
        for _ in range(messages // batch):
            for _ in range(batch):
                store.append("chat", BODY)
            store.commit()
            got = store.take("reader", "chat", batch)
            store.confirm("reader", got[-1].sequence, multiple=True)
        store.commit()
        elapsed = time.perf_counter() - started
        if store.count:
            raise RuntimeError(f"{store.count} contents left unconfirmed")
    finally:
        store.close()
    return messages // batch * batch / elapsed


def run_sqlite(directory: str, batch: int, messages: int, synchronous: str) -> float:
    db = sqlite3.connect(os.path.join(directory, "raw.sqlite3"), isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous}")
        db.execute("CREATE TABLE content (id INTEGER PRIMARY KEY, resource TEXT NOT NULL, "
                   "properties BLOB NOT NULL, body BLOB NOT NULL)")
        next_id, confirmed = 1, []
        started = time.perf_counter()
        for _ in range(messages // batch):
            rows = [(next_id + i, "chat", b"", BODY) for i in range(batch)]
            next_id += batch
            db.execute("BEGIN")
            db.executemany("INSERT INTO content VALUES (?, ?, ?, ?)", rows)
            db.executemany("DELETE FROM content WHERE id = ?", confirmed)
            db.execute("COMMIT")
            ids = [row[0] for row in rows]
            read = db.execute(f"SELECT id, properties, body FROM content WHERE id IN "
                              f"({', '.join('?' * len(ids))})", ids).fetchall()
            confirmed = [(row[0],) for row in read]
        db.execute("BEGIN")
        db.executemany("DELETE FROM content WHERE id = ?", confirmed)
        db.execute("COMMIT")
        return messages // batch * batch / (time.perf_counter() - started)
    finally:
        db.close()


def fresh_dir(run: Callable[[str, int, int, str], float], batch: int, messages: int,
              synchronous: str) -> Callable[[int], float]:
    """A case of ``interleaved``: one run on a new file in a new directory."""
    def case(_round: int) -> float:
        directory = tempfile.mkdtemp(prefix="bench-mtl-store-")
        try:
            return run(directory, batch, messages, synchronous)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    return case


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=50_000, help="per case and round")
    parser.add_argument("--batches", default="1,10,100,1000",
                        help="contents per commit, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--synchronous", choices=("NORMAL", "FULL"), default="NORMAL")
    parser.add_argument("--json", action="store_true", help="one JSON object, no table")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    cases: dict[str, Callable[[int], Any]] = {}
    for batch in batches:
        messages = args.messages if batch > 1 else min(args.messages, 10_000)
        cases[f"sqlite/{batch}"] = fresh_dir(run_sqlite, batch, messages, args.synchronous)
        cases[f"store/{batch}"] = fresh_dir(run_store, batch, messages, args.synchronous)
    runs = harness.interleaved(cases, args.rounds)
    load = os.getloadavg()
    rows = []
    results: dict[str, Any] = {"synchronous": args.synchronous, "load_average": load,
                               "batches": {}}
    for batch in batches:
        raw, store = runs[f"sqlite/{batch}"], runs[f"store/{batch}"]
        ratio = statistics.median(s / r for s, r in zip(store, raw))
        rate = statistics.median(store)
        results["batches"][batch] = {"store": store, "sqlite": raw, "ratio": ratio}
        rows.append([str(batch), statistics.median(raw), rate, ratio,
                     harness.verdict(rate, TARGET, at_least=True)])
    if args.json:
        print(harness.dump_json(results))
        return 0
    print(f"\nMTL content store: 100-byte contents appended, committed, taken and confirmed "
          f"(synchronous={args.synchronous}), {args.rounds} rounds, median round; "
          f"load average {' '.join(f'{x:.2f}' for x in load)}")
    print("\n".join(harness.table(["batch", "sqlite msg/s", "store msg/s", "store/sqlite",
                                   "target"], rows)))
    return 0


if __name__ == "__main__":
    harness.run(main)
