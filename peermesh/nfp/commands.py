"""``peermesh job|worker|broker|file`` subcommands: NFP from the shell.

Registered through ``peermesh.cli.commands.COMMAND_MODULES`` and built only with the
``command(name, summary, description, examples, handler)`` factory, so each
command takes the node options plus an ACTION positional::

    peermesh job post SERVICE TASK [ARGS-JSON] [--target any|all|w1,w2] [--wait]
    peermesh job get UUID [--service S] [--wait [SECONDS]]
    peermesh job list [--json]
    peermesh job delete UUID
    peermesh worker [--service S] [--tasks MODULE] [--broker auto|always|never]
    peermesh broker run [--broker auto|always] | broker show workers|services|clients|broker
    peermesh file get nf://PATH DEST

Client commands wait about one and a half beacon intervals for the mesh to
be seen and the broker (if any) elected, act, and leave. Every command reads
the ``[nfp]`` table of ``--config`` (keys in ``NFP_KEYS``, documented in
deploy/peermesh.example.toml) for the NFP options it has; command-line
options win over the environment (``$PEERMESH_DATA_DIR``,
``$PEERMESH_NFP_ADMIN_TOKEN``), which wins over the file. ``job list`` only
reads the local store. ``worker`` and ``broker run`` serve until Ctrl-C /
SIGTERM and print one JSON line per notable event (``ready``, ``broker``) on
stdout.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import gevent

from ..argtypes import is_seconds, positive_count, seconds
from ..cli.output import EXIT_FAILURE, EXIT_OK, emit, note, table, to_json
from ..cli.session import Interrupted, NodeSession, leaving
from ..config import NodeConfig, read_tables
from ..wire import nfp as wire
from ..wire.nfp import Status
from .election import MODES
from .mesh import BrokerChanged, NfpNode, default_data_dir
from .store import JobStore, store_path
from .worker import Tasks

__all__ = ["add_commands", "fetch_file", "NFP_KEYS", "load_nfp_table"]

log = logging.getLogger(__name__)

PROG = "peermesh"
Handler = Callable[[argparse.Namespace, NodeConfig], int]


# --------------------------------------------------------------------------
# Options


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


#: keys of the ``[nfp]`` table of ``--config``: (what a value must be, check, default);
#: each is the option of the same name (``--data-dir`` is ``data_dir``) of the commands
#: that have it; a default of None means "see the option's help"
NFP_KEYS: dict[str, tuple[str, Callable[[Any], bool], Any]] = {
    "data_dir": ("a path", _text, None),
    "keepalive": ("a positive number of seconds", is_seconds, 1.0),
    "multiplier": ("an integer of at least 2", lambda v: _integer(v) and v >= 2, 3),
    "request_timeout": ("a positive number of seconds", is_seconds, 5.0),
    "queue_timeout": ("a positive number of seconds", is_seconds, 30.0),
    "broker": (f"one of {', '.join(MODES)}", lambda v: v in MODES, None),
    "priority": ("an integer", _integer, 0),
    "admin_token": ("a string", _text, None),
    "retention": ("a positive number of seconds", is_seconds, 7 * 86400.0),
    "inventory": ("a path", _text, None),
    "files_root": ("a path", _text, None),
    "service": ("a string", _text, "demo"),
    "tasks": ("a module name", _text, "peermesh.nfp.demo"),
    "worker_name": ("a string", _text, None),
}
#: options whose environment variable overrides the file (the command line overrides both)
_NFP_ENV = {"data_dir": "PEERMESH_DATA_DIR", "admin_token": "PEERMESH_NFP_ADMIN_TOKEN"}
#: keys only ``peermesh worker`` reads (``job --service`` is the job's service, not this)
_WORKER_ONLY = frozenset(("service", "tasks", "worker_name"))


def load_nfp_table(path: Optional[os.PathLike[str] | str]) -> dict[str, Any]:
    """The checked ``[nfp]`` table of TOML file ``path`` ({} if none); ValueError if wrong."""
    if path is None:
        return {}
    table = read_tables(path).get("nfp", {})
    unknown = set(table) - set(NFP_KEYS)
    if unknown:
        raise ValueError(f"config file {path}: [nfp] has unknown key(s) "
                         f"{', '.join(sorted(unknown))}")
    for key, value in table.items():
        what, check, _ = NFP_KEYS[key]
        if not check(value):
            raise ValueError(f"config file {path}: [nfp] {key} must be {what}, not {value!r}")
    return dict(table)


def _resolve_nfp_options(args: argparse.Namespace, worker: bool = False) -> None:
    """Fill the NFP options not given on the command line: environment, [nfp], defaults."""
    table = load_nfp_table(getattr(args, "config", None))
    for key, (_, _, default) in NFP_KEYS.items():
        if not hasattr(args, key) or getattr(args, key) is not None \
                or (key in _WORKER_ONLY and not worker):
            continue                                   # not this command's, or given
        env = _NFP_ENV.get(key)
        if env is not None and os.environ.get(env):
            if key == "admin_token":
                setattr(args, key, os.environ[env])
            continue                                   # data_dir: default_data_dir() reads it
        setattr(args, key, table.get(key, default))
    for key, option in (("inventory", "--inventory"), ("files_root", "--files-root")):
        where = getattr(args, key, None)
        if where is not None and not Path(where).is_dir():
            raise ValueError(f"{option} {where}: not a directory")


def _nfp_options(parser: argparse.ArgumentParser, client: bool = True,
                 serve: bool = False) -> None:
    group = parser.add_argument_group("NFP options (also [nfp] in --config)")
    group.add_argument("--data-dir", metavar="DIR",
                       help="where the node's SQLite job store lives (default: "
                            "$PEERMESH_DATA_DIR, else ~/.local/share/peermesh)")
    group.add_argument("--keepalive", type=seconds, metavar="SECONDS",
                       help="NFP heartbeat interval between broker and workers "
                            "(default: 1.0)")
    group.add_argument("--multiplier", type=int, metavar="N",
                       help="a peer silent for keepalive x N is disconnected (default: 3)")
    group.add_argument("--request-timeout", type=seconds, metavar="SECONDS",
                       help="longest wait for a worker's or broker's answer (default: 5.0)")
    group.add_argument("--queue-timeout", type=seconds, metavar="SECONDS",
                       help="how long a POST waits for a worker of its service to appear "
                            "(default: 30.0)")
    if client:
        group.add_argument("--store", default="cli", metavar="NAME",
                           help="client store: DATA_DIR/nfp-NAME.sqlite3 records the jobs "
                                "posted (default: %(default)s)")
        group.add_argument("--timeout", type=seconds, default=60.0, metavar="SECONDS",
                           help="longest wait for the answer (default: %(default)s)")
    if serve:
        group.add_argument("--broker", choices=MODES, default=None,
                           help="broker candidacy: never; auto (elected by priority, then "
                                "UUID); always (outranks every auto candidate) (default: never "
                                "for worker, auto for broker run)")
        group.add_argument("--priority", type=int,
                           help="broker election priority, higher wins (default: 0)")
        group.add_argument("--admin-token", metavar="TOKEN",
                           help="secret that authorises MMI disconnect/restart/shutdown "
                                "(default: $PEERMESH_NFP_ADMIN_TOKEN, then admin_token in "
                                "[nfp]; none: always refused)")
        group.add_argument("--retention", type=seconds, metavar="SECONDS",
                           help="finished jobs are purged after this long (default: 7 days)")
        group.add_argument("--inventory", metavar="DIR",
                           help="SID: directory of <worker>.yaml/.yml/.json inventory files")
        group.add_argument("--files-root", metavar="DIR",
                           help="FSS: directory served as nf:// URLs (nothing outside it)")


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``job``, ``worker``, ``broker`` and ``file`` to the ``peermesh`` parser."""
    job = command(
        "job", "post NFP jobs, fetch their results, list and cancel them",
        "Jobs for services run by NFP workers on the mesh. ACTION is one of: "
        "'post SERVICE TASK [ARGS-JSON]' sends a job (ARGS-JSON: a JSON list of arguments, an "
        "object of keyword arguments, or one value) and prints the reply: 202 with the "
        "workers that accepted it, or with --wait the result; 'get UUID' fetches each "
        "worker's status and result (200 done, 300 pending, 400 unknown); 'list' shows the "
        "jobs posted from here (no network); 'delete UUID' cancels a pending or running job "
        "and forgets a finished one. UUID may be a unique prefix of a job posted from here. "
        "With a broker on the mesh requests go through it, otherwise straight to the workers.",
        f"  {PROG} job post maths add '[1, 2]' --target any --wait -i lo\n"
        f"  {PROG} job post demo sleep '{{\"seconds\": 5}}' -t w1,w2 -i lo\n"
        f"  {PROG} job get 3f2a9c --wait 10 -i lo\n"
        f"  {PROG} job list\n"
        f"  {PROG} job delete 3f2a9c -i lo",
        _cmd_job)
    job.add_argument("action", choices=("post", "get", "list", "delete"), metavar="ACTION",
                     help="post, get, list or delete")
    job.add_argument("params", nargs="*", metavar="ARG",
                     help="post: SERVICE TASK [ARGS-JSON]; get/delete: UUID")
    job.add_argument("--target", "-t", default=None,
                     help="post: all (default), any (the least loaded worker) or w1,w2,...; "
                          "get/delete: workers to ask (default: those that accepted the job)")
    job.add_argument("--wait", "-W", nargs="?", type=seconds, const=-1.0, default=None,
                     metavar="SECONDS",
                     help="post: wait for the result; get: let workers hold the answer until "
                          "the job finishes (SECONDS, default: up to --timeout)")
    job.add_argument("--service", "-s", help="get/delete: the job's service (for jobs posted "
                                             "from elsewhere)")
    job.add_argument("--job-timeout", type=seconds, metavar="SECONDS",
                     help="post: workers stop the job after this long")
    job.add_argument("--json", action="store_true", help="list: one JSON list")
    job.add_argument("--limit", type=positive_count, default=50,
                     help="list: at most this many (default: 50)")
    _nfp_options(job)

    worker = command(
        "worker", "run an NFP worker (demo tasks, or tasks from a module)",
        "Run a node with one NFP worker serving --service until Ctrl-C or SIGTERM. Tasks come "
        "from --tasks MODULE (its 'tasks': a peermesh.nfp.Tasks or a dict of functions "
        "fn(job, *args, **kwargs)); the default is peermesh.nfp.demo (echo, add, sleep, "
        "progress, fail, whoami). Give the node a --name: its job store is named after it, "
        "so a restarted worker finds its jobs. --broker auto also makes the node a broker "
        "candidate. Prints JSON lines: 'ready', then 'broker' when the broker changes.",
        f"  {PROG} worker --name w1 --service demo -i lo\n"
        f"  {PROG} worker --name w2 --service nornir --tasks mytasks --broker auto",
        _cmd_worker)
    worker.add_argument("--service", "-s",
                        help="the service this worker serves (default: demo)")
    worker.add_argument("--worker-name", metavar="NAME",
                        help="worker name, unique on the mesh (default: the node's name)")
    worker.add_argument("--tasks", metavar="MODULE",
                        help="module whose 'tasks' to serve (default: peermesh.nfp.demo)")
    _nfp_options(worker, client=False, serve=True)

    broker = command(
        "broker", "run a broker candidate, or show what the broker knows",
        "ACTION 'run' starts a node that is a broker candidate (--broker auto, the default, "
        "or always) and serves as broker while elected, until Ctrl-C or SIGTERM (JSON lines "
        "as for 'worker'). 'show workers|services|clients|broker' asks the elected broker's "
        "mmi.service.broker and prints the answer as JSON.",
        f"  {PROG} broker run --broker always --name b1 -i lo --files-root /srv/files\n"
        f"  {PROG} broker show workers -i lo",
        _cmd_broker)
    broker.add_argument("action", choices=("run", "show"), metavar="ACTION", help="run or show")
    broker.add_argument("what", nargs="?", choices=("workers", "services", "clients", "broker"),
                        help="show: what to show")
    _nfp_options(broker, client=True, serve=True)

    file = command(
        "file", "fetch a file from the broker's file service",
        "'get nf://PATH DEST' fetches the file from fss.service.broker in chunks, checks "
        "every chunk's and the whole file's SHA-256, and writes it to DEST (a file, or a "
        "directory to put it in). Paths outside the broker's files root are refused.",
        f"  {PROG} file get nf://configs/r1.txt ./r1.txt -i lo",
        _cmd_file)
    file.add_argument("action", choices=("get",), metavar="ACTION", help="get")
    file.add_argument("url", metavar="nf://PATH")
    file.add_argument("dest", metavar="DEST")
    _nfp_options(file)


