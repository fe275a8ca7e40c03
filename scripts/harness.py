"""What the benchmarks in scripts/ share: child processes, CPU readers, rounds, the table.

- **Child processes.** ``Children.start(module, role, **kwargs)`` runs
  ``role_<role>(parent, **kwargs)`` of ``scripts/<module>.py`` in a fresh
  interpreter (``python harness.py module role JSON``). The child talks to
  this process in JSON lines: it sends ``parent.send(tag, value)`` on the
  stdout it started with (anything else it prints goes to stderr) and reads
  commands from stdin (``parent.expect("go", timeout)``). Every wait is
  bounded. A child ignores Ctrl-C and dies with its parent
  (``PR_SET_PDEATHSIG``); ``Children`` ends every process it started on
  the way out (an error, Ctrl-C or SIGTERM too): stdin closed, then
  SIGTERM, then SIGKILL.
- **Code under test.** A child imports ``peermesh`` from ``code`` (this
  checkout unless told otherwise) and fails if it would import it from
  anywhere else. ``baseline_tree(REV)`` gives the tree of an older commit,
  with its C extension built, so one run can measure both side by side.
- **CPU.** ``cpu()`` for this process, ``proc_cpu(pid)`` and
  ``threads_cpu(pid)`` (nanoseconds from ``/proc/PID/task/*/schedstat``)
  for others, ``machine_cpu()`` and ``busy_pct()`` for the whole machine.
- **Rounds.** ``interleaved(cases, rounds)`` runs every case once per round,
  so load from elsewhere hits all alike; ``median_run`` and ``round_ratios``
  summarise them.
- **Output.** ``progress`` (stderr), ``table``, ``fmt``, ``ratio``, ``verdict``.

Everything stays on loopback: ``INTERFACE`` is "lo", sockets bind to
``LOOPBACK`` and beacons go to ``LO_BROADCAST`` on a port from
``free_udp_port()``.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import json
import math
import os
import random
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Iterator, Optional

from processes import end_group

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LOOPBACK = "127.0.0.1"
LO_BROADCAST = "127.255.255.255"
INTERFACE = "lo"
CODE_ENV = "BENCH_PEERMESH_CODE"   # the tree a child imports peermesh from
_T0 = time.perf_counter()
if CODE_ENV not in os.environ and REPO not in sys.path:
    sys.path.insert(1, REPO)   # a benchmark measures the checkout it belongs to, itself too


# ---------------------------------------------------------------------------
# output

def progress(text: str) -> None:
    """A progress line on stderr, with the seconds since the run began."""
    print(f"[{time.perf_counter() - _T0:6.1f}s] {text}", file=sys.stderr, flush=True)


def fmt(value: Any) -> str:
    """A number with as many digits as its size deserves; "-" for None, "n/a" for NaN."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if value != value:
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def ratio(a: Any, b: Any) -> Optional[float]:
    """``a / b`` when both are numbers and ``b`` is not zero, else None."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
        return a / b
    return None


def verdict(value: Optional[float], target: float, at_least: bool) -> str:
    """``PASS (>=0.600)`` or ``MISS (<=1.50)`` against ``target``; "-" for no value."""
    if value is None:
        return "-"
    ok = value >= target if at_least else value <= target
    return ("PASS" if ok else "MISS") + f" ({'>=' if at_least else '<='}{fmt(target)})"


def table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Lines of a table: the first column left-aligned, the others right; cells through
    ``fmt`` unless they are strings already."""
    cells = [[c if isinstance(c, str) else fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in [list(head), *cells]) for i in range(len(head))]
    line = "  ".join(("{:<%d}" if i == 0 else "{:>%d}") % w for i, w in enumerate(widths))
    return [line.format(*head), "  ".join("-" * w for w in widths),
            *(line.format(*r) for r in cells)]


# ---------------------------------------------------------------------------
# statistics

