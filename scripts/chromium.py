"""Drive Debian's headless Chromium over its DevTools protocol on a pipe (no driver, no
network): open a page, evaluate JavaScript, collect console errors, take a screenshot.

Used by the web view's browser test (tests/agent/test_web_browser.py) and its
benchmark (scripts/bench_web.py). ``Chromium.available()`` says why it cannot
run (binary missing) or None. Chromium is started with ``--remote-debugging-pipe``:
it reads commands on descriptor 3 and writes replies and events on descriptor 4,
each a JSON object ended by a NUL octet. Every wait is bounded.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from typing import Any, Optional

from processes import end_group

BINARY = os.environ.get("PEERMESH_CHROMIUM", "/usr/bin/chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--mute-audio",
         "--remote-debugging-pipe")


class BrowserError(RuntimeError):
    """Chromium failed, answered with an error, or did not answer in time."""


class Chromium:
    """One headless Chromium with one page (a fresh profile, removed on ``close``)."""

    def __init__(self, width: int = 1280, height: int = 860) -> None:
        self.profile = tempfile.mkdtemp(prefix="peermesh-chromium-")
        ours_read, theirs_write = os.pipe()
        theirs_read, ours_write = os.pipe()
        # Chromium reads descriptor 3 and writes descriptor 4.
        # A process group of its own, ended whole; its temporary files (the singleton
        # socket's directory) in the profile: nothing of it outlives ``close``.
        self.proc = subprocess.Popen(
            [BINARY, *FLAGS, f"--user-data-dir={self.profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "TMPDIR": self.profile}, process_group=0,
            pass_fds=(3, 4), preexec_fn=_dup_to(theirs_read, theirs_write))
        os.close(theirs_read)
        os.close(theirs_write)
        self._in, self._out = ours_read, ours_write
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        #: console errors and uncaught exceptions of the page, as text
        self.errors: list[str] = []
        try:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.call("Target.attachToTarget", targetId=target,
                                     flatten=True)["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                self.call(f"{domain}.enable", session=True)
            self.call("Emulation.setDeviceMetricsOverride", session=True, width=width,
                      height=height, deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def available() -> Optional[str]:
        """None when Chromium can run here, else why not."""
        if not (os.path.isfile(BINARY) and os.access(BINARY, os.X_OK)) \
                and shutil.which(BINARY) is None:
            return f"no Chromium at {BINARY} (Debian: apt-get install chromium)"
        return None

    # --- the protocol ---------------------------------------------------

    def call(self, method: str, timeout: float = 15.0, session: bool = False,
             **params: Any) -> dict[str, Any]:
        """Send one command and return its result (BrowserError on an error answer)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._out, data):]
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply is None:
                raise BrowserError(f"{method}: no answer within {timeout} s")
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return dict(reply.get("result", {}))
            self._event(reply)

    def _read(self, deadline: float) -> Optional[dict[str, Any]]:
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._in], [], [], remaining)[0]:
                return None
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium exited (status {self.proc.poll()})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\0", 1)
        return dict(json.loads(line))

    def _event(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text")
            self.errors.append(f"exception: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = [a.get("value", a.get("description")) for a in params.get("args", [])]
            self.errors.append(f"console.{params['type']}: {args}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            self.errors.append(f"log: {entry.get('text')} ({entry.get('url', '')})")

    def pump(self, seconds: float = 0.0) -> None:
        """Read the events that came (console messages, exceptions) for up to ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            message = self._read(deadline)
            if message is None:
                return
            self._event(message)

    # --- the page -------------------------------------------------------

    def open(self, url: str, timeout: float = 15.0) -> None:
        """Navigate to ``url`` and wait until its load event."""
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("document.readyState === 'complete'", timeout)

    def evaluate(self, expression: str, timeout: float = 15.0) -> Any:
        """The value of ``expression`` in the page (awaited when it is a promise)."""
        result = self.call("Runtime.evaluate", timeout, session=True, expression=expression,
                           returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"{expression[:80]}: "
                               f"{details.get('exception', {}).get('description', details)}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float, step: float = 0.02) -> Any:
        """Evaluate ``expression`` until it is truthy; its value (BrowserError after
        ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() >= deadline:
                raise BrowserError(f"{expression[:120]} still false after {timeout} s "
                                   f"(last value {value!r})")
            self.pump(step)

    def screenshot(self, path: str) -> None:
        """Save the page as a PNG."""
        data = self.call("Page.captureScreenshot", session=True, format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self) -> None:
        """End Chromium, every process of it, and remove its profile."""
        end_group(self.proc, term_wait=5.0)
        for fd in (self._in, self._out):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _dup_to(read_fd: int, write_fd: int) -> Any:
    """A preexec_fn that puts ``read_fd`` on descriptor 3 and ``write_fd`` on 4."""
    def setup() -> None:
        # Move both above 4 first, so neither dup2 overwrites the other.
        r, w = os.dup(read_fd), os.dup(write_fd)
        os.dup2(r, 3)
        os.dup2(w, 4)
        os.set_inheritable(3, True)
        os.set_inheritable(4, True)
    return setup