# --------------------------------------------------------------------------
# Running a node with NFP


def _nfp_node(session: NodeSession, args: argparse.Namespace, *, broker: str = "never",
              store_name: Optional[str] = None) -> NfpNode:
    try:
        return NfpNode(session.node, data_dir=args.data_dir, broker=broker,
                       priority=getattr(args, "priority", 0), keepalive=args.keepalive,
                       multiplier=args.multiplier, queue_timeout=args.queue_timeout,
                       request_timeout=args.request_timeout,
                       retention=getattr(args, "retention", 7 * 86400.0),
                       admin_token=getattr(args, "admin_token", None),
                       inventory_dir=getattr(args, "inventory", None),
                       files_root=getattr(args, "files_root", None), store_name=store_name,
                       on_shutdown=lambda: gevent.spawn(session.stop))
    except OSError as exc:
        raise RuntimeError(f"cannot open the job store: {exc}") from exc


class _Client:
    """A short-lived node with an NFP client, for one command."""

    def __init__(self, args: argparse.Namespace, config: NodeConfig) -> None:
        self.session = NodeSession(config)
        self.nfp = _nfp_node(self.session, args, store_name=args.store)

    def __enter__(self) -> "_Client":
        self.session.start()
        self.nfp.start()
        # drain node events so a long wait never fills the application queue
        self._drain = gevent.spawn(lambda: [None for _ in self.session.node.events()])
        self.nfp.settled.wait(self.session.node.config.interval * 1.5 + 2.0)
        return self

    def __exit__(self, *exc: object) -> None:
        self._drain.kill(block=False)
        try:
            self.nfp.stop()
        finally:
            self.session.close()


