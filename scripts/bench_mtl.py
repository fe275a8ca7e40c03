#!/usr/bin/env python3
"""The MTL gateway: content rate through it, confirmed-content rate, the control flow.

    python scripts/bench_mtl.py                  # all three, 3 rounds (~1 min)
    python scripts/bench_mtl.py --messages 50000 --logins 500 --rounds 5
    python scripts/bench_mtl.py --standby        # confirm full copied to a standby gateway
    python scripts/bench_mtl.py --baseline main  # the mesh case with main's code too
    python scripts/bench_mtl.py --writer pyzmq   # the mesh case's writer on plain pyzmq

Processes, all on loopback: a gateway (a gevent ``Node`` with a
``Gateway``, ``run="always"``, its store in a temporary directory), a ZRE
peer that joined the group, and clients off the LAN: the mesh case's writer
is ``peermesh.mtl.Client`` (``--writer pyzmq``: a plain pyzmq DEALER sending
each Content with ``send_multipart``), the others speak 11/MTL with plain
pyzmq (REQ for control, DEALER for data, as any client would).

* **mesh**: one writer (``confirm: none``) sends 100-byte contents to the
  mesh profile's group; the gateway shouts them; the ZRE peer counts them.
  Rate: contents / (last one counted - first one sent). The ceiling, in the
  same rounds: raw pyzmq DEALER -> ROUTER one way between two processes.
  Target: mesh / raw >= 0.5. Three processes share the machine's cores
  against raw's two, so the CPU each spends per content (its Python thread
  and libzmq's I/O threads, from schedstat) is reported for every process
  of both cases. ``--baseline REV`` runs a second gateway, peer and writer
  with the code of commit REV (or a directory holding ``peermesh/``), on a
  mesh of their own, in the same rounds (see scripts/README.md).
* **full**: one writer with ``confirm: full`` sends 100-byte contents and
  waits for the Confirm covering the last one. The gateway appends each to
  its SQLite store and commits once per batch it drained from its socket
  (up to 256 commands), and only then confirms (``multiple``) up to the
  highest sequence of the batch: the commit policy. Target: >= 20,000 msg/s.
* **control**: clients log in over and over: ``Connection.Open``, SCRAM-SHA-256
  (client-first, client-final: two Authorize rounds), ``Connection.Profile``,
  ``Connection.Reader``. The verifier's iteration count is 4096 (RFC 7677's
  minimum and ``peermesh mtl user add``'s default); the PBKDF2 over it is
  the client's work, the gateway only computes HMACs. Reported: p50 of one
  login alone (one client), and logins per second with two clients at once.
  Target: >= 500/s.

Rates are the median round; ratios the median of per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any, Callable, Optional, Sequence

import harness

BODY = b"x" * 100
GROUP = "bench"          # the group the peer reads
DURABLE = "bench-full"   # the confirm-full writer's group (nobody reads it: it is stored)
WAIT = 60.0
USER, PASSWORD = "bench", "bench-password"


# --- children -------------------------------------------------------------------------

def role_gateway(parent: harness.Parent, port: int, directory: str, name: str = "gateway",
                 run: str = "always", broker: str = "auto") -> None:
    """A node with a gateway; answers with the ZRE peers in the group, or (``replicas``)
    whether it serves and how many replicas it has, until stopped."""
    from peermesh import Node
    from peermesh.mtl import CredentialsFile, Gateway, make_user
    credentials = CredentialsFile(os.path.join(directory, "creds.json"))
    credentials.update(lambda users: users.__setitem__(
        USER, make_user(USER, PASSWORD, read=["*"], write=["*"])))
    node = Node(name, interface=harness.INTERFACE, port=port, interval=0.1)
    gateway = Gateway(credentials, run=run, broker=broker, settle=0.3,
                      data_dir=os.path.join(directory, name), heartbeat=5.0)
    gateway.attach(node)
    node.start()
    gateway.start()
    try:
        parent.send("ready", gateway.control_endpoint)
        parent.serve(lambda command: [gateway.active, len(gateway.replicas)]
                     if command.get("replicas") else len(node.peers_by_group(GROUP)),
                     green=True)
    finally:
        gateway.stop()
        node.stop(0.5)


def role_peer(parent: harness.Parent, port: int) -> None:
    """A ZRE peer in GROUP: per command ``{"expect": n}``, count n shouts and report when
    the last came (the system-wide monotonic clock)."""
    from peermesh import EventType, Node
    node = Node("peer", interface=harness.INTERFACE, port=port, interval=0.1).start()
    node.join(GROUP)
    try:
        parent.send("ready")

        def count(command: dict[str, Any]) -> Any:
            got = 0
            while got < command["expect"]:
                event = node.recv(WAIT)
                if event is None:
                    break
                if event.type is EventType.SHOUT and event.group == GROUP:
                    got += 1
            return [got, time.monotonic()]

        parent.serve(count, green=True)
    finally:
        node.stop(0.5)


class _Client:
    """A plain pyzmq MTL client (blocking sockets)."""

    def __init__(self, control: str) -> None:
        import zmq
        self.zmq = zmq
        self.context = zmq.Context()
        self.control = control
        self.req = self._socket(zmq.REQ)
        self.req.connect(control)

    def _socket(self, kind: int) -> Any:
        sock = self.context.socket(kind)
        sock.setsockopt(self.zmq.LINGER, 0)
        sock.setsockopt(self.zmq.RCVTIMEO, int(WAIT * 1000))
        return sock

    def ask(self, request: Any) -> Any:
        from peermesh.wire import mtl
        self.req.send_multipart(mtl.encode_request(request))
        return mtl.decode_reply(self.req.recv_multipart())

    def login(self, direction: Any, confirm: str = "none", group: str = GROUP) -> Any:
        import scramp
        from peermesh.wire import mtl
        self.ask(mtl.Open("/"))
        scram = scramp.ScramClient(["SCRAM-SHA-256"], USER, PASSWORD)
        first = self.ask(mtl.Authorize("SCRAM-SHA-256", scram.get_client_first().encode()))
        scram.set_server_first(first.challenge.decode())
        ready = self.ask(mtl.Authorize("SCRAM-SHA-256", scram.get_client_final().encode()))
        scram.set_server_final(ready.additional.decode())
        self.ask(mtl.SelectProfile("mesh"))
        lease = self.ask(mtl.LeaseRequest(direction, (group,), confirm))
        if not isinstance(lease, mtl.DataLease):
            raise RuntimeError(f"no lease: {lease}")
        return lease

    def data(self, lease: Any) -> Any:
        from peermesh.wire import mtl
        sock = self._socket(self.zmq.DEALER)
        sock.setsockopt(self.zmq.SNDHWM, 10_000)
        sock.connect(f"{self.control.rpartition(':')[0]}:{lease.port}")
        sock.send_multipart(mtl.encode_data(mtl.Lease(1, lease.lease)))
        if mtl.decode_data(sock.recv_multipart()) != mtl.Response(1, 200):
            raise RuntimeError("lease refused")
        return sock

    def close(self) -> None:
        self.context.destroy(0)


def role_writer(parent: harness.Parent, control: str, confirm: str, group: str,
                client: str = "pyzmq") -> None:
    """Per command ``{"n": n}``: send n contents to ``group``; report (first sent, all
    confirmed or sent). ``client``: "pyzmq" (plain pyzmq, ``send_multipart``) or "peermesh"
    (``peermesh.mtl.Client``, ``confirm: none`` only)."""
    if client == "peermesh":
        _peermesh_writer(parent, control, group)
        return
    from peermesh.wire import mtl
    client_ = _Client(control)
    lease = client_.login(mtl.Direction.WRITE, confirm, group)
    sock = client_.data(lease)
    resource = bytes((len(group),)) + group.encode()
    sequence = 0

    def write(command: dict[str, Any]) -> Any:
        nonlocal sequence
        send = sock.send_multipart
        started = time.monotonic()
        for _ in range(command["n"]):
            sequence += 1
            send(mtl.content_frames(sequence, resource, BODY))
        if confirm == "full":
            while True:
                answer = mtl.decode_data(sock.recv_multipart())
                if isinstance(answer, mtl.Reject):
                    raise RuntimeError(f"content rejected: {answer}")
                if isinstance(answer, mtl.Confirm) and answer.sequence >= sequence:
                    break
                if isinstance(answer, mtl.Ping):
                    sock.send_multipart(mtl.encode_data(mtl.Pong()))
        return [started, time.monotonic()]

    try:
        parent.send("ready")
        parent.serve(write)
    finally:
        client_.close()


def _peermesh_writer(parent: harness.Parent, control: str, group: str) -> None:
    """``role_writer`` with ``peermesh.mtl.Client``: a lease on ``group``, ``send``."""
    from peermesh.mtl import Client
    with Client(control, USER, PASSWORD, timeout=WAIT) as client:
        writer = client.writer([group])

        def write(command: dict[str, Any]) -> Any:
            send = writer.send
            started = time.monotonic()
            for _ in range(command["n"]):
                send(BODY)
            return [started, time.monotonic()]

        parent.send("ready")
        parent.serve(write)


def role_login(parent: harness.Parent, control: str) -> None:
    """Per command ``{"n": n}``: log in n times; report each login's seconds."""
    from peermesh.wire import mtl
    client = _Client(control)
    try:
        parent.send("ready")

        def logins(command: dict[str, Any]) -> Any:
            times = []
            for _ in range(command["n"]):
                started = time.perf_counter()
                client.login(mtl.Direction.READ)
                times.append(time.perf_counter() - started)
            return times

        parent.serve(logins)
    finally:
        client.close()


