"""Headless Chromium driven over the DevTools protocol (CDP) directly, for the games.

No chromedriver and no Selenium: Chromium runs with `--remote-debugging-pipe`, so it reads CDP
commands (JSON, each ended by a NUL byte) on its fd 3 and writes answers and events on its fd 4;
the base install and Debian's `chromium` package are all a user needs. Chromium is found as for
MiniWoB++ (TANDEM_CHROMIUM names it, else `chromium` and its kin on PATH and in /usr/bin) and reaped
the same way (trainer.sandbox.miniwob_browser): it runs in the process group of a watchdog whose
stdin pipe only this process holds, so when this process ends, SIGKILL included, the watchdog reads
end-of-file and kills the group.

Every call has a timeout; a call that does not answer in time kills the browser and raises
GameBrowserTimeout naming the call. Each CDPBrowser is one Chromium with one page (one
profile directory of its own), so a process may run several.
"""
from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

import numpy as np

from trainer.errors import TrainerError
from trainer.sandbox.miniwob_browser import (
    BINARY_NAMES,
    _end_watchdog,
    _find,
    _start_watchdog,
    group_processes,
)

BINARY_ENV = "TANDEM_CHROMIUM"
# the last three keep a screenshot from waiting for a vsync-paced frame (about 40 ms a screenshot down to 15)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-default-apps", "--mute-audio",
         "--hide-scrollbars", "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
         "--disable-backgrounding-occluded-windows", "--force-color-profile=srgb", "--disable-lcd-text",
         "--font-render-hinting=none", "--remote-debugging-pipe",
         "--disable-gpu-compositing", "--disable-gpu-vsync", "--disable-frame-rate-limit")
PROFILE_ROOT = os.path.join(tempfile.gettempdir(), f"tandem-games-{os.getuid() if hasattr(os, 'getuid') else 0}")

# what Input.dispatchKeyEvent needs so that a page's keydown handler sees the right e.key / e.code / e.keyCode
NAMED_KEYS = {  # UI-TARS word -> (key, code, keyCode, text)
    "up": ("ArrowUp", "ArrowUp", 38, ""), "down": ("ArrowDown", "ArrowDown", 40, ""),
    "left": ("ArrowLeft", "ArrowLeft", 37, ""), "right": ("ArrowRight", "ArrowRight", 39, ""),
    "space": (" ", "Space", 32, " "), "enter": ("Enter", "Enter", 13, "\r"), "tab": ("Tab", "Tab", 9, ""),
    "esc": ("Escape", "Escape", 27, ""), "backspace": ("Backspace", "Backspace", 8, ""),
    "delete": ("Delete", "Delete", 46, ""), "home": ("Home", "Home", 36, ""), "end": ("End", "End", 35, ""),
    "pageup": ("PageUp", "PageUp", 33, ""), "pagedown": ("PageDown", "PageDown", 34, ""),
    "insert": ("Insert", "Insert", 45, ""),
    **{f"f{i}": (f"F{i}", f"F{i}", 111 + i, "") for i in range(1, 13)},
}
MODIFIER_KEYS = {  # word -> (key, code, keyCode, CDP modifier bit)
    "alt": ("Alt", "AltLeft", 18, 1), "ctrl": ("Control", "ControlLeft", 17, 2),
    "cmd": ("Meta", "MetaLeft", 91, 4), "win": ("Meta", "MetaLeft", 91, 4), "shift": ("Shift", "ShiftLeft", 16, 8),
}
PUNCTUATION = {  # char -> (code, keyCode) on a US layout; the char is key and text
    "-": ("Minus", 189), "=": ("Equal", 187), "[": ("BracketLeft", 219), "]": ("BracketRight", 221),
    ";": ("Semicolon", 186), "'": ("Quote", 222), ",": ("Comma", 188), ".": ("Period", 190), "/": ("Slash", 191),
    "\\": ("Backslash", 220), "`": ("Backquote", 192),
}


class GameBrowserError(TrainerError, RuntimeError):
    """Chromium cannot run for the games, or a DevTools call failed; the message says which."""


class GameBrowserTimeout(GameBrowserError):
    """A DevTools call did not answer in time; Chromium was killed."""


def find_chromium(environ=None) -> str:
    """The Chromium binary: $TANDEM_CHROMIUM, else chromium (or chromium-browser, google-chrome) on
    PATH or in /usr/bin. Raises GameBrowserError saying how to install it."""
    env = os.environ if environ is None else environ
    path = env.get(BINARY_ENV, "")
    if path:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise GameBrowserError(f"{BINARY_ENV}={path!r} is not an executable file")
        return path
    found = _find(BINARY_NAMES)
    if not found:
        raise GameBrowserError(f"chromium is not installed (apt-get install chromium, or set {BINARY_ENV} to a "
                               "Chromium or Chrome binary)")
    return found