def _print_json(obj: Any) -> None:
    emit(to_json(obj, indent=2))


def _reply_json(reply: Any) -> dict[str, Any]:
    return {"status": int(reply.status), **({"text": reply.text} if reply.text else {}),
            **reply.body}


def _parse_arguments(text: Optional[str]) -> tuple[list[Any], dict[str, Any]]:
    if text is None:
        return [], {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"ARGS-JSON {text!r} is not JSON: {exc}") from None
    if isinstance(value, list):
        return value, {}
    if isinstance(value, dict):
        return [], value
    return [value], {}


def _job_failed(reply: Any) -> bool:
    workers = reply.body.get("workers")
    return not isinstance(workers, dict) or any(
        w.get("status") != 200 or w.get("failed") for w in workers.values())


# --------------------------------------------------------------------------
# Handlers


def _cmd_job(args: argparse.Namespace, config: NodeConfig) -> int:
    _resolve_nfp_options(args)
    action, params = args.action, args.params
    if action == "list":
        if params:
            raise ValueError("'job list' takes no arguments")
        return _job_list(args)
    if action == "post":
        if not 2 <= len(params) <= 3:
            raise ValueError("usage: job post SERVICE TASK [ARGS-JSON]")
        return _job_post(args, config, *params)
    if len(params) != 1:
        raise ValueError(f"usage: job {action} UUID")
    return _job_get(args, config, params[0]) if action == "get" else \
        _job_delete(args, config, params[0])