def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0-100) of an already sorted sequence."""
    if not sorted_values:
        return float("nan")
    k = math.ceil(q / 100.0 * len(sorted_values)) - 1
    return sorted_values[max(0, min(len(sorted_values) - 1, k))]


def median_run(runs: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run whose ``key`` is the median (the lower of the middle two), with every
    run's ``key`` under "trials"."""
    ordered = sorted(runs, key=lambda r: r[key])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["trials"] = [r[key] for r in runs]
    return chosen


def round_ratios(top: Sequence[Optional[dict[str, Any]]],
                 bottom: Sequence[Optional[dict[str, Any]]], key: str) -> list[float]:
    """``top[i][key] / bottom[i][key]`` for every round where both ran."""
    return [a[key] / b[key] for a, b in zip(top, bottom) if a and b and b[key]]


def interleaved(cases: dict[str, Callable[[int], Any]], rounds: int,
                errors: Optional[dict[str, str]] = None) -> dict[str, list[Any]]:
    """Run every case once per round, in order, ``rounds`` times: its results by case,
    one per round. With ``errors``, a failed run is recorded there (and as None) and the
    others go on; without, it raises."""
    runs: dict[str, list[Any]] = {name: [] for name in cases}
    for r in range(rounds):
        for name, case in cases.items():
            progress(f"{name} (round {r + 1}/{rounds}) ...")
            try:
                runs[name].append(case(r))
            except Exception as exc:
                if errors is None:
                    raise
                errors[name if rounds == 1 else f"{name}/{r + 1}"] = \
                    f"{type(exc).__name__}: {exc}"
                progress(f"{name}: FAILED: {type(exc).__name__}: {str(exc).strip()[-2000:]}")
                runs[name].append(None)
    return runs


# ---------------------------------------------------------------------------
# loopback

def free_udp_port() -> int:
    """A UDP port nobody has bound (checked without SO_REUSE*), never ZRE's 5670."""
    for _ in range(200):
        port = random.randint(20000, 60000)
        if port == 5670:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free UDP port found")


def free_tcp_endpoint() -> str:
    """``tcp://127.0.0.1:PORT`` with a port free right now."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return f"tcp://{LOOPBACK}:{s.getsockname()[1]}"


# ---------------------------------------------------------------------------
# CPU and memory

_TICK = os.sysconf("SC_CLK_TCK")


def cpu() -> float:
    """CPU seconds (user + system) of this process so far, all threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rss_mb() -> float:
    """Resident memory of this process (VmRSS), MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def threads_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of the threads of ``pid`` by kind: ``main``, ``zmq`` (libzmq's I/O
    threads) and ``other``; nanoseconds on the CPU from schedstat (stat's ticks where
    the kernel has none). All zero once the process is gone."""
    out = {"main": 0.0, "zmq": 0.0, "other": 0.0}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        task = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{task}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        name = head.split("(", 1)[1]
        kind = "main" if tid == str(pid) else "zmq" if name.startswith("ZMQbg") else "other"
        try:
            with open(f"{task}/schedstat") as f:
                out[kind] += int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            fields = rest.split()
            out[kind] += (int(fields[11]) + int(fields[12])) / _TICK
    return out


def proc_cpu(pid: int) -> float:
    """CPU seconds process ``pid`` has used so far (its live threads); 0 if it is gone."""
    return sum(threads_cpu(pid).values())


def machine_cpu() -> float:
    """CPU seconds every core of the machine has been busy so far (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / _TICK   # all but idle and iowait


def busy_pct(seconds: float) -> float:
    """How busy the machine is over the next ``seconds``, in % of one core."""
    before, start = machine_cpu(), time.perf_counter()
    time.sleep(seconds)
    return 100 * (machine_cpu() - before) / (time.perf_counter() - start)


# ---------------------------------------------------------------------------
# peermesh internals the benchmarks look at: only here

def c_extension(code: str = REPO) -> str:
    """Whether peermesh's C extension (batched ZeroMQ I/O) loads: "yes" or "no: why"."""
    out = subprocess.run(
        [sys.executable, "-c", "from peermesh.io import zmqbatch as z; "
         "print('yes' if z.native else 'no: ' + z.why_not)"],
        capture_output=True, text=True, timeout=60, env=_code_env(code))
    return out.stdout.strip() or f"unknown: {out.stderr.strip()[-200:]}"


