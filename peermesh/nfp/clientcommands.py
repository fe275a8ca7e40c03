"""The NFP client commands (``job post|get|list|delete``, ``broker show``, ``file get``):
each joins the mesh, waits for it to be seen and the broker (if any) elected, acts, and leaves."""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional
import gevent

from ..argtypes import text
from ..cli.output import EXIT_FAILURE, EXIT_OK, PROG, emit, note, table, to_json
from ..cli.progress import Progress
from ..cli.session import Interrupted, NodeSession, leaving
from ..config import NodeConfig
from ..wire import nfp as wire
from ..wire.nfp import Status
from .mesh import default_data_dir
from .store import JobStore, store_path
from .cliconfig import _nfp_node, _resolve_nfp_options


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
