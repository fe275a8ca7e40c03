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

This module builds the parser; the options are read in ``cliconfig``, the client
commands are in ``clientcommands``, ``worker`` and ``broker run`` in ``servecommands``.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable, Optional

from ..argtypes import cidr, positive_count, seconds, text, utf8
from ..cli.output import PROG
from ..config import NodeConfig
from ..overlay.election import MODES
from .cliconfig import NFP_KEYS, load_nfp_table
from .clientcommands import _cmd_broker_show, _cmd_file_get, _cmd_job_delete, _cmd_job_get, \
    _cmd_job_list, _cmd_job_post, fetch_file
from .servecommands import _cmd_broker_run, _cmd_worker

__all__ = ["add_commands", "fetch_file", "NFP_KEYS", "load_nfp_table"]

Handler = Callable[[argparse.Namespace, NodeConfig], int]


# --------------------------------------------------------------------------
# Options


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
