"""``peermesh job|worker|broker|file`` subcommands: NFP from the shell.

Registered through ``peermesh.cli.commands.COMMAND_MODULES`` and built only with the
``command(name, summary, description, examples, handler)`` factory; each action is
a subcommand of its own, with the node options and only the NFP options it uses::

    peermesh job post SERVICE TASK [ARGS-JSON] [--target any|all|w1,w2] [--wait [SECONDS]]
    peermesh job get UUID [--service S] [--wait [SECONDS]]
    peermesh job list [--json]
    peermesh job delete UUID
    peermesh worker [--service S] [--tasks MODULE] [--broker auto|always|never]
    peermesh broker run [--broker auto|always] | broker show workers|services|clients|broker
    peermesh file get nf://PATH DEST

Client commands wait about one and a half beacon intervals for the mesh to
be seen and the broker (if any) elected, act, and leave. Every command reads
the ``[nfp]`` table of ``--config`` (keys in ``NFP_KEYS``, documented in the
example that ``peermesh config example`` prints) for the NFP options it has; command-line
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

from ..argtypes import cidr, is_seconds, positive_count, seconds, text, utf8
from ..cli.output import EXIT_FAILURE, EXIT_OK, PROG, emit, note, table, to_json
from ..cli.progress import Progress
from ..cli.session import Interrupted, NodeSession, leaving
from ..config import NodeConfig, read_table
from ..wire import nfp as wire
from ..wire.nfp import Status
from ..overlay.election import MODES
from .mesh import BrokerChanged, NfpNode, default_data_dir
from .store import JobStore, store_path
from .worker import Tasks

__all__ = ["add_commands", "fetch_file", "NFP_KEYS", "load_nfp_table"]

log = logging.getLogger(__name__)

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
    "admin_keys": ("a path", _text, None),
    "grants": ("a path", _text, None),
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
    return read_table(path, "nfp", NFP_KEYS)


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
    data_dir = Path(args.data_dir) if getattr(args, "data_dir", None) else default_data_dir()
    if data_dir.exists() and not data_dir.is_dir():
        raise ValueError(f"data directory {data_dir} is a file, not a directory (give another "
                         "with --data-dir or $PEERMESH_DATA_DIR)")


def _option(args: argparse.Namespace, key: str) -> Any:
    """An NFP option's value, or its default for a command that does not take it."""
    value = getattr(args, key, None)
    return NFP_KEYS[key][2] if value is None else value


def _nfp_options(parser: argparse.ArgumentParser, *, network: bool = True,
                 client: bool = True, serve: bool = False) -> None:
    """The NFP options a command uses: ``network`` (it starts a node), ``client`` (it
    posts jobs), ``serve`` (a worker or broker)."""
    group = parser.add_argument_group("NFP options (also [nfp] in --config)")
    group.add_argument("--data-dir", metavar="DIR",
                       help="where the node's SQLite job store lives (default: "
                            "$PEERMESH_DATA_DIR, else ~/.local/share/peermesh)")
    if client:
        group.add_argument("--store", default="cli", metavar="NAME", type=text,
                           help="client store: DATA_DIR/nfp-NAME.sqlite3 records the jobs "
                                "posted (default: %(default)s)")
    if not network:
        return
    if serve:
        group.add_argument("--keepalive", type=seconds, metavar="SECONDS",
                           help="NFP heartbeat interval between broker and workers "
                                "(default: 1.0)")
        group.add_argument("--multiplier", type=int, metavar="N",
                           help="a peer silent for keepalive x N is disconnected (default: 3)")
    group.add_argument("--request-timeout", type=seconds, metavar="SECONDS",
                       help="longest wait for a worker's or broker's answer (default: 5.0)")
    group.add_argument("--peer-network", action="append", metavar="CIDR", type=cidr,
                       help="connect to broker and worker endpoints peers advertise only in "
                            "this network (default: the node's interface network); repeatable")
    group.add_argument("--queue-timeout", type=seconds, metavar="SECONDS",
                       help="how long a POST waits for a worker of its service to appear "
                            "(default: 30.0)")
    if client:
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
        group.add_argument("--admin-keys", metavar="DIR",
                           help="on a node with keys (--key-file): directory of the public "
                                "certificates allowed MMI disconnect/restart/shutdown, instead "
                                "of the token (default: admin_keys in [nfp])")
        group.add_argument("--grants", metavar="FILE",
                           help="on a node with keys (--key-file): TOML file of the tasks and "
                                "FSS files each public key may use (default: grants in [nfp]; "
                                "none: any allowed key may use any)")
        group.add_argument("--retention", type=seconds, metavar="SECONDS",
                           help="finished jobs are purged after this long (default: 7 days)")
        group.add_argument("--inventory", metavar="DIR",
                           help="SID: directory of <worker>.yaml/.yml/.json inventory files")
        group.add_argument("--files-root", metavar="DIR",
                           help="FSS: directory served as nf:// URLs (nothing outside it)")