def socket_driver(endpoint: str, bind: bool, handler: Callable[[list[bytes]], None]) -> Any:
    """peermesh's one driver (``peermesh.io.driver``) on a socket of its transport: a
    mailbox (ROUTER) bound at ``endpoint`` or a link (DEALER) to it; ``handler(frames)``
    for every message received (a mailbox's with the sender's identity first). The result
    has ``send(frames)`` (held while a batch is handled, as a core's outputs are) and
    ``close()``."""
    from peermesh.core import Send
    from peermesh.io.driver import Driver
    from peermesh.io.transport import ZmqTransport

    peer = ("peer",)

    class Relay:
        """A core handing each message to ``handler``; what it sends meanwhile is held."""

        def __init__(self) -> None:
            self.held: Optional[list[Any]] = None
            self.driver = Driver(self, ZmqTransport(), max_message=1 << 26, name="floor")

        def receive(self, link: Any, frames: list[bytes], now: float) -> list[Any]:
            if type(link) is bytes:
                frames.insert(0, link)
            self.held = []
            try:
                handler(frames)
                return self.held
            finally:
                self.held = None

        def handle_timer(self, now: float) -> list[Any]:
            return []

        def next_deadline(self) -> Optional[float]:
            return None

        def send(self, frames: list[bytes]) -> None:
            out = Send(frames[0], frames[1:]) if bind else Send(peer, frames)
            if self.held is not None:
                self.held.append(out)
            else:
                self.driver.apply((out,))

        def close(self) -> None:
            self.driver.close()

    relay = Relay()
    if bind:
        relay.driver.listen(relay.driver.transport.bind_mailbox(LOOPBACK, 1 << 26, endpoint))
    else:
        relay.driver.dial(peer, endpoint, b"floor-" + os.urandom(6))
    return relay


# ---------------------------------------------------------------------------
# child processes: the parent's side

class ChildFailed(RuntimeError):
    """A child reported an error, died, or did not answer in time."""


