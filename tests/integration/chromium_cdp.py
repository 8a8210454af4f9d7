"""A minimal headless-Chromium driver over the DevTools protocol on a pipe.

``--remote-debugging-pipe`` makes Chromium read protocol commands from file descriptor 3 and
write replies and events to descriptor 4, each message JSON ended by a NUL byte. That needs no
WebSocket library, no driver binary and no browser download: only Debian's ``chromium``.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# The flags this machine's notes say headless Chromium needs as root behind a closed network.
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    """Path of a Chromium executable, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class CDPError(RuntimeError):
    """A protocol command failed."""


class Chromium:
    """One headless browser with one page, driven through the DevTools protocol."""

    def __init__(self, executable: str, width: int = 1440, height: int = 1000) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="keyshared-chromium-")
        cmd_r, cmd_w = os.pipe()  # we write commands, Chromium reads them as fd 3
        out_r, out_w = os.pipe()  # Chromium writes as fd 4, we read
        # bash puts the pipe ends on 3 and 4 (dash takes single-digit fds only); from fds >= 10
        # neither end is clobbered on the way.
        high_r, high_w = (
            fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10),
            fcntl.fcntl(out_w, fcntl.F_DUPFD, 10),
        )
        os.close(cmd_r)
        os.close(out_w)
        cmd_r, out_w = high_r, high_w
        self.proc = subprocess.Popen(
            [
                "/bin/bash",
                "-c",
                f'exec "$@" 3<&{cmd_r} 4>&{out_w}',
                "sh",
                executable,
                *_FLAGS,
                f"--user-data-dir={self._profile.name}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(cmd_r, out_w),
        )
        os.close(cmd_r)
        os.close(out_w)
        self._out = os.fdopen(cmd_w, "wb", buffering=0)
        self._in = os.fdopen(out_r, "rb", buffering=0)
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        self.page("Page.enable")
        self.page("Runtime.enable")
        self.page(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    # --- protocol ------------------------------------------------------------------------
    def _read_loop(self) -> None:
        buf = b""
        while True:
            chunk = self._in.read(65536)
            if not chunk:
                break
            buf += chunk
            *messages, buf = buf.split(b"\0")
            for raw in messages:
                msg = json.loads(raw)
                if "id" in msg:
                    with self._cond:
                        self._replies[msg["id"]] = msg
                        self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = 15.0,
    ) -> dict[str, Any]:
        """Send one command and wait for its reply's result."""
        with self._cond:
            self._next_id += 1
            msg_id = self._next_id
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        self._out.write(json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cond:
            while msg_id not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise CDPError(f"no reply to {method}")
                self._cond.wait(left)
            reply = self._replies.pop(msg_id)
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    def page(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """A command to the page's session."""
        return self.call(method, params, self.session)

    # --- what a test does --------------------------------------------------------------
    def goto(self, url: str) -> None:
        """Navigate and wait until the document has loaded."""
        self.page("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'")

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.page(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise CDPError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 15.0) -> Any:
        """Poll ``expression`` until it is truthy; return its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout}s: {expression}")
            time.sleep(0.1)

    def click(self, x: float, y: float) -> None:
        """A real left click at page coordinates (x, y) of the viewport."""
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.page(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
            )

    def screenshot(self, path: Path, *, full_page: bool = True) -> Path:
        """Save a PNG of the page (the whole page by default)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = self.page("Page.getLayoutMetrics")
            size = metrics["cssContentSize"]
            params["clip"] = {
                "x": 0,
                "y": 0,
                "width": size["width"],
                "height": size["height"],
                "scale": 1,
            }
            params["captureBeyondViewport"] = True
        data = self.page("Page.captureScreenshot", params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        """End the browser and remove its profile."""
        with contextlib.suppress(CDPError, OSError):
            self.call("Browser.close", timeout=5)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        for f in (self._out, self._in):
            with contextlib.suppress(OSError):
                f.close()
        self._profile.cleanup()