def role_raw_sink(parent: harness.Parent) -> None:
    """A raw pyzmq ROUTER: per command ``{"expect": n}``, the time the n-th came."""
    import zmq
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port(f"tcp://{harness.LOOPBACK}")
    try:
        parent.send("ready", f"tcp://{harness.LOOPBACK}:{port}")

        def count(command: dict[str, Any]) -> Any:
            for _ in range(command["expect"]):
                sock.recv_multipart()
            return time.monotonic()

        parent.serve(count)
    finally:
        context.destroy(0)


def role_raw_source(parent: harness.Parent, endpoint: str) -> None:
    """A raw pyzmq DEALER: per command ``{"n": n}``, send n 100-byte messages."""
    import zmq
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 10_000)
    sock.connect(endpoint)
    try:
        parent.send("ready")

        def send(command: dict[str, Any]) -> Any:
            started = time.monotonic()
            for _ in range(command["n"]):
                sock.send(BODY)
            return started

        parent.serve(send)
    finally:
        context.destroy(0)


# --- the parent -------------------------------------------------------------------------

def _mesh_setup(children: harness.Children, code: str, directory: str, standby: bool,
                mode: dict[str, Any], extra: dict[str, Any], client: str) -> dict[str, Any]:
    """A gateway (and with ``standby`` a standby gateway), a ZRE peer in GROUP and a
    ``confirm: none`` writer, all importing peermesh from ``code``, on a mesh (a beacon
    port) of their own: their processes by role, and the gateway's control endpoint."""
    os.makedirs(directory)
    port = harness.free_udp_port()
    gateway = children.start("bench_mtl", "gateway", code, port=port, directory=directory,
                             **mode, **extra)
    control = gateway.expect("ready", WAIT)
    if standby:
        second = children.start("bench_mtl", "gateway", code, port=port, directory=directory,
                                name="standby", run="elected")
        second.expect("ready", WAIT)
        deadline = time.monotonic() + WAIT
        while gateway.ask(replicas=True) != [True, 1]:
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not become a replica")
            time.sleep(0.05)
    peer = children.start("bench_mtl", "peer", code, port=port)
    peer.expect("ready", WAIT)
    deadline = time.monotonic() + WAIT
    while not gateway.ask(members=True) and time.monotonic() < deadline:
        time.sleep(0.05)
    writer = children.start("bench_mtl", "writer", code, control=control, confirm="none",
                            group=GROUP, client=client)
    writer.expect("ready", WAIT)
    return {"gateway": gateway, "control": control, "peer": peer, "writer": writer}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="per case and round")
    parser.add_argument("--logins", type=int, default=200, help="per client and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="one JSON object, no table")
    parser.add_argument("--profile", metavar="PATH", help="cProfile the gateway into PATH")
    parser.add_argument("--standby", action="store_true",
                        help="also run a standby gateway: the serving one is elected and "
                             "confirms full content once the standby has a copy")
    parser.add_argument("--writer", choices=("peermesh", "pyzmq"), default="peermesh",
                        help="the confirm-none writer: peermesh.mtl.Client (default) or a "
                             "plain pyzmq client (send_multipart)")
    parser.add_argument("--baseline", metavar="REV",
                        help="also run the mesh case with the gateway, peer and writer of "
                             "an older commit (or a directory holding peermesh/), in the "
                             "same rounds (see scripts/README.md)")
    args = parser.parse_args(argv)
    n = args.messages
    code = harness.trees(args.baseline)
    directory = tempfile.mkdtemp(prefix="bench-mtl-")
    try:
        with harness.Children() as children:
            extra = {"_profile": os.path.abspath(args.profile)} if args.profile else {}
            mode = {"run": "elected", "broker": "always"} if args.standby else {}
            meshes = {tag: _mesh_setup(children, tree, os.path.join(directory, tag),
                                       args.standby, mode, extra if tag == "peermesh" else {},
                                       args.writer)
                      for tag, tree in code.items()}
            gateway, control = meshes["peermesh"]["gateway"], meshes["peermesh"]["control"]
            sink = children.start("bench_mtl", "raw_sink")
            source = children.start("bench_mtl", "raw_source", endpoint=sink.expect("ready",
                                                                                     WAIT))
            durable = children.start("bench_mtl", "writer", control=control, confirm="full",
                                     group=DURABLE)
            logins = [children.start("bench_mtl", "login", control=control) for _ in range(2)]
            for child in (source, durable, *logins):
                child.expect("ready", WAIT)
            cpu: dict[str, list[float]] = {}

            def measured(processes: dict[str, Any], work: Callable[[], float]) -> float:
                """``work()``'s rate, and the CPU per content of each process (its Python
                thread and libzmq's threads) recorded under ``cpu``."""
                before = {name: harness.threads_cpu(child.pid)
                          for name, child in processes.items()}
                rate = work()
                for name, child in processes.items():
                    after = harness.threads_cpu(child.pid)
                    for kind in ("main", "zmq"):
                        cpu.setdefault(f"{name}_{kind}", []).append(
                            (after[kind] - before[name][kind]) / n * 1e6)
                return rate

            def raw(_round: int) -> float:
                def work() -> float:
                    sink.send({"expect": n})
                    started = source.ask(n=n)
                    return n / (sink.expect("answer", WAIT) - started)
                return measured({"raw_source": source, "raw_sink": sink}, work)

            def mesh_case(tag: str) -> Callable[[int], float]:
                setup = meshes[tag]
                writer, peer = setup["writer"], setup["peer"]
                prefix = "" if tag == "peermesh" else "baseline_"

                def work() -> float:
                    peer.send({"expect": n})
                    started, _ = writer.ask(n=n)
                    got, last = peer.expect("answer", WAIT)
                    if got != n:
                        raise RuntimeError(f"the peer counted {got} of {n} shouts")
                    return n / (last - started)
                return lambda _round: measured(
                    {f"{prefix}writer": writer, f"{prefix}gateway": setup["gateway"],
                     f"{prefix}peer": peer}, work)

            mesh = mesh_case("peermesh")

            def full(_round: int) -> float:
                started, confirmed = durable.ask(n=n)
                return n / (confirmed - started)

            def alone(_round: int) -> list[float]:
                return logins[0].ask(n=max(20, args.logins // 4))

            login_cpu: list[float] = []

            def together(_round: int) -> float:
                started, before = time.monotonic(), harness.proc_cpu(gateway.pid)
                for child in logins:
                    child.send({"n": args.logins})
                for child in logins:
                    child.expect("answer", WAIT * 5)
                login_cpu.append((harness.proc_cpu(gateway.pid) - before) / (2 * args.logins))
                return 2 * args.logins / (time.monotonic() - started)

            cases = {"raw": raw, "mesh": mesh}
            if "baseline" in meshes:
                cases["mesh_baseline"] = mesh_case("baseline")
            cases.update({"full": full, "alone": alone, "together": together})
            runs = harness.interleaved(cases, args.rounds)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    load = os.getloadavg()
    ratios = [m / r for m, r in zip(runs["mesh"], runs["raw"])]
    p50s = [statistics.median(times) * 1000 for times in runs["alone"]]
    results: dict[str, Any] = {
        "load_average": load, "messages": n, "writer": args.writer,
        "raw_msgs": runs["raw"], "mesh_msgs": runs["mesh"], "mesh_over_raw": ratios,
        "full_msgs": runs["full"], "login_p50_ms": p50s, "logins_per_s": runs["together"],
        "cpu_us_per_msg": cpu, "gateway_cpu_ms_per_login": [c * 1000 for c in login_cpu],
    }
    if "mesh_baseline" in runs:
        results["baseline"] = f"{args.baseline} ({code['baseline']})"
        results["baseline_mesh_msgs"] = runs["mesh_baseline"]
        results["baseline_mesh_over_raw"] = [m / r for m, r in zip(runs["mesh_baseline"],
                                                                    runs["raw"])]
        results["mesh_over_baseline"] = [m / b for m, b in zip(runs["mesh"],
                                                               runs["mesh_baseline"])]
    if args.json:
        print(harness.dump_json(results))
        return 0
    ratio = statistics.median(ratios)
    full_rate = statistics.median(runs["full"])
    logins_rate = statistics.median(runs["together"])

    def cpu_row(label: str, names: Sequence[str]) -> list[Any]:
        cells = []
        for name in names:
            main, zmq = (statistics.median(cpu[f"{name}_{kind}"]) for kind in ("main", "zmq"))
            cells.append(f"{main + zmq:.1f} ({main:.1f})")
        return [label, ", ".join(cells), "", ""]

    rows = [
        [f"writer ({args.writer}) -> gateway -> group -> peer, confirm none",
         statistics.median(runs["mesh"]),
         f"x{ratio:.2f} of raw", harness.verdict(ratio, 0.5, at_least=True)],
        cpu_row("  CPU per content (its Python thread), us: writer, gateway, peer",
                ("writer", "gateway", "peer")),
    ]
    if "mesh_baseline" in runs:
        rows += [
            ["  [baseline] the same", statistics.median(runs["mesh_baseline"]),
             f"x{statistics.median(results['baseline_mesh_over_raw']):.2f} of raw",
             f"now/base x{statistics.median(results['mesh_over_baseline']):.2f}"],
            cpu_row("  [baseline] CPU per content, us: writer, gateway, peer",
                    ("baseline_writer", "baseline_gateway", "baseline_peer")),
        ]
    rows += [
        ["raw pyzmq DEALER -> ROUTER one way", statistics.median(runs["raw"]), "", ""],
        cpu_row("  CPU per message (its Python thread), us: sender, receiver",
                ("raw_source", "raw_sink")),
        ["writer, confirm full (group commit per batch)", full_rate, "",
         harness.verdict(full_rate, 20_000, at_least=True)],
        ["Open+SCRAM+Profile+Reader, 2 clients (/s)", logins_rate, "",
         harness.verdict(logins_rate, 500, at_least=True)],
        ["  gateway CPU per login (ms); logins/s it allows",
         f"{statistics.median(login_cpu) * 1000:.2f}", f"{1 / statistics.median(login_cpu):,.0f}",
         ""],
        ["one login alone, p50 (ms)", statistics.median(p50s), "", ""],
    ]
    print(f"\nMTL gateway{' and a standby' if args.standby else ''}, 100-byte contents, "
          f"{n} per case, {args.rounds} rounds, median round; "
          f"load average {' '.join(f'{x:.2f}' for x in load)}")
    if "baseline" in results:
        print(f"baseline code: {results['baseline']}")
    print("\n".join(harness.table(["case", "msg/s", "ratio", "target"], rows)))
    return 0


if __name__ == "__main__":
    harness.run(main)
