#!/usr/bin/env python3
"""Wall time of whole ``peermesh`` commands that go through a running agent.

    python scripts/bench_cli.py              # 30 runs of each command
    python scripts/bench_cli.py -n 100 --json
    python scripts/bench_cli.py --baseline c28923a

Starts an agent (``--interface lo``, a free beacon port, its socket in a
temporary directory) and one peer for it to see, then runs ``peers``,
``shout`` and ``whisper`` as separate processes through the installed
console script (the ``peermesh`` next to ``sys.executable``, not a pyenv
shim), interleaved with the bare interpreter (``python -c pass`` and
``python -S -c pass``), and prints median and p90 wall milliseconds of each.
"minus interpreter" subtracts the median of ``python -c pass`` from a
command's median: what peermesh itself costs, without the interpreter's own
start-up (which includes whatever ``.pth`` files site-packages holds). The
issue 3 target is 50 ms for a whole command.

Commands run with a bytecode cache of their own (``PYTHONPYCACHEPREFIX`` in
the temporary directory, filled by a first run), as an installed package
has. Two more rows of ``peers`` for context: ``(no .pyc)`` runs with
``PYTHONDONTWRITEBYTECODE`` and no cache of its own, so an editable install
compiles peermesh's modules on every run; ``(python -S)`` runs ``cli.main``
in ``python -S`` with peermesh and site-packages put on ``sys.path`` by hand,
so no ``.pth`` file runs (what a machine whose site-packages has none costs);
its "minus interpreter" subtracts ``python -S -c pass``. ``--baseline REV``
starts a second agent and peer from an older commit's peermesh and runs its
commands in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Any

import harness
from harness import (INTERFACE, Children, dump_json, free_udp_port, percentile, progress,
                     table, trees)

TARGET_MS = 50.0
BIN = os.path.dirname(sys.executable)
PEERMESH = os.path.join(BIN, "peermesh")


def _env(code: str, pycache: str = "", write: bool = True) -> dict[str, str]:
    """The environment without PEERMESH_*, peermesh from ``code``, bytecode cached under
    ``pycache`` (or not written at all)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PEERMESH_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = code
    if pycache:
        env["PYTHONPYCACHEPREFIX"] = pycache
    if not write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one process run to completion (it must exit 0)."""
    start = time.perf_counter()
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env,
                            timeout=30)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{argv!r} exited {result.returncode}: "
                           f"{result.stderr.decode(errors='replace').strip()}")
    return elapsed


def _wait_for_peer(sock: str, name: str, env: dict[str, str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run([PEERMESH, "peers", "--json", "--agent", sock],
                             capture_output=True, env=env, timeout=30)
        if out.returncode == 0 and name in [p["name"] for p in json.loads(out.stdout or b"[]")]:
            return
        time.sleep(0.1)
    raise RuntimeError(f"the agent did not see {name} within {timeout:g} s")


def _agent(kids: Children, tmp: str, label: str, code: str
           ) -> dict[str, tuple[list[str], dict[str, str]]]:
    """An agent and a peer running ``code``; the command cases that go through it."""
    port = free_udp_port()
    net = ["--interface", INTERFACE, "--port", str(port), "--interval", "0.2"]
    sock = os.path.join(tmp, f"{label}.sock")
    # Were the agent lost, a command's fallback node must stay on loopback too.
    loopback = {"PEERMESH_INTERFACE": INTERFACE, "PEERMESH_PORT": str(port)}
    cached = {**_env(code, os.path.join(tmp, f"pycache-{label}")), **loopback}
    uncached = {**_env(code, write=False), **loopback}
    agent = kids.popen([PEERMESH, "agent", "--agent", sock, "--name", "agent", *net], cached,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while True:
        line = agent.readline(deadline - time.monotonic(), agent.process.stderr)
        if not line:
            raise RuntimeError(f"{label} agent: no 'agent at {sock}' line within 20 s")
        if f"agent at {sock}".encode() in line:
            break
    kids.popen([PEERMESH, "run", "--name", "bob", "--group", "bench", *net], cached,
               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_peer(sock, "bob", cached, 20)
    peers = [PEERMESH, "peers", "--agent", sock]
    no_pth = (f"import sys; sys.path[:0] = {[code, sysconfig.get_paths()['purelib']]!r}; "
              "from peermesh.cli.commands import main; sys.exit(main())")
    tag = "" if label == "peermesh" else f" [{label}]"
    return {f"peermesh peers{tag}": (peers, cached),
            f"peermesh shout{tag}": ([PEERMESH, "shout", "bench", "hello", "--agent", sock],
                                     cached),
            f"peermesh whisper{tag}": ([PEERMESH, "whisper", "bob", "hi", "--agent", sock],
                                       cached),
            f"peers (no .pyc){tag}": (peers, uncached),
            f"peers (python -S){tag}": ([sys.executable, "-S", "-c", no_pth, *peers[1:]],
                                        cached)}


def _summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1e3 for s in samples)
    return {"median_ms": round(statistics.median(ms), 2),
            "p90_ms": round(percentile(ms, 90), 2), "min_ms": round(ms[0], 2)}


def measure(runs: int, baseline: str) -> dict[str, Any]:
    code = trees(baseline)
    with tempfile.TemporaryDirectory(prefix="pm-bench-cli-") as tmp, Children(grace=0) as kids:
        plain = _env(code["peermesh"], os.path.join(tmp, "pycache-peermesh"))
        cases = {"python -c pass": ([sys.executable, "-c", "pass"], plain),
                 "python -S -c pass": ([sys.executable, "-S", "-c", "pass"], plain)}
        for label, tree in code.items():
            cases.update(_agent(kids, tmp, label, tree))
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for argv, env in cases.values():  # fill the bytecode and page caches
            _run(argv, env)
        for i in range(runs):
            for name, (argv, env) in cases.items():
                samples[name].append(_run(argv, env))
            if (i + 1) % 10 == 0:
                progress(f"  {i + 1}/{runs} rounds")
    rows = {name: _summary(values) for name, values in samples.items()}
    for name, row in rows.items():
        if not name.startswith("python"):
            base = "python -S -c pass" if "-S" in name else "python -c pass"
            row["minus_interpreter_ms"] = round(row["median_ms"] - rows[base]["median_ms"], 2)
    out = {"runs": runs, "console_script": PEERMESH, "target_ms": TARGET_MS,
           "load_average": os.getloadavg(), "rows": rows}
    if "baseline" in code:
        out["baseline"] = f"{baseline} ({code['baseline']})"
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--runs", type=int, default=30,
                        help="runs of each command (default: 30)")
    parser.add_argument("--baseline", metavar="REV",
                        help="also run the commands of REV (a commit, or a directory holding a "
                             "peermesh package), through an agent of its own")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if not os.access(PEERMESH, os.X_OK):
        print(f"no console script at {PEERMESH}: pip install -e . first", file=sys.stderr)
        return 1
    progress(f"{args.runs} interleaved rounds through an agent on loopback ...")
    result = measure(args.runs, args.baseline)
    if args.json:
        print(dump_json(result))
        return 0
    print("\n".join(table(["command", "median ms", "p90 ms", "min ms", "minus interp."], [
        [name, f"{r['median_ms']:.1f}", f"{r['p90_ms']:.1f}", f"{r['min_ms']:.1f}",
         "" if "minus_interpreter_ms" not in r else f"{r['minus_interpreter_ms']:.1f}"]
        for name, r in result["rows"].items()])))
    commands = [r for n, r in result["rows"].items()
                if n.startswith("peermesh") and "[" not in n]
    worst = max(r["median_ms"] for r in commands)
    worst_minus = max(r["minus_interpreter_ms"] for r in commands)
    print(f"\nslowest command median: {worst:.1f} ms whole, {worst_minus:.1f} ms without the "
          f"interpreter's start-up (target <= {TARGET_MS:g} ms); load average "
          f"{result['load_average'][0]:.1f}")
    if "baseline" in result:
        print(f"[baseline]: {result['baseline']}")
    return 0


if __name__ == "__main__":
    harness.run(main)
