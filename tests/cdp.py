"""A small Chrome DevTools Protocol client over ``--remote-debugging-pipe``: headless Chromium
driven for real (pages, DOM, keyboard, file inputs, screenshots, the network log) with no
package beyond the standard library (playwright cannot download its browsers offline).

The pipe protocol: Chromium reads JSON commands from fd 3 and writes JSON answers and events to
fd 4, each message ending in a NUL byte. Every other host is unresolvable (the same rules as
tests/test_serve_docs.py), so a page that tried to reach one would fail visibly, and its
attempt is still in the network log."""
from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-extensions", "--hide-scrollbars", "--force-color-profile=srgb",
         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
# the child: the two pipe ends moved onto fds 3 and 4, then exec Chromium (argv[3:])
_ON_FDS_3_AND_4 = ("import os, sys; r, w = map(int, sys.argv[1:3]); os.dup2(r, 3); "
                   "os.dup2(w, 4); os.close(r); os.close(w); os.execv(sys.argv[3], sys.argv[3:])")
KEYS = {"Tab": 9, "Enter": 13, "Home": 36, "End": 35, "ArrowLeft": 37, "ArrowRight": 39}


def find_browser() -> str:
    """The Chromium binary; skips without one, except in CI (CI=true installs it: .ci/run)."""
    found = next((path for path in map(shutil.which, BROWSERS) if path), None)
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but no Chromium installed (.ci/run installs Debian's chromium)")
        pytest.skip("no Chromium installed (apt-get install chromium)")
    return found


class CDPError(RuntimeError):
    """A command answered with an error, or no answer within the timeout."""


class Browser:
    """One headless Chromium process and its pipe; pages are targets attached in flat mode."""

    def __init__(self, binary: str, profile: Path) -> None:
        commands_in, self._commands = os.pipe()  # Chromium's fd 3 reads what we write
        self._answers, answers_out = os.pipe()   # Chromium's fd 4 writes what we read
        # above 9, so that moving them onto fds 3 and 4 in the child never overwrites one
        given = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (commands_in, answers_out)]
        for fd in (commands_in, answers_out):
            os.close(fd)
        profile.mkdir(parents=True, exist_ok=True)
        self.log = profile / "chromium.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _ON_FDS_3_AND_4, *map(str, given), binary, *FLAGS,
                 "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
                pass_fds=given, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        for fd in given:
            os.close(fd)
        self._next, self._lock = 0, threading.Lock()
        self._answered: Dict[int, Dict] = {}
        self._arrived = threading.Condition()
        self.events: List[Dict] = []
        threading.Thread(target=self._read, daemon=True, name="cdp-reader").start()

    def _read(self) -> None:
        buffer = b""
        with os.fdopen(self._answers, "rb", buffering=0) as pipe:
            while chunk := pipe.read(1 << 16):
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                with self._arrived:
                    for raw in messages:
                        message = json.loads(raw)
                        if "id" in message:
                            self._answered[message["id"]] = message
                        else:
                            self.events.append(message)
                    self._arrived.notify_all()

    def send(self, method: str, params: Optional[Dict] = None, session: Optional[str] = None,
             timeout: float = 60) -> Dict:
        """Send one command; its result (CDPError on an error answer or a timeout)."""
        with self._lock:
            self._next += 1
            ident = self._next
            message: Dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
            if session is not None:
                message["sessionId"] = session
            os.write(self._commands, json.dumps(message).encode() + b"\0")
        with self._arrived:
            if not self._arrived.wait_for(lambda: ident in self._answered, timeout):
                raise CDPError(f"{method}: no answer within {timeout:g} s "
                               f"(browser log: {self.log})")
            answer = self._answered.pop(ident)
        if "error" in answer:
            raise CDPError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def page(self, width: int = 1440, height: int = 900) -> "Page":
        """A new tab of ``width`` x ``height`` CSS pixels, with the network log on."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target,
                                                      "flatten": True})["sessionId"]
        page = Page(self, session, target)
        for domain in ("Page", "Runtime", "Network", "DOM", "Log"):
            page.send(f"{domain}.enable")
        page.resize(width, height)
        return page

    def close(self) -> None:
        """Ask Chromium to quit; kill it if it does not within 10 s."""
        try:
            self.send("Browser.close", timeout=10)
        except (CDPError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._commands)


class Page:
    """One attached tab: navigate, evaluate JavaScript, wait, type, upload, screenshot."""

    def __init__(self, browser: Browser, session: str, target: str) -> None:
        self.browser, self.session, self.target = browser, session, target

    def send(self, method: str, params: Optional[Dict] = None, timeout: float = 60) -> Dict:
        return self.browser.send(method, params, self.session, timeout)

    def goto(self, url: str, timeout: float = 60) -> None:
        """Navigate and wait until the document and its scripts have loaded."""
        self.send("Page.navigate", {"url": url})
        self.wait_for(f"location.href === {json.dumps(url)} && "
                      "document.readyState === 'complete'", timeout)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` (promises awaited); CDPError on a JS exception."""
        result = self.send("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise CDPError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, predicate: str, timeout: float = 60) -> Any:
        """Poll the JS ``predicate`` every 50 ms until truthy; its value (TimeoutError)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(f"(() => {{ try {{ return {predicate}; }} "
                                  "catch (e) { return null; } })()")
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{predicate}: not true within {timeout:g} s")
            time.sleep(0.05)

    def set_files(self, selector: str, paths: List[Path]) -> None:
        """Give the file input ``selector`` these files, as a user picking them would (the
        input's change event fires)."""
        root = self.send("DOM.getDocument")["root"]["nodeId"]
        node = self.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
        self.send("DOM.setFileInputFiles", {"nodeId": node, "files": [str(p) for p in paths]})

    def key(self, name: str, times: int = 1) -> None:
        """Press and release the key ``name`` (KEYS) on the focused element."""
        code = KEYS[name]
        for _ in range(times):
            for kind in ("rawKeyDown", "keyUp"):
                params = {"type": kind, "key": name, "code": name,
                          "windowsVirtualKeyCode": code, "nativeVirtualKeyCode": code}
                if name == "Enter" and kind == "rawKeyDown":
                    params.update(type="keyDown", text="\r")
                self.send("Input.dispatchKeyEvent", params)

    def drop_files(self, selector: str, paths: List[Path]) -> None:
        """Drag ``paths`` from outside the page and drop them on the centre of ``selector``
        (the browser's own drag events: dragenter, dragover, drop)."""
        x, y = self.evaluate(f"(r => [r.left + r.width / 2, r.top + r.height / 2])"
                             f"(document.querySelector({json.dumps(selector)})"
                             ".getBoundingClientRect())")
        data = {"items": [], "files": [str(p) for p in paths], "dragOperationsMask": 1}
        for kind in ("dragEnter", "dragOver", "drop"):
            self.send("Input.dispatchDragEvent", {"type": kind, "x": x, "y": y, "data": data})

    def type_text(self, text: str) -> None:
        """Type ``text`` into the focused element (as an input method would commit it)."""
        self.send("Input.insertText", {"text": text})

    def resize(self, width: int, height: int) -> None:
        """The viewport in CSS pixels (device scale 1)."""
        self.send("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def screenshot(self, width: int) -> bytes:
        """A PNG of the whole page laid out ``width`` CSS pixels wide."""
        self.resize(width, 800)
        height = int(self.evaluate("document.documentElement.scrollHeight"))
        self.resize(width, height)
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        return base64.b64decode(data)

    def requests(self) -> List[Dict]:
        """The network log of this tab: every request's method and URL, in order."""
        return [e["params"]["request"] for e in list(self.browser.events)
                if e.get("sessionId") == self.session
                and e["method"] == "Network.requestWillBeSent"]

    def responses(self) -> List[Dict]:
        """Each response this tab received: url, status (Network.responseReceived)."""
        return [e["params"]["response"] for e in list(self.browser.events)
                if e.get("sessionId") == self.session
                and e["method"] == "Network.responseReceived"]

    def errors(self) -> List[str]:
        """Uncaught script exceptions and the browser's error messages about this tab (a
        refused Content-Security-Policy, say), except failed HTTP statuses, which the page
        reports itself."""
        found = []
        for e in list(self.browser.events):
            if e.get("sessionId") != self.session:
                continue
            if e["method"] == "Runtime.exceptionThrown":
                found.append(json.dumps(e["params"]["exceptionDetails"])[:500])
            entry = e["params"].get("entry", {}) if e["method"] == "Log.entryAdded" else {}
            if entry.get("level") == "error" and entry.get("source") != "network":
                found.append(f"{entry.get('source')}: {entry.get('text')}")
        return found

    def close(self) -> None:
        self.browser.send("Target.closeTarget", {"targetId": self.target})