def _job_post(args: argparse.Namespace, config: NodeConfig, service: str, task: str,
              arguments_json: Optional[str] = None) -> int:
    arguments, kwargs = _parse_arguments(arguments_json)
    try:
        target = wire.format_target(args.target or "all")
    except ValueError as exc:
        raise ValueError(f"--target: {exc}") from None
    wait = args.wait is not None
    with _Client(args, config) as c:
        client = c.nfp.client
        started = time.time()
        try:
            if wait:
                timeout = args.timeout if args.wait <= 0 else args.wait
                reply = client.run(service, task, arguments, kwargs, target, timeout=timeout,
                                   job_timeout=args.job_timeout)
            else:
                reply = client.post(service, task, arguments, kwargs, target,
                                    timeout=args.timeout, job_timeout=args.job_timeout)
        except Interrupted as exc:
            uuid = _posted_since(client, started, service, task)
            exc.left = (f"job {uuid} was posted and may still run; fetch its result later "
                        f"with `{PROG} job get {uuid}`") if uuid else "no job was posted"
            raise
    _print_json(_reply_json(reply))
    if wait:
        return EXIT_OK if reply.status is Status.OK and not _job_failed(reply) else EXIT_FAILURE
    return EXIT_OK if reply.status is Status.ACCEPTED else EXIT_FAILURE


def _posted_since(client: Any, since: float, service: str, task: str) -> Optional[str]:
    """The UUID of the job this command posted (the newest such record since ``since``)."""
    for job in client.store.client_jobs(20):
        if job.created >= since and job.service == service and job.task == task:
            return str(job.uuid)
    return None