class _WaitOption(argparse.Action):
    """``--wait [SECONDS]`` whose value is taken only when it is a number, so that
    ``job post demo add --wait '[1, 2]'`` keeps its ARGS-JSON (kept in ``after_wait``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: Optional[str] = None) -> None:
        if isinstance(values, str):  # else argparse gave the const: no value
            try:
                float(values)
            except ValueError:
                namespace.after_wait, values = values, None
        if not isinstance(values, str):
            setattr(namespace, self.dest, self.const)
            return
        try:
            setattr(namespace, self.dest, seconds(values))
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None


def _wait_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--wait", "-W", nargs="?", action=_WaitOption, const=-1.0,
                        default=None, metavar="SECONDS", help=help)
    parser.set_defaults(after_wait=None)


def _target_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--target", "-t", type=text, default=None, help=help)


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``job``, ``worker``, ``broker`` and ``file`` to the ``peermesh`` parser."""
    command(
        "job", "post NFP jobs, fetch their results, list and cancel them",
        "Jobs for services run by NFP workers on the mesh. With a broker on the mesh "
        "requests go through it, otherwise straight to the workers. UUID may be a unique "
        "prefix of a job posted from here. 'peermesh job ACTION --help' shows the options "
        "of each action.",
        f"  {PROG} job post maths add '[1, 2]' --target any --wait -i lo\n"
        f"  {PROG} job get 3f2a9c --wait 10 -i lo\n"
        f"  {PROG} job list\n"
        f"  {PROG} job delete 3f2a9c -i lo",
        None)
    post = command(
        "job post", "send a job, print the reply (or with --wait its result)",
        "Send a job and print the reply: 202 with the workers that accepted it, or with "
        "--wait the result. ARGS-JSON is a JSON list of arguments, an object of keyword "
        "arguments, or one value.",
        f"  {PROG} job post maths add '[1, 2]' --target any --wait -i lo\n"
        f"  {PROG} job post demo sleep '{{\"seconds\": 5}}' -t w1,w2 -i lo",
        _cmd_job_post)
    post.add_argument("service", metavar="SERVICE", type=text, help="the job's service")
    post.add_argument("task", metavar="TASK", type=text, help="the task to run")
    post.add_argument("arguments", metavar="ARGS-JSON", nargs="?", type=utf8,
                      help="the task's arguments as JSON")
    _target_option(post, "all (default), any (the least loaded worker) or w1,w2,...")
    _wait_option(post, "wait for the result (at most SECONDS, default: --timeout)")
    post.add_argument("--job-timeout", type=seconds, metavar="SECONDS",
                      help="workers stop the job after this long")
    _nfp_options(post)

    get = command(
        "job get", "fetch each worker's status and result of a job",
        "Ask the job's workers for its status and result: 200 done, 300 pending, 400 "
        "unknown. With --wait the workers hold the answer until the job finishes.",
        f"  {PROG} job get 3f2a9c --wait 10 -i lo", _cmd_job_get)
    delete = command(
        "job delete", "cancel a pending or running job, forget a finished one",
        "Cancel the job where it is pending or running and forget it where it finished.",
        f"  {PROG} job delete 3f2a9c -i lo", _cmd_job_delete)
    for parser in (get, delete):
        parser.add_argument("uuid", metavar="UUID", nargs="?", type=text,
                            help="the job's UUID, or a unique prefix of a job posted from here")
        parser.add_argument("--service", "-s", type=text,
                            help="the job's service (for jobs posted from elsewhere)")
        _target_option(parser, "workers to ask (default: those that accepted the job)")
    _wait_option(get, "let workers hold the answer until the job finishes (at most SECONDS, "
                      "default: up to --timeout)")
    for parser in (get, delete):
        _nfp_options(parser)

    listing = command(
        "job list", "show the jobs posted from here (no network)",
        "Show the jobs recorded in the client store, newest first.",
        f"  {PROG} job list\n  {PROG} job list --json --limit 5", _cmd_job_list)
    listing.add_argument("--json", action="store_true", help="one JSON list")
    listing.add_argument("--limit", type=positive_count, default=50,
                         help="at most this many (default: 50)")
    _nfp_options(listing, network=False)

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
    worker.add_argument("--service", "-s", type=text,
                        help="the service this worker serves (default: demo)")
    worker.add_argument("--worker-name", metavar="NAME", type=text,
                        help="worker name, unique on the mesh (default: the node's name)")
    worker.add_argument("--tasks", metavar="MODULE", type=text,
                        help="module whose 'tasks' to serve (default: peermesh.nfp.demo)")
    _nfp_options(worker, client=False, serve=True)

    command(
        "broker", "run a broker candidate, or show what the broker knows",
        "'run' starts a broker candidate; 'show' asks the elected broker. 'peermesh broker "
        "ACTION --help' shows the options of each action.",
        f"  {PROG} broker run --broker always --name b1 -i lo --files-root /srv/files\n"
        f"  {PROG} broker show workers -i lo",
        None)
    run = command(
        "broker run", "serve as broker while elected",
        "Start a node that is a broker candidate (--broker auto, the default, or always) "
        "and serves as broker while elected, until Ctrl-C or SIGTERM. Prints JSON lines as "
        "'worker' does.",
        f"  {PROG} broker run --broker always --name b1 -i lo --files-root /srv/files",
        _cmd_broker_run)
    _nfp_options(run, client=False, serve=True)
    show = command(
        "broker show", "print what the elected broker knows, as JSON",
        "Ask the elected broker's mmi.service.broker for its workers, services, clients or "
        "itself, and print the answer as JSON.",
        f"  {PROG} broker show workers -i lo", _cmd_broker_show)
    show.add_argument("what", choices=("workers", "services", "clients", "broker"),
                      metavar="WHAT", help="workers, services, clients or broker")
    _nfp_options(show)

    command(
        "file", "fetch files from the broker's file service",
        "The broker's file service (fss.service.broker) serves its --files-root as nf:// "
        "URLs.", f"  {PROG} file get nf://configs/r1.txt ./r1.txt -i lo", None)
    file = command(
        "file get", "fetch a file from the broker's file service",
        "Fetch nf://PATH from fss.service.broker in chunks, check every chunk's and the "
        "whole file's SHA-256, and write it to DEST (a file, or a directory to put it in). "
        "Paths outside the broker's files root are refused.",
        f"  {PROG} file get nf://configs/r1.txt ./r1.txt -i lo", _cmd_file_get)
    file.add_argument("url", metavar="nf://PATH", type=text)
    file.add_argument("dest", metavar="DEST")
    _nfp_options(file)


