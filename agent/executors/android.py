"""An Android phone through uiautomator2 (the on-device JSON-RPC server, reached over adb).

uiautomator2 3.x talks to the phone only through adb's tcp:9008 tunnel, and `u2.connect()`
starts an adb server, so the connection is made on first use (reset/observe), never at import or
construction. Android input coordinates are screenshot pixels, so the geometry is the
screenshot's own size at scale 1.
"""
from __future__ import annotations

import threading
import xml.etree.ElementTree as ET

from agent import coords
from agent.executors.base import ExecutionError, Frame, interruptible_sleep
from agent.schema import Action, ScreenGeometry, monotonic

# open_app(app_name='Settings'): the name a model writes -> the package to start.
DEFAULT_APPS = {
    "settings": "com.android.settings", "chrome": "com.android.chrome", "camera": "com.android.camera2",
    "contacts": "com.android.contacts", "phone": "com.android.dialer", "messages": "com.google.android.apps.messaging",
    "clock": "com.google.android.deskclock", "calendar": "com.google.android.calendar", "files": "com.google.android.documentsui",
    "play store": "com.android.vending", "gmail": "com.google.android.gm", "maps": "com.google.android.apps.maps",
    "youtube": "com.google.android.youtube", "calculator": "com.google.android.calculator", "photos": "com.google.android.apps.photos",
}


def focused_password(hierarchy_xml: str) -> bool:
    """True when the focused node of a uiautomator hierarchy dump is a password field."""
    try:
        root = ET.fromstring(hierarchy_xml.encode("utf-8") if isinstance(hierarchy_xml, str) else hierarchy_xml)
    except ET.ParseError:
        return False
    return any(n.get("focused") == "true" and n.get("password") == "true" for n in root.iter("node"))


class AndroidExecutor:
    platform = "android"

    def __init__(self, device=None, *, serial: str | None = None, apps: dict | None = None, settle: float = 0.3,
                 wait_seconds: float = 5.0, long_press_seconds: float = 1.0, swipe_seconds: float = 0.3,
                 with_hierarchy: bool = True, stop_event=None):
        """device: a connected uiautomator2 Device; else `serial` (or $ANDROID_SERIAL) is
        connected on first use."""
        self._device = device
        self.serial = serial
        self.apps = {**DEFAULT_APPS, **{k.lower(): v for k, v in (apps or {}).items()}}
        self.settle = settle
        self.wait_seconds = wait_seconds
        self.long_press_seconds = long_press_seconds
        self.swipe_seconds = swipe_seconds
        self.with_hierarchy = with_hierarchy
        self.stop_event = stop_event or threading.Event()
        self._last: Frame | None = None

    @property
    def device(self):
        if self._device is None:
            try:
                import uiautomator2 as u2

                self._device = u2.connect(self.serial)
            except Exception as e:  # noqa: BLE001 - adb/uiautomator2 raise many types; say which device failed
                raise ExecutionError(f"cannot connect to the Android device {self.serial or '(default)'}: {e}") from None
        return self._device

    # ---------------------------------------------------------------- observe
    def observe(self) -> Frame:
        import numpy as np

        d = self.device
        t = monotonic()
        img = d.screenshot()  # PIL, from the server's takeScreenshot (JPEG)
        if img is None:
            raise ExecutionError("the device returned no screenshot")
        img = img.convert("RGB")
        extra = {}
        if self.with_hierarchy:
            xml = d.dump_hierarchy()
            extra["hierarchy"] = xml
            extra["password_focused"] = focused_password(xml)
        geometry = ScreenGeometry.simple(img.width, img.height)
        self._last = Frame(geometry=geometry, pixels=np.asarray(img), time=t, extra=extra)
        return self._last

    def reset(self, *, seed=None, options=None):
        # the stop flag is not cleared here: its owner (AgentLoop) clears it when a run is set up
        return self.observe(), {}

    # ---------------------------------------------------------------- act
    def _px(self, p, geometry) -> tuple[int, int]:
        x, y = coords.normalized_to_screen(p, geometry)
        # uiautomator2 reads numbers below 1 as fractions of the screen: pixel 0 becomes 1
        return max(1, x), max(1, y)

    def step(self, action: Action):
        geometry = (self._last or self.observe()).geometry
        info = self.execute(action, geometry)
        if action.name != "wait" and self.settle:
            interruptible_sleep(self.settle, self.stop_event)
        frame = self.observe()
        return frame, 0.0, action.name in ("finished", "call_user"), False, info

    def execute(self, action: Action, geometry: ScreenGeometry) -> dict:
        d, a, name = self.device, action.args, action.name
        if name in ("finished", "call_user"):
            return {}
        if name == "wait":
            interruptible_sleep(self.wait_seconds, self.stop_event)
            return {}
        if name == "click":
            x, y = self._px(a["start_box"], geometry)
            d.click(x, y)
            return {"screen_point": [x, y]}
        if name == "long_press":
            x, y = self._px(a["start_box"], geometry)
            d.long_click(x, y, duration=self.long_press_seconds)
            return {"screen_point": [x, y]}
        if name == "drag":
            (x1, y1), (x2, y2) = self._px(a["start_box"], geometry), self._px(a["end_box"], geometry)
            d.swipe(x1, y1, x2, y2, duration=self.swipe_seconds)
            return {"screen_points": [[x1, y1], [x2, y2]]}
        if name == "scroll":
            x, y = self._px(a.get("start_box", (0.5, 0.5)), geometry)
            # scrolling down shows what is below: the finger moves up
            dist_y, dist_x = geometry.logical_height // 3, geometry.logical_width // 3
            dx, dy = {"down": (0, -dist_y), "up": (0, dist_y), "right": (-dist_x, 0), "left": (dist_x, 0)}[a["direction"]]
            x2 = min(geometry.logical_width - 1, max(1, x + dx))
            y2 = min(geometry.logical_height - 1, max(1, y + dy))
            d.swipe(x, y, x2, y2, duration=self.swipe_seconds)
            return {"screen_points": [[x, y], [x2, y2]]}
        if name == "type":
            text = a["content"]
            body, submit = (text[:-1], True) if text.endswith("\n") else (text, False)
            if body:
                d.send_keys(body)  # clipboard + paste: the only route that keeps non-ASCII on Android
            if submit:
                d.press("enter")
            return {"typed": text}
        if name == "press_home":
            d.press("home")
            return {"key": "home"}
        if name == "press_back":
            d.press("back")
            return {"key": "back"}
        if name == "open_app":
            pkg = self.package_for(a["app_name"])
            d.app_start(pkg)
            return {"package": pkg}
        raise ExecutionError(f"Android cannot execute {name!r}")

    def package_for(self, app_name: str) -> str:
        name = app_name.strip()
        if name.lower() in self.apps:
            return self.apps[name.lower()]
        if "." in name and " " not in name:  # already a package name
            return name
        raise ExecutionError(f"unknown app {app_name!r}: add it to the executor's apps map (name -> package)")

    # ---------------------------------------------------------------- safety
    def release(self) -> None:
        # uiautomator2 gestures are single RPCs that end by themselves; stop further waits
        self.stop_event.set()

    def close(self) -> None:
        d, self._device = self._device, None
        if d is not None and hasattr(d, "stop_uiautomator"):
            try:
                d.stop_uiautomator(wait=False)
            except Exception:  # noqa: BLE001 - the phone may be gone already; nothing to keep
                pass