def _find(client: Any, uuid: str, service: Optional[str]) -> str:
    try:
        return str(client.find_job(uuid).uuid)
    except ValueError:
        if service is None:
            raise ValueError(f"no job {uuid!r} was posted from this store "
                             "(give --service for a job posted elsewhere)") from None
        return uuid


def _await_workers(c: "_Client", uuid: str, service: Optional[str], target: Optional[str],
                   limit: float) -> None:
    """Without a broker, give the mesh up to ``limit`` seconds to show the job's workers.

    A command starts a node of its own: the workers a GET or DELETE goes to may be seen
    a moment after the first broker decision (a broker, once elected, knows them itself).
    """
    client = c.nfp.client
    job = client.store.client_job(uuid)
    names = set(wire.parse_target(target)) if target and target not in (wire.ALL, wire.ANY) \
        else set(job.workers) if job is not None and job.workers else set()
    service = service or (job.service if job is not None else None)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and c.nfp.current_broker is None:
        known = client.direct_workers()
        if names <= {n for members in known.values() for n in members} \
                and (names or known.get(service or "")):
            return
        gevent.sleep(0.02)


def _job_get(args: argparse.Namespace, config: NodeConfig, text: str) -> int:
    wait = 0.0 if args.wait is None else (max(0.0, args.timeout - 1.0) if args.wait < 0
                                          else args.wait)
    with leaving(f"job {text} not fetched; ask again with `{PROG} job get {text}`"), \
            _Client(args, config) as c:
        client = c.nfp.client
        uuid = _find(client, text, args.service)
        _await_workers(c, uuid, args.service, args.target, min(args.timeout, 3.0))
        reply = client.get(uuid, service=args.service, target=args.target, wait=wait,
                           timeout=max(args.timeout, wait + 1.0))
    _print_json(_reply_json(reply))
    return EXIT_OK if reply.status is Status.OK else EXIT_FAILURE


def _job_delete(args: argparse.Namespace, config: NodeConfig, text: str) -> int:
    with leaving(f"job {text} may not be deleted everywhere; see `{PROG} job get {text}`"), \
            _Client(args, config) as c:
        client = c.nfp.client
        uuid = _find(client, text, args.service)
        _await_workers(c, uuid, args.service, args.target, min(args.timeout, 3.0))
        reply = client.delete(uuid, service=args.service, target=args.target,
                              timeout=args.timeout)
    _print_json(_reply_json(reply))
    return EXIT_OK if reply.status is Status.OK else EXIT_FAILURE


def _job_list(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    path = store_path(data_dir, args.store)
    if not path.exists():
        jobs = []
    else:
        store = JobStore(path)
        try:
            jobs = store.client_jobs(max(1, args.limit))
        finally:
            store.close()
    if args.json:
        emit(json.dumps([j.to_dict() for j in jobs], ensure_ascii=False))
        return EXIT_OK
    if not jobs:
        note(f"no jobs recorded in {path}")
        return EXIT_OK
    rows = [("UUID", "CREATED", "SERVICE", "TASK", "TARGET", "STATE", "WORKERS")]
    for j in jobs:
        rows.append((j.uuid, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(j.created)),
                     j.service, j.task, j.target, j.state, ",".join(j.workers) or "-"))
    emit(table(rows))
    return EXIT_OK


def _serve(args: argparse.Namespace, config: NodeConfig, nfp_setup: Callable[[NfpNode], None],
           broker: str) -> int:
    session = NodeSession(config, serving=True)
    nfp = _nfp_node(session, args, broker=broker)
    nfp_setup(nfp)
    node = session.start()

    def on_broker(change: BrokerChanged) -> None:
        new = change.new
        emit(json.dumps({"event": "broker", "broker": new.name if new else None,
                           "uuid": new.uuid.hex if new else None,
                           "endpoint": new.endpoint if new else None,
                           "took_over": change.took_over, "stepped_down": change.stepped_down}))
    nfp.add_listener(on_broker)
    nfp.start()
    emit(json.dumps({"event": "ready", "node": node.name, "uuid": node.uuid.hex,
                       "pid": os.getpid(), "store": str(nfp.store.path), "broker_mode": broker,
                       "broker_endpoint": nfp.broker.endpoint if nfp.broker else None,
                       "workers": [{"name": w.name, "service": w.service, "endpoint": w.endpoint,
                                    "tasks": w.tasks.names()} for w in nfp.workers]}))
    note(f"{node.name} ({node.uuid.hex}) serving; Ctrl-C to stop")
    try:
        session.wait_stopped()
    finally:
        try:
            nfp.stop()
        finally:
            session.close()
    return EXIT_OK