# --------------------------------------------------------------------------
# Running a node with NFP


def _nfp_node(session: NodeSession, args: argparse.Namespace, *, broker: str = "never",
              store_name: Optional[str] = None) -> NfpNode:
    try:
        return NfpNode(session.node, data_dir=args.data_dir, broker=broker,
                       priority=_option(args, "priority"), keepalive=_option(args, "keepalive"),
                       multiplier=_option(args, "multiplier"),
                       queue_timeout=_option(args, "queue_timeout"),
                       request_timeout=_option(args, "request_timeout"),
                       retention=_option(args, "retention"),
                       admin_token=getattr(args, "admin_token", None),
                       admin_keys=getattr(args, "admin_keys", None),
                       grants=getattr(args, "grants", None),
                       inventory_dir=getattr(args, "inventory", None),
                       files_root=getattr(args, "files_root", None), store_name=store_name,
                       peer_networks=getattr(args, "peer_network", None),
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


def _cmd_job_post(args: argparse.Namespace, config: NodeConfig) -> int:
    _resolve_nfp_options(args)
    if args.after_wait is not None and args.arguments is not None:
        raise ValueError(f"unexpected argument {args.after_wait!r} after --wait")
    arguments, kwargs = _parse_arguments(args.arguments or args.after_wait)
    service, task = args.service, args.task
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


def _job_uuid(args: argparse.Namespace, action: str) -> str:
    """UUID, given before or after ``--wait``."""
    _resolve_nfp_options(args)
    uuid = args.uuid or getattr(args, "after_wait", None)
    if uuid is None or args.uuid and getattr(args, "after_wait", None):
        raise ValueError(f"usage: {PROG} job {action} UUID")
    return str(uuid)


def _cmd_job_get(args: argparse.Namespace, config: NodeConfig) -> int:
    text = _job_uuid(args, "get")
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


def _cmd_job_delete(args: argparse.Namespace, config: NodeConfig) -> int:
    text = _job_uuid(args, "delete")
    with leaving(f"job {text} may not be deleted everywhere; see `{PROG} job get {text}`"), \
            _Client(args, config) as c:
        client = c.nfp.client
        uuid = _find(client, text, args.service)
        _await_workers(c, uuid, args.service, args.target, min(args.timeout, 3.0))
        reply = client.delete(uuid, service=args.service, target=args.target,
                              timeout=args.timeout)
    _print_json(_reply_json(reply))
    return EXIT_OK if reply.status is Status.OK else EXIT_FAILURE


def _cmd_job_list(args: argparse.Namespace, config: NodeConfig) -> int:
    _resolve_nfp_options(args)
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
        emit(to_json([j.to_dict() for j in jobs]))
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
        emit(to_json({"event": "broker", "broker": new.name if new else None,
                      "uuid": new.uuid.hex if new else None,
                      "endpoint": new.endpoint if new else None,
                      "took_over": change.took_over, "stepped_down": change.stepped_down}))
    nfp.add_listener(on_broker)
    nfp.start()
    emit(to_json({"event": "ready", "node": node.name, "uuid": node.uuid.hex,
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


def _cmd_broker_run(args: argparse.Namespace, config: NodeConfig) -> int:
    _resolve_nfp_options(args)
    mode = args.broker or "auto"
    if mode == "never":
        raise ValueError("'broker run' needs --broker auto or always")
    return _serve(args, config, lambda nfp: None, mode)


def _cmd_broker_show(args: argparse.Namespace, config: NodeConfig) -> int:
    _resolve_nfp_options(args)
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


def fetch_file(client: Any, url: str, dest: Path, timeout: float = 60.0,
               progress: Optional[Callable[[int, int], None]] = None) -> dict[str, Any]:
    """Fetch ``url`` from fss.service.broker into ``dest``; checks SHA-256 per chunk and file.

    ``progress(octets, total)`` is called after each chunk."""
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
                if progress is not None:
                    progress(len(data), details["size"])
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


def _cmd_file_get(args: argparse.Namespace, config: NodeConfig) -> int:
    _resolve_nfp_options(args)
    if not args.url.startswith("nf://"):
        raise ValueError(f"{args.url!r} is not an nf:// URL")
    dest = Path(args.dest)
    if not dest.is_dir() and not dest.parent.is_dir():
        raise ValueError(f"cannot write {dest}: {dest.parent} is not a directory")
    with _Client(args, config) as c:
        if c.nfp.current_broker is None:
            raise RuntimeError("no broker on the mesh: the file service runs on the broker")
        with leaving(f"{args.url} not fetched"), Progress(args.url, unit="B") as bar:
            def advanced(octets: int, total: int) -> None:
                bar.set_total(total)
                bar.update(octets)
            result = fetch_file(c.nfp.client, args.url, dest, args.timeout, advanced)
    note(f"{args.url}: {result['size']} bytes, sha256 {result['sha256']} -> {result['dest']}")
    return EXIT_OK