def _code_env(code: str) -> dict[str, str]:
    """Our environment, with peermesh from ``code`` and the scripts from here."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([code, HERE])
    env[CODE_ENV] = code
    return env


try:
    _prctl: Optional[Callable[..., int]] = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):   # not Linux: children end by Children alone
    _prctl = None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the forked child: Ctrl-C ignored (the parent ends its children) and SIGKILL
    when the parent ends (looked up before the fork: nothing is loaded after it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Child:
    """One child process; JSON lines to and from a harness role (see ``Parent``)."""

    def __init__(self, argv: list[str], env: dict[str, str], name: str,
                 **popen: Any) -> None:
        self.name = name
        popen.setdefault("stdin", subprocess.PIPE)
        popen.setdefault("stdout", subprocess.PIPE)
        # A process group of its own, so that ending it ends what it started too (Spark's
        # JVM, for one); not a session of its own: with autogroup scheduling that would
        # give each child a CPU share of its own, and change what the benchmarks measure.
        self.process = subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent,
                                        process_group=0, **popen)
        self.pid = self.process.pid
        self._buffer = b""

    def send(self, message: Any) -> None:
        """One command to the child (a lost child is noticed at the next ``expect``)."""
        if self.process.stdin is None:
            return
        try:
            self.process.stdin.write(json.dumps(message).encode() + b"\n")
            self.process.stdin.flush()
        except (OSError, ValueError):
            pass

    def expect(self, tag: str, timeout: float) -> Any:
        """The value of the child's next message tagged ``tag`` (others are skipped);
        ChildFailed if it reports an error, dies or is silent for ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.readline(deadline - time.monotonic())
            if line is None:
                state = "still running" if self.process.poll() is None else "exited"
                raise ChildFailed(f"{self.name}: no {tag!r} within {timeout:.0f} s ({state})")
            if not line:
                raise ChildFailed(f"{self.name} died (exit code {self.process.wait(5)})")
            got, value = json.loads(line)
            if got == "error":
                raise ChildFailed(f"{self.name} failed:\n{value}")
            if got == tag:
                return value

    def ask(self, timeout: float = 600, **command: Any) -> Any:
        """Send ``command`` and return the child's answer."""
        self.send(command)
        return self.expect("answer", timeout)

    def readline(self, timeout: float, stream: Any = None) -> Optional[bytes]:
        """The next line of the child's stdout (or ``stream``): b"" at its end, None if
        none came within ``timeout``."""
        stream = stream or self.process.stdout
        fd = stream.fileno()
        deadline = time.monotonic() + max(0.0, timeout)
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                rest, self._buffer = self._buffer, b""
                return rest
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line + b"\n"

    def end(self, grace: float, term_wait: float = 3.0) -> None:
        """Close its stdin, give it and what it started ``grace`` seconds, then SIGTERM and
        ``term_wait`` seconds, then SIGKILL."""
        p = self.process
        for stream in (p.stdin, p.stdout, p.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        end_group(p, grace, term_wait)


class Children:
    """Every child process of a test; all of them ended when the ``with`` block is left,
    by an error or Ctrl-C too. ``grace``: how long each may take to exit by itself
    after its stdin closes; ``term_wait``: after SIGTERM, before SIGKILL."""

    def __init__(self, grace: float = 0.5, term_wait: float = 3.0) -> None:
        self.grace = grace
        self.term_wait = term_wait
        self.children: list[Child] = []

    def start(self, module: str, role: str, code: Optional[str] = None, /,
              **kwargs: Any) -> Child:
        """``role_<role>(parent, **kwargs)`` of ``scripts/<module>.py`` in a new process
        that imports peermesh from ``code`` (default: the code this process runs)."""
        code = code or os.environ.get(CODE_ENV, REPO)
        argv = [sys.executable, os.path.join(HERE, "harness.py"), module, role,
                json.dumps(kwargs)]
        return self.add(Child(argv, _code_env(code), f"{module}:{role}"))

    def popen(self, argv: list[str], env: Optional[dict[str, str]] = None,
              **popen: Any) -> Child:
        """Any other process, ended with the rest."""
        return self.add(Child(argv, env or dict(os.environ), os.path.basename(argv[0]),
                              **popen))

    def add(self, child: Child) -> Child:
        self.children.append(child)
        return child

    def close(self) -> None:
        """End every child: all are told to stop first, so they exit side by side."""
        for child in self.children:
            child.send("stop")
        deadline = time.monotonic() + self.grace
        for child in self.children:
            child.end(max(0.0, deadline - time.monotonic()), self.term_wait)

    def __enter__(self) -> "Children":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------
# child processes: the child's side

class Parent:
    """A role's line to the process that started it: ``send`` messages, ``recv``
    commands. ``green=True`` waits let the gevent hub run meanwhile."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)          # a stray print must not corrupt the messages
        self._buffer = b""

    def send(self, tag: str, value: Any = None) -> None:
        self._out.write(json.dumps([tag, value]) + "\n")
        self._out.flush()

    def recv(self, timeout: Optional[float], green: bool = False) -> Any:
        """The next command; EOFError once the parent has closed our stdin."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if green:
                import gevent.socket
                try:
                    gevent.socket.wait_read(0, timeout=left)
                    ready = True
                except TimeoutError:
                    ready = False
            else:
                ready = bool(select.select([0], [], [], left)[0])
            if not ready:
                raise TimeoutError(f"no command from the parent within {timeout} s")
            chunk = os.read(0, 65536)
            if not chunk:
                raise EOFError("the parent closed the line")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def expect(self, what: str, timeout: float, green: bool = False) -> None:
        """Wait for the command ``what``."""
        got = self.recv(timeout, green)
        if got != what:
            raise RuntimeError(f"expected {what!r} from the parent, got {got!r}")

    def commands(self, green: bool = False) -> Iterator[Any]:
        """Every command until ``"stop"`` or the parent hangs up (``green``: the hub
        serves while we wait)."""
        while True:
            try:
                command = self.recv(None, green)
            except EOFError:
                return
            if command == "stop":
                return
            yield command

    def serve(self, answer: Callable[[dict[str, Any]], Any], green: bool = False) -> None:
        """Answer every command with ``answer(command)`` until the parent hangs up."""
        for command in self.commands(green):
            self.send("answer", answer(command))


def _check_code() -> None:
    """Fail unless ``import peermesh`` would load it from the tree we were given."""
    code = os.environ.get(CODE_ENV)
    spec = importlib.util.find_spec("peermesh")
    if code and spec is not None and spec.origin:
        found = os.path.dirname(os.path.dirname(os.path.realpath(spec.origin)))
        if found != os.path.realpath(code):
            raise RuntimeError(f"peermesh would come from {found}, not {code}")


def child_main(module: str, role: str, kwargs: dict[str, Any]) -> None:
    """Run one role; its result (or the error) goes to the parent, then the process ends
    at once (pyre's non-daemon threads would keep it alive)."""
    parent = Parent()
    try:
        _check_code()
        fn = getattr(importlib.import_module(module), f"role_{role}")
        profile = kwargs.pop("_profile", None)
        if profile:
            import cProfile
            prof = cProfile.Profile()
            try:
                result = prof.runcall(fn, parent, **kwargs)
            finally:
                prof.dump_stats(profile)
        else:
            result = fn(parent, **kwargs)
        parent.send("result", result)
    except BaseException:
        try:
            parent.send("error", traceback.format_exc())
        except Exception:
            pass
    finally:
        sys.stderr.flush()
        os._exit(0)


# ---------------------------------------------------------------------------
# an older commit, side by side

def _built(tree: str) -> bool:
    return any(name.startswith("_zmqbatch") and name.endswith(".so")
               for name in os.listdir(os.path.join(tree, "peermesh", "io"))) \
        if os.path.isdir(os.path.join(tree, "peermesh", "io")) else True


def baseline_tree(rev: str) -> str:
    """A tree holding the ``peermesh`` of ``rev``: a directory that has one (used as it
    is), or a git revision of this repository, exported (``git archive``) to
    ``$TMPDIR/peermesh-bench-<commit>`` with its C extension built, and kept there for
    the next run."""
    if os.path.isdir(os.path.join(rev, "peermesh")):
        return os.path.abspath(rev)
    out = subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", "--quiet",
                          f"{rev}^{{commit}}"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise SystemExit(f"--baseline {rev}: neither a directory holding peermesh/ nor a "
                         "commit of this repository")
    commit = out.stdout.strip()
    tree = os.path.join(tempfile.gettempdir(), f"peermesh-bench-{commit[:12]}")
    if os.path.isdir(tree):
        return tree
    staging = tempfile.mkdtemp(prefix="peermesh-bench-")
    try:
        progress(f"baseline: exporting {commit[:12]} and building its C extension ...")
        archive = subprocess.Popen(["git", "-C", REPO, "archive", commit],
                                   stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", staging], stdin=archive.stdout, check=True,
                       timeout=120)
        if archive.wait(60) != 0:
            raise SystemExit(f"git archive {commit} failed")
        build = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"],
                               cwd=staging, capture_output=True, text=True, timeout=600)
        if build.returncode != 0 or not _built(staging):
            progress(f"baseline: its C extension did not build; it runs on pyzmq alone\n"
                     f"{build.stderr.strip()[-1000:]}")
        os.rename(staging, tree)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tree


def trees(baseline: Optional[str]) -> dict[str, str]:
    """The code to measure by label: "peermesh" (this checkout) and, with ``baseline``,
    "baseline" (see ``baseline_tree``)."""
    out = {"peermesh": REPO}
    if baseline:
        out["baseline"] = baseline_tree(baseline)
        progress(f"baseline: peermesh from {out['baseline']}")
    return out


def dump_json(results: Any) -> str:
    return json.dumps(results, indent=2, default=str)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run(main: Callable[[], int]) -> None:
    """Exit with ``main()``'s status; on Ctrl-C or SIGTERM, with 130 once every child
    has ended."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    child_main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