def _cmd_worker(args: argparse.Namespace, config: NodeConfig) -> int:
    _resolve_nfp_options(args, worker=True)
    try:
        tasks = Tasks.from_module(args.tasks)
    except Exception as exc:   # missing, broken (its code failed on import), or no tasks
        detail = exc if isinstance(exc, (ImportError, ValueError)) \
            else f"{type(exc).__name__}: {exc}"
        raise ValueError(f"--tasks {args.tasks}: {detail}") from None

    def setup(nfp: NfpNode) -> None:
        nfp.add_worker(args.service, args.worker_name, tasks)
    return _serve(args, config, setup, args.broker or "never")


def _cmd_broker(args: argparse.Namespace, config: NodeConfig) -> int:
    _resolve_nfp_options(args)
    if args.action == "run":
        if args.what is not None:
            raise ValueError("'broker run' takes no further argument")
        mode = args.broker or "auto"
        if mode == "never":
            raise ValueError("'broker run' needs --broker auto or always")
        return _serve(args, config, lambda nfp: None, mode)
    if args.what is None:
        raise ValueError("usage: broker show workers|services|clients|broker")
    with _Client(args, config) as c:
        if c.nfp.current_broker is None:
            raise RuntimeError("no broker on the mesh (no node runs with --broker auto/always)")
        reply = c.nfp.client.run("mmi.service.broker", f"show_{args.what}", target="any",
                                 timeout=args.timeout)
    if reply.status is not Status.OK or _job_failed(reply):
        _print_json(_reply_json(reply))
        return EXIT_FAILURE
    (result,) = [w.get("result") for w in reply.body["workers"].values()]
    _print_json(result)
    return EXIT_OK


def fetch_file(client: Any, url: str, dest: Path, timeout: float = 60.0) -> dict[str, Any]:
    """Fetch ``url`` from fss.service.broker into ``dest``; checks SHA-256 per chunk and file."""
    def call(task: str, **kwargs: Any) -> dict[str, Any]:
        reply = client.run("fss.service.broker", task, kwargs=kwargs, target="any",
                           timeout=timeout)
        if reply.status is not Status.OK:
            raise RuntimeError(f"{task}: {reply.text or reply.body.get('error') or reply.status}")
        (answer,) = reply.body["workers"].values()
        if answer.get("failed"):
            raise RuntimeError(f"{task}: {'; '.join(answer.get('errors') or ['failed'])}")
        return answer["result"]

    details = call("file_details", url=url)
    if dest.is_dir():
        dest = dest / (url.rstrip("/").rsplit("/", 1)[-1] or "file")
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=".peermesh-", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in range(details["chunks"]):
                with leaving(f"{dest} not written ({chunk} of {details['chunks']} chunks of "
                             f"{url} fetched)"):
                    part = call("fetch_file", url=url, chunk=chunk,
                                chunk_size=details["chunk_size"])
                data = base64.b64decode(part["data"])
                if hashlib.sha256(data).hexdigest() != part["sha256"]:
                    raise RuntimeError(f"chunk {chunk} of {url} failed its checksum")
                digest.update(data)
                out.write(data)
        if digest.hexdigest() != details["sha256"]:
            raise RuntimeError(f"{url} changed or was corrupted in transfer (SHA-256 differs)")
        os.replace(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return {**details, "dest": str(dest)}


def _cmd_file(args: argparse.Namespace, config: NodeConfig) -> int:
    _resolve_nfp_options(args)
    if not args.url.startswith("nf://"):
        raise ValueError(f"{args.url!r} is not an nf:// URL")
    dest = Path(args.dest)
    if not dest.is_dir() and not dest.parent.is_dir():
        raise ValueError(f"cannot write {dest}: {dest.parent} is not a directory")
    with _Client(args, config) as c:
        if c.nfp.current_broker is None:
            raise RuntimeError("no broker on the mesh: the file service runs on the broker")
        with leaving(f"{args.url} not fetched"):
            result = fetch_file(c.nfp.client, args.url, dest, args.timeout)
    note(f"{args.url}: {result['size']} bytes, sha256 {result['sha256']} -> {result['dest']}")
    return EXIT_OK