def key_event(word: str, shift: bool = False) -> dict:
    """The Input.dispatchKeyEvent fields of one key: a UI-TARS key word ('up', 'space', 'enter',
    'f5') or one character ('a', 'A', '7', '-'). ValueError naming a key it does not know."""
    if word in NAMED_KEYS:
        key, code, vk, text = NAMED_KEYS[word]
    elif len(word) == 1:
        c = word
        if c.isalpha() and c.isascii():
            key = c.upper() if shift else c
            code, vk, text = f"Key{c.upper()}", ord(c.upper()), key
        elif c.isdigit() and c.isascii():
            key, code, vk, text = c, f"Digit{c}", ord(c), c
        elif c in PUNCTUATION:
            code, vk = PUNCTUATION[c]
            key, text = c, c
        elif c == " ":
            key, code, vk, text = NAMED_KEYS["space"]
        elif c.isprintable():  # a character with no key of its own on a US keyboard: its text alone
            key, code, vk, text = c, "", 0, c
        else:
            raise ValueError(f"no key for the character {c!r}")
    else:
        raise ValueError(f"unknown key {word!r} (known: letters, digits, {', '.join(sorted(NAMED_KEYS))})")
    return {"key": key, "code": code, "windowsVirtualKeyCode": vk, "nativeVirtualKeyCode": vk, "text": text,
            "unmodifiedText": text}


