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
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(60)
            except (subprocess.TimeoutExpired, OSError, BrokenPipeError):
                self.proc.kill()
                self.proc.wait(10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


class ConfigBootedRank0:
    """A flux-core rank 0 booted from a configuration of ``size`` hosts (fake0, fake1,
    ...) listening on loopback, with a CURVE certificate of ``flux keygen``; the other
    ranks are for peermesh to take. Quorum 1: it runs without them."""

    def __init__(self, directory: "Path", size: int, port: int) -> None:
        import subprocess as sp
        conf, run = directory / "conf", directory / "run"
        conf.mkdir()
        run.mkdir()
        self.cert = directory / "curve.cert"
        sp.run(["flux", "keygen", str(self.cert)], check=True, capture_output=True,
               env=clean_env(), timeout=60)
        self.cert.chmod(0o600)
        self.endpoint = f"tcp://127.0.0.1:{port}"
        hosts = [f'[[bootstrap.hosts]]\nhost = "fake0"\nbind = "{self.endpoint}"\n'
                 f'connect = "{self.endpoint}"\n']
        hosts += [f'[[bootstrap.hosts]]\nhost = "fake{r}"\n' for r in range(1, size)]
        self.config = conf / "bootstrap.toml"
        self.config.write_text(
            f'[bootstrap]\ncurve_cert = "{self.cert}"\n' + "".join(hosts))
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
