"""A real flux-core instance for the interop tests: ``flux start --test-size=N``.

``flux_core_version()`` is the version of the ``flux`` on PATH (None when there
is none, or it is older than 0.88); ``FluxCoreInstance`` starts an instance of
N brokers on this host (they talk over ipc:// sockets in a directory of their
own; nothing on the network) and stops it by closing the initial program's
stdin.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import TYPE_CHECKING, Optional

import childprocs

if TYPE_CHECKING:
    from pathlib import Path

#: the reason the interop tests give when they cannot run
SKIP = "flux-core >= 0.88 not found"


def flux_core_version() -> Optional[tuple[int, int, int]]:
    flux = shutil.which("flux")
    if flux is None:
        return None
    try:
        out = subprocess.run([flux, "version"], capture_output=True, text=True, timeout=30,
                             env=clean_env()).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"libflux-core:\s+(\d+)\.(\d+)\.(\d+)", out)
    if match is None:
        return None
    version = (int(match[1]), int(match[2]), int(match[3]))
    return version if version >= (0, 88, 0) else None


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without any enclosing instance's variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLUX_")}
    env.update(extra)
    return env


class FluxCoreInstance:
    """``flux start --test-size=size``; ``uri`` is rank 0's local connector."""

    def __init__(self, size: int) -> None:
        self.proc = subprocess.Popen(
            ["flux", "start", f"--test-size={size}", "sh", "-c", 'echo "$FLUX_URI"; exec cat'],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=clean_env(), text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()  # (flux start's own wait bounds it)
        if not line.startswith("local://"):
            self.stop()
            raise RuntimeError(f"flux start printed {line!r}; stderr: {self.stderr()}")
        self.uri = line
        self.size = size

    def env(self) -> dict[str, str]:
        """An environment whose FLUX_URI names this instance (for flux's own tools)."""
        return clean_env(FLUX_URI=self.uri)

    def flux(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """One of flux-core's own commands against this instance."""
        return subprocess.run(["flux", *args], capture_output=True, text=True,
                              timeout=timeout, env=self.env(), stdin=subprocess.DEVNULL)

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None \
            else ""

    def stop(self) -> None:
        childprocs.stop(self.proc, 60)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def write_config(directory: "Path", size: int, listen: dict[int, int],
                 topo: Optional[str] = None) -> tuple["Path", "Path"]:
    """A config-boot configuration of ``size`` hosts (fake0, fake1, ...) in
    ``directory/conf``, with ``bind``/``connect`` on loopback ports for the ranks in
    ``listen`` (those with children), a ``flux keygen`` certificate and ``tbon.topo``;
    the paths of the file and the certificate."""
    import subprocess as sp
    conf = directory / "conf"
    conf.mkdir()
    cert = directory / "curve.cert"
    sp.run(["flux", "keygen", str(cert)], check=True, capture_output=True,
           env=clean_env(), timeout=60)
    cert.chmod(0o600)
    hosts = []
    for rank in range(size):
        entry = f'[[bootstrap.hosts]]\nhost = "fake{rank}"\n'
        if rank in listen:
            endpoint = f"tcp://127.0.0.1:{listen[rank]}"
            entry += f'bind = "{endpoint}"\nconnect = "{endpoint}"\n'
        hosts.append(entry)
    tbon = f'[tbon]\ntopo = "{topo}"\n' if topo else ""
    config = conf / "bootstrap.toml"
    config.write_text(f'{tbon}[bootstrap]\ncurve_cert = "{cert}"\n' + "".join(hosts))
    return config, cert


class FluxCoreBroker:
    """A flux-core broker of rank ``rank`` (host ``fake<rank>``) of the configuration
    ``config`` (``write_config``), without rc1/rc3 (no modules beyond the built-in
    ones) unless ``rc`` (flux-core's own: its modules); ``uri`` is its local connector,
    its log goes to ``directory/broker<rank>.log``.
    """

    def __init__(self, directory: "Path", config: "Path", rank: int, rc: bool = False) -> None:
        run = directory / f"run{rank}"
        run.mkdir()
        self.uri = f"local://{run}/local-{rank}"
        self.log = directory / f"broker{rank}.log"
        from gevent import subprocess as gsp  # (its exit code read right under gevent)
        with open(self.log, "w") as log:
            self.proc = gsp.Popen(
                ["flux", "broker", "-v", f"-Shostname=fake{rank}",
                 f"--config-path={config.parent}", f"-Srundir={run}",
                 *(() if rc else ("-Sbroker.rc1_path=", "-Sbroker.rc3_path="))],
                stdin=gsp.DEVNULL, stdout=log, stderr=gsp.STDOUT, env=clean_env())

    def env(self) -> dict[str, str]:
        return clean_env(FLUX_URI=self.uri)

    def flux(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """One of flux-core's commands run against this broker."""
        from gevent import subprocess as gsp
        return gsp.run(["flux", *args], capture_output=True, text=True,
                              timeout=timeout, env=self.env(), stdin=subprocess.DEVNULL)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> Optional[int]:
        """Its exit code if it ended by itself, else None (then it is killed)."""
        code = self.proc.poll()
        if code is None:
            self.proc.kill()
            self.proc.wait(10)
        return code


class ConfigBootedRank0:
    """A flux-core rank 0 booted from a configuration of ``size`` hosts (fake0, fake1,
    ...) listening on loopback, with a CURVE certificate of ``flux keygen``; the other
    ranks are for peermesh to take (``listen``: bind/connect ports of other ranks with
    children, ``topo``: ``tbon.topo``). Quorum 1: it runs without them."""

    def __init__(self, directory: "Path", size: int, port: int,
                 listen: Optional[dict[int, int]] = None, topo: Optional[str] = None) -> None:
        import subprocess as sp
        run = directory / "run"
        run.mkdir()
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.config, self.cert = write_config(directory, size, {0: port, **(listen or {})},
                                              topo)
        conf = self.config.parent
        self.uri = f"local://{run}/local-0"
        self.proc = sp.Popen(["flux", "broker", "-Shostname=fake0", f"--config-path={conf}",
                              "-Sbroker.rc1_path=", "-Sbroker.rc3_path=", "-Sbroker.quorum=1",
                              f"-Srundir={run}", "sh", "-c", "echo up; exec cat"],
                             stdin=sp.PIPE, stdout=sp.PIPE, stderr=sp.PIPE, text=True,
                             env=clean_env())
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "up":
            self.stop()
            raise RuntimeError("the config-booted broker did not start")

    def env(self) -> dict[str, str]:
        return clean_env(FLUX_URI=self.uri)

    def stop(self) -> None:
        FluxCoreInstance.stop(self)  # type: ignore[arg-type]
