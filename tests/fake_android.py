"""A fake Android phone that speaks uiautomator2's real wire protocol.

The HTTP side is the on-device server's: GET /ping -> "pong", POST /jsonrpc/0 with JSON-RPC 2.0
bodies (takeScreenshot, click, swipe, dumpWindowHierarchy, pressKey, setClipboard, ...). Only the
adb transport is replaced (uiautomator2 3.x talks to the device only through adb's tcp:9008 tunnel): FakeAdbDevice.create_connection opens a
TCP socket to this server on 127.0.0.1 instead of adb's tcp:9008 tunnel, and its shell answers
the few commands uiautomator2 runs (md5sum of u2.jar, monkey, input keyevent).

The phone has one screen with a text field, a password field, a button and a Wi-Fi check box
(a click toggles it); clicks hit them by their bounds, so a test can check that the executor
reached the right pixels. Below them, a settings-style list (clickable rows named by the texts
inside them), a disabled switch and a node that is not visible to the user.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import adbutils
from adbutils._proto import ShellReturn
from PIL import Image, ImageDraw

WIDTH, HEIGHT = 540, 1200
WIDGETS = {  # name: (left, top, right, bottom), class, password
    "field": ((40, 200, 500, 280), "android.widget.EditText", False),
    "password": ((40, 320, 500, 400), "android.widget.EditText", True),
    "button": ((170, 500, 370, 600), "android.widget.Button", False),
    "wifi": ((40, 640, 500, 700), "android.widget.CheckBox", False),
}
LABELS = {"button": "OK", "wifi": "Wi-Fi"}
# static nodes after the widgets: a list of two settings rows, a disabled switch, a hidden node
STATIC_NODES = (
    '<node index="0" class="androidx.recyclerview.widget.RecyclerView" scrollable="true" bounds="[0,740][540,1000]">'
    '<node index="0" class="android.widget.LinearLayout" clickable="true" bounds="[0,740][540,860]">'
    '<node index="0" class="android.widget.TextView" text="Display" bounds="[40,760][400,800]" />'
    '<node index="1" class="android.widget.TextView" text="Brightness, dark theme" bounds="[40,800][500,840]" /></node>'
    '<node index="1" class="android.widget.LinearLayout" clickable="true" bounds="[0,860][540,980]">'
    '<node index="0" class="android.widget.TextView" text="Sound" bounds="[40,880][400,920]" /></node></node>'
    '<node index="1" class="android.widget.Switch" text="Airplane mode" checkable="true" checked="false" enabled="false" '
    'bounds="[40,1020][500,1080]" />'
    '<node index="2" class="android.widget.Button" text="Hidden" clickable="true" visible-to-user="false" bounds="[40,1100][500,1160]" />'
)


class PhoneState:
    def __init__(self):
        self.lock = threading.Lock()
        self.calls: list[tuple[str, list]] = []
        self.text = {"field": "", "password": ""}
        self.checked = {"wifi": False}
        self.focused: str | None = None
        self.button_presses = 0
        self.long_presses: list[tuple[int, int]] = []
        self.swipes: list[tuple[int, int, int, int]] = []
        self.keys: list[str] = []
        self.clipboard = ""
        self.app = "com.android.launcher"
        self.shell_log: list[str] = []

    def hit(self, x, y) -> str | None:
        for name, ((l, t, r, b), _, _) in WIDGETS.items():
            if l <= x < r and t <= y < b:
                return name
        return None

    def screenshot_jpeg(self) -> bytes:
        img = Image.new("RGB", (WIDTH, HEIGHT), (245, 245, 245))
        d = ImageDraw.Draw(img)
        for name, ((l, t, r, b), _, pw) in WIDGETS.items():
            d.rectangle([l, t, r, b], outline=(0, 0, 0), fill=(255, 255, 255) if name != "button" else (80, 140, 255))
            label = ("*" * len(self.text[name])) if pw else self.text.get(name, LABELS.get(name))
            d.text((l + 10, t + 10), label, fill=(0, 0, 0))
        d.text((10, 10), f"app {self.app}", fill=(0, 0, 0))
        out = io.BytesIO()
        img.save(out, "JPEG", quality=80)
        return out.getvalue()

    def hierarchy(self) -> str:
        nodes = []
        for i, (name, ((l, t, r, b), cls, pw)) in enumerate(WIDGETS.items()):
            text = self.text.get(name, LABELS.get(name))
            check = f'checkable="true" checked="{str(self.checked[name]).lower()}" ' if name in self.checked else ""
            nodes.append(
                f'<node index="{i}" text="{text}" resource-id="fake:id/{name}" class="{cls}" package="{self.app}" '
                f'clickable="true" {check}focused="{str(self.focused == name).lower()}" password="{str(pw).lower()}" '
                f'bounds="[{l},{t}][{r},{b}]" />'
            )
        inner = "".join(nodes) + STATIC_NODES
        return ("<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>\r\n<hierarchy rotation=\"0\">"
                f'<node index="0" class="android.widget.FrameLayout" package="{self.app}" bounds="[0,0][{WIDTH},{HEIGHT}]">'
                f"{inner}</node></hierarchy>")

    def rpc(self, method: str, params):
        params = list(params) if isinstance(params, (list, tuple)) else params
        with self.lock:
            self.calls.append((method, params))
            if method == "takeScreenshot":
                return base64.b64encode(self.screenshot_jpeg()).decode()
            if method == "dumpWindowHierarchy":
                return self.hierarchy()
            if method == "click":
                x, y = params[0], params[1]
                if len(params) > 2:  # click(x, y, ms): a long press
                    self.long_presses.append((x, y))
                    return True
                target = self.hit(x, y)
                if target == "button":
                    self.button_presses += 1
                elif target in self.checked:
                    self.checked[target] = not self.checked[target]
                elif target in self.text:
                    self.focused = target
                return True
            if method == "swipe":
                self.swipes.append(tuple(params[:4]))
                return True
            if method == "pressKey":
                key = params[0]
                self.keys.append(key)
                if key == "home":
                    self.app = "com.android.launcher"
                return True
            if method == "setClipboard":
                self.clipboard = params[1]
                return None
            if method == "getClipboard":
                return self.clipboard
            if method == "pasteClipboard":
                if self.focused:
                    self.text[self.focused] += self.clipboard
                return None
            if method == "deviceInfo":
                return {"displayWidth": WIDTH, "displayHeight": HEIGHT, "displayRotation": 0, "sdkInt": 34}
        raise LookupError(method)

    def shell(self, cmd: str) -> tuple[str, int]:
        with self.lock:
            self.shell_log.append(cmd)
        if "md5sum" in cmd or cmd.startswith("md5 "):
            from uiautomator2.utils import with_package_resource

            with with_package_resource("assets/u2.jar") as jar:
                digest = hashlib.md5(open(jar, "rb").read()).hexdigest()
            return f"{digest}  /data/local/tmp/u2.jar\n", 0
        if cmd.startswith("monkey"):
            parts = cmd.split()
            with self.lock:
                self.app = parts[parts.index("-p") + 1]
            return "Events injected: 1\n", 0
        if cmd.startswith("input keyevent"):
            with self.lock:
                self.keys.append(cmd.split()[-1].lower())
            return "", 0
        return f"/system/bin/sh: {cmd.split()[0]}: inaccessible or not found\n", 127


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):  # keep test output quiet
        pass

    def _send(self, code: int, body: bytes, ctype="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/ping":
            self._send(200, b"pong", "text/plain")
        else:
            self._send(404, b"not found", "text/plain")

    def do_POST(self):
        if self.path != "/jsonrpc/0":
            return self._send(404, b"not found", "text/plain")
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        try:
            result = self.server.phone.rpc(req["method"], req.get("params") or [])
            resp = {"jsonrpc": "2.0", "id": req.get("id"), "result": result}
        except LookupError:
            resp = {"jsonrpc": "2.0", "id": req.get("id"),
                    "error": {"code": -32601, "message": f"java.lang.NoSuchMethodException: {req['method']}", "data": ""}}
        self._send(200, json.dumps(resp).encode())


class FakePhoneServer:
    def __init__(self):
        self.phone = PhoneState()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.phone = self.phone
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class FakeAdbDevice(adbutils.AdbDevice):
    """An adbutils device whose tcp:9008 tunnel is a loopback socket to the fake server."""

    def __init__(self, server: FakePhoneServer, serial: str = "fake-phone-1"):
        adbutils.AdbDevice.__init__(self, client=None, serial=serial)
        self._server = server

    def create_connection(self, network, address):
        assert network == adbutils.Network.TCP and address == 9008, (network, address)
        return socket.create_connection(("127.0.0.1", self._server.port), timeout=10)

    def shell2(self, cmdargs, timeout=None, encoding="utf-8", rstrip=False, v2=False):
        cmd = cmdargs if isinstance(cmdargs, str) else " ".join(str(c) for c in cmdargs)
        out, code = self._server.phone.shell(cmd)
        return ShellReturn(command=cmd, returncode=code, output=out, stdout=out)

    def shell(self, cmdargs, stream=False, timeout=None, encoding="utf-8", rstrip=True):
        if stream:
            raise AssertionError("the fake phone's uiautomator server is always running; nothing should launch it")
        r = self.shell2(cmdargs)
        return r.output.rstrip() if rstrip else r.output


def connect_fake(server: FakePhoneServer):
    """A real uiautomator2 Device wired to the fake phone."""
    import uiautomator2 as u2

    return u2.Device(FakeAdbDevice(server))