def _sweep_profiles() -> None:
    """Remove the profile directories of processes that have ended (killed before they could)."""
    try:
        names = os.listdir(PROFILE_ROOT)
    except OSError:
        return
    for name in names:
        try:
            pid = int(name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(os.path.join(PROFILE_ROOT, name), ignore_errors=True)


class CDPBrowser:
    """One headless Chromium with one page, over the DevTools pipe. `call(method, params)` sends a
    command to the page's session and returns its result; `kill()` ends Chromium at once (any
    thread may call it); `close()` asks politely first."""

    def __init__(self, proc, watchdog, profile: str, to_chrome: int, from_chrome: int, timeout: float):
        self.proc, self.watchdog, self.profile = proc, watchdog, profile
        self._out, self._in = to_chrome, from_chrome
        self.timeout = timeout
        self._buf = b""
        self._next_id = 0
        self.session: str | None = None
        self.events: list[dict] = []  # events read while waiting for answers (the last few hundred)
        self._killed = False

    # ------------------------------------------------------------ start and end
    @classmethod
    def launch(cls, *, width: int, height: int, timeout: float = 30.0) -> CDPBrowser:
        binary = find_chromium()
        os.makedirs(PROFILE_ROOT, exist_ok=True)
        _sweep_profiles()
        profile = tempfile.mkdtemp(prefix=f"p-{os.getpid()}-", dir=PROFILE_ROOT)
        watchdog = _start_watchdog()
        cmd_r, cmd_w = os.pipe()
        ans_r, ans_w = os.pipe()
        # Chromium reads fd 3 and writes fd 4; its ends are moved above 10 first so bash's
        # redirections cannot clobber one another (dash takes single-digit fds only)
        hi_r, hi_w = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(ans_w, fcntl.F_DUPFD, 10)
        os.close(cmd_r)
        os.close(ans_w)
        args = [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"]
        shell = f'exec "$@" 3<&{hi_r} 4>&{hi_w} {hi_r}<&- {hi_w}>&-'
        kw = {"process_group": watchdog.pid} if watchdog else {"start_new_session": True}
        try:
            proc = subprocess.Popen([shutil.which("bash") or "/bin/bash", "-c", shell, "bash", *args], pass_fds=(hi_r, hi_w),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
        except OSError as e:
            for fd in (hi_r, hi_w, cmd_w, ans_r):
                os.close(fd)
            _end_watchdog(watchdog)
            shutil.rmtree(profile, ignore_errors=True)
            raise GameBrowserError(f"Chromium did not start ({binary}): {e}") from e
        os.close(hi_r)
        os.close(hi_w)
        os.set_blocking(cmd_w, False)
        browser = cls(proc, watchdog, profile, cmd_w, ans_r, timeout)
        try:
            browser._open_page(width, height, binary)
        except BaseException:
            browser.kill()
            raise
        return browser

    def _open_page(self, width: int, height: int, binary: str) -> None:
        try:
            targets = self.call("Target.getTargets", session=False, what=f"starting Chromium ({binary})")
        except GameBrowserError as e:
            raise GameBrowserError(f"Chromium did not start ({binary}): {e}") from e
        pages = [t for t in targets["targetInfos"] if t["type"] == "page"]
        target = pages[0]["targetId"] if pages else self.call(
            "Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    @property
    def pgid(self) -> int | None:
        """The process group of Chromium (the watchdog's; None where there is no watchdog)."""
        return self.watchdog.pid if self.watchdog else None

    @property
    def alive(self) -> bool:
        return not self._killed and self.proc.poll() is None

    def kill(self) -> None:
        """Kill every Chromium process now and forget the profile. Idempotent."""
        if self._killed:
            return
        self._killed = True
        if self.watchdog:
            _end_watchdog(self.watchdog)
        elif self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for fd in (self._out, self._in):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def close(self, timeout: float = 5.0) -> None:
        """Ask Chromium to close (Browser.close, within `timeout` seconds), then kill what is left."""
        if self._killed:
            return
        try:
            self.call("Browser.close", session=False, timeout=timeout)
        except GameBrowserError:
            pass
        finally:
            self.kill()

    def __del__(self):
        try:
            self.kill()
        except Exception:  # interpreter shutdown: the watchdog reaps Chromium anyway
            pass

    # ------------------------------------------------------------ the protocol
    def call(self, method: str, params: dict | None = None, *, session: bool = True, timeout: float | None = None,
             what: str | None = None) -> dict:
        """Send one command and wait for its answer (events meanwhile are kept in `events`). An
        error answer raises GameBrowserError; no answer within `timeout` (default: the browser's)
        kills Chromium and raises GameBrowserTimeout naming `what` (default: the method)."""
        if self._killed:
            raise GameBrowserError(f"{what or method}: Chromium is not running (it was closed or killed)")
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        self._next_id += 1
        mid = self._next_id
        msg = {"id": mid, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        try:
            self._write(json.dumps(msg).encode() + b"\0", deadline, what or method, limit)
            while True:
                for m in self._read(deadline, what or method, limit):
                    if m.get("id") == mid:
                        if "error" in m:
                            err = m["error"]
                            raise GameBrowserError(f"{what or method}: {err.get('message')} {err.get('data', '')}".rstrip())
                        return m.get("result", {})
                    if "method" in m:
                        self.events.append(m)
                        del self.events[:-200]
        except OSError as e:
            self.kill()
            raise GameBrowserError(f"{what or method}: the pipe to Chromium broke ({e}); Chromium was killed") from e

    def _expired(self, what: str, limit: float):
        self.kill()
        return GameBrowserTimeout(f"{what} did not answer within {limit:g} s; Chromium was killed")

    def _write(self, data: bytes, deadline: float, what: str, limit: float) -> None:
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._expired(what, limit)
            _, w, _ = select.select([], [self._out], [], left)
            if w:
                n = os.write(self._out, view)
                view = view[n:]

    def _read(self, deadline: float, what: str, limit: float) -> list[dict]:
        """The whole messages that are there (waiting for at least one)."""
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._expired(what, limit)
            r, _, _ = select.select([self._in], [], [], left)
            if r:
                chunk = os.read(self._in, 1 << 20)
                if not chunk:
                    self.kill()
                    raise GameBrowserError(f"{what}: Chromium closed the DevTools pipe (it crashed or was killed)")
                self._buf += chunk
        *whole, self._buf = self._buf.split(b"\0")
        return [json.loads(w) for w in whole if w]

    # ------------------------------------------------------------ the page
    def evaluate(self, expression: str, *, timeout: float | None = None, what: str | None = None):
        """The value of a JavaScript expression in the page (awaited when it is a promise);
        GameBrowserError with the page's exception when it throws."""
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                        timeout=timeout, what=what)
        if "exceptionDetails" in res:
            d = res["exceptionDetails"]
            text = d.get("exception", {}).get("description") or d.get("text", "")
            raise GameBrowserError(f"{what or 'the page'}: {text.splitlines()[0] if text else d}")
        return res["result"].get("value")

    def add_init_script(self, source: str) -> None:
        """Run `source` in every new document before the page's own scripts."""
        self.call("Page.addScriptToEvaluateOnNewDocument", {"source": source})

    def navigate(self, url: str, ready: str, *, timeout: float | None = None) -> None:
        """Load `url` and wait until the expression `ready` is true in it."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        res = self.call("Page.navigate", {"url": url}, timeout=limit, what=f"loading {url}")
        if res.get("errorText"):
            raise GameBrowserError(f"loading {url}: {res['errorText']}")
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._expired(f"loading {url}", limit)
            try:
                if self.evaluate(f"document.readyState === 'complete' && !!({ready})", timeout=left,
                                 what=f"loading {url}"):
                    return
            except GameBrowserTimeout:
                raise
            except GameBrowserError:  # the new document is not there yet
                pass
            time.sleep(0.005)

    def screenshot(self, width: int, height: int) -> np.ndarray:
        """The page's top-left width x height CSS pixels as RGB uint8 (height, width, 3)."""
        from PIL import Image

        res = self.call("Page.captureScreenshot",
                        {"format": "png", "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
                         "optimizeForSpeed": True, "captureBeyondViewport": False}, what="a screenshot")
        img = Image.open(io.BytesIO(base64.b64decode(res["data"]))).convert("RGB")
        arr = np.asarray(img, dtype=np.uint8)
        if arr.shape[:2] != (height, width):
            raise GameBrowserError(f"a screenshot came back {arr.shape[1]}x{arr.shape[0]}, not {width}x{height}")
        return arr

    # ------------------------------------------------------------ input
    def mouse(self, kind: str, x: float, y: float, *, button: str = "none", clicks: int = 0, buttons: int = 0,
              dx: float = 0.0, dy: float = 0.0) -> None:
        params = {"type": kind, "x": float(x), "y": float(y), "button": button, "clickCount": clicks,
                  "buttons": buttons}
        if kind == "mouseWheel":
            params.update(deltaX=float(dx), deltaY=float(dy))
        self.call("Input.dispatchMouseEvent", params, what=f"a mouse event ({kind} at {x:.0f},{y:.0f})")

    def click(self, x: float, y: float, *, button: str = "left", count: int = 1) -> None:
        mask = {"left": 1, "right": 2, "middle": 4}[button]
        self.mouse("mouseMoved", x, y)
        for n in range(1, count + 1):
            self.mouse("mousePressed", x, y, button=button, clicks=n, buttons=mask)
            self.mouse("mouseReleased", x, y, button=button, clicks=n)

    def drag(self, x0: float, y0: float, x1: float, y1: float, moves: int = 5) -> None:
        self.mouse("mouseMoved", x0, y0)
        self.mouse("mousePressed", x0, y0, button="left", clicks=1, buttons=1)
        for i in range(1, moves + 1):
            t = i / moves
            self.mouse("mouseMoved", x0 + (x1 - x0) * t, y0 + (y1 - y0) * t, button="left", buttons=1)
        self.mouse("mouseReleased", x1, y1, button="left", clicks=1)

    def wheel(self, x: float, y: float, dx: float, dy: float) -> None:
        self.mouse("mouseMoved", x, y)
        self.mouse("mouseWheel", x, y, dx=dx, dy=dy)

    def press(self, combo: list[str]) -> None:
        """Press a chord: modifiers (e.g. ['ctrl', 'a']) held while the last keys are pressed in turn."""
        mods = [k for k in combo if k in MODIFIER_KEYS]
        keys = [k for k in combo if k not in MODIFIER_KEYS]
        if not keys:
            raise ValueError(f"{' '.join(combo)!r} names modifiers alone: add the key they go with")
        events = [key_event(k, shift="shift" in mods) for k in keys]  # ValueError before anything is pressed
        bits = 0
        for m in mods:
            key, code, vk, bit = MODIFIER_KEYS[m]
            bits |= bit
            self._key("rawKeyDown", {"key": key, "code": code, "windowsVirtualKeyCode": vk, "modifiers": bits})
        for ev in events:
            self.key_stroke(ev, bits)
        for m in reversed(mods):
            key, code, vk, bit = MODIFIER_KEYS[m]
            bits &= ~bit
            self._key("keyUp", {"key": key, "code": code, "windowsVirtualKeyCode": vk, "modifiers": bits})

    def key_stroke(self, ev: dict, modifiers: int = 0) -> None:
        """keydown (with its text, so a keypress / input follows, unless ctrl/alt/meta are held), keyup."""
        text = ev["text"] if not modifiers & 0b111 else ""
        down = {**ev, "text": text, "unmodifiedText": text if text else "", "modifiers": modifiers}
        self._key("keyDown" if text else "rawKeyDown", down)
        self._key("keyUp", {k: v for k, v in ev.items() if k not in ("text", "unmodifiedText")} | {"modifiers": modifiers})

    def _key(self, kind: str, params: dict) -> None:
        self.call("Input.dispatchKeyEvent", {"type": kind, **params}, what=f"a key event ({kind} {params.get('key')!r})")


def chromium_processes(pgid: int) -> list[int]:
    """Live processes of Chromium's process group (the watchdog's), from /proc."""
    return group_processes(pgid)
