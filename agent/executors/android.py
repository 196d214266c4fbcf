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
from agent.elements import STATES, Element
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


# android.widget class (last part of the name) -> agent.elements.ROLES
CLASS_ROLES = {
    "Button": "button", "ImageButton": "button", "FloatingActionButton": "button", "MaterialButton": "button",
    "CheckBox": "checkbox", "Switch": "checkbox", "SwitchCompat": "checkbox", "SwitchMaterial": "checkbox",
    "ToggleButton": "checkbox", "CheckedTextView": "checkbox", "MaterialCheckBox": "checkbox",
    "RadioButton": "radio", "MaterialRadioButton": "radio",
    "EditText": "text_field", "AutoCompleteTextView": "text_field", "MultiAutoCompleteTextView": "text_field",
    "TextInputEditText": "text_field", "SearchView": "text_field",
    "SeekBar": "slider", "RatingBar": "slider", "Slider": "slider",
    "Spinner": "combo", "Tab": "tab", "TabView": "tab",
}
LISTS = ("ListView", "RecyclerView", "GridView", "ExpandableListView")  # a clickable child of these is a list item


def _bounds(text: str | None):
    """uiautomator's bounds="[x0,y0][x1,y1]" -> (x0, y0, x1, y1), or None."""
    try:
        a, b = (text or "").strip("[]").split("][")
        x0, y0 = (int(v) for v in a.split(","))
        x1, y1 = (int(v) for v in b.split(","))
    except ValueError:
        return None
    return x0, y0, x1, y1


def _texts(node) -> list[str]:
    """The texts and descriptions inside a node, in order (a clickable row's name)."""
    return [t for n in node.iter("node") for t in (n.get("text"), n.get("content-desc")) if t and t.strip()]


def hierarchy_elements(hierarchy_xml: str, width: int, height: int, scale: float = 1.0) -> list:
    """A uiautomator hierarchy dump -> [agent.elements.Element] in screenshot pixels (device pixels
    times `scale`, cut to the width x height screenshot). Listed: visible nodes that can be acted on
    (buttons, check boxes, switches, fields, sliders, spinners, anything clickable or checkable) and
    visible texts and described images; a
    clickable container (a settings row) is named by the texts inside it, which are then not listed
    again. A password field gets the state "password" and never a value. Raises ValueError on XML
    that does not parse."""
    try:
        root = ET.fromstring(hierarchy_xml.encode("utf-8") if isinstance(hierarchy_xml, str) else hierarchy_xml)
    except ET.ParseError as e:
        raise ValueError(f"the UI hierarchy is not XML: {e}") from None
    out, named_by_parent = [], set()

    def box_of(node):
        b = _bounds(node.get("bounds"))
        if b is None:
            return None
        x0, y0, x1, y1 = (round(v * scale) for v in b)
        x0, y0, x1, y1 = max(0, x0), max(0, y0), min(width, x1), min(height, y1)
        return (x0, y0, x1, y1) if x0 < x1 and y0 < y1 else None

    def visit(node, parent_cls: str):
        cls = (node.get("class") or "").rsplit(".", 1)[-1]
        on = lambda k: node.get(k) == "true"
        if node.get("visible-to-user") == "false":
            return
        box = box_of(node)
        text, desc = (node.get("text") or "").strip(), (node.get("content-desc") or "").strip()
        role = CLASS_ROLES.get(cls)
        if role is None and on("checkable"):
            role = "checkbox"
        if role is None and on("clickable"):  # a clickable TextView, ImageView or row
            role = "list_item" if parent_cls in LISTS else "button"
        if role is None and (text or desc) and id(node) not in named_by_parent:
            role = "image" if "Image" in cls else "label"
        if box is not None and role is not None and id(node) not in named_by_parent:
            password = on("password")
            if role == "text_field" or password:  # a password's text is never a name or a value
                hint = (node.get("hint") or "").strip()
                rid = (node.get("resource-id") or "").rsplit("/", 1)[-1]
                name, value = desc or hint or rid, (None if password or not text or text == hint else text)
            else:
                name, value = text or desc, None
                if not name and role in ("button", "list_item", "checkbox", "radio", "tab"):
                    inner = [n for n in node.iter("node") if n is not node and (n.get("text") or n.get("content-desc") or "").strip()]
                    if inner:
                        name = " \u00b7 ".join(_texts(node)[:2])  # a row's title and summary
                        named_by_parent.update(id(n) for n in inner if not (n.get("clickable") == "true" or n.get("checkable") == "true"))
                if role == "slider" and text:
                    value = text
            states = {s for s in ("checked", "selected", "focused") if on(s)}
            if node.get("enabled") == "false":
                states.add("disabled")
            if password:
                states.add("password")
            out.append(Element(role, name, box, tuple(sorted(states, key=STATES.index)), value))
        for child in node.findall("node"):
            visit(child, cls)

    for top in root.findall("node"):
        visit(top, "")
    return out


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
        self._scales: dict[tuple[int, int], float] = {}  # screenshot size -> screenshot px per device px

    @property
    def device(self):
        if self._device is None:
            try:
                import uiautomator2 as u2

                self._device = u2.connect(self.serial)
            except Exception as e:  # adb/uiautomator2 raise many types; say which device failed
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
        elements, source = None, "none: the UI hierarchy is not read (with_hierarchy is off)"
        if self.with_hierarchy:
            xml = d.dump_hierarchy()
            extra["hierarchy"] = xml
            extra["password_focused"] = focused_password(xml)
            try:
                elements = hierarchy_elements(xml, img.width, img.height, self._scale(img.width, img.height))
                source = "uiautomator2"
            except ValueError as e:
                source = f"none: {e}"
        geometry = ScreenGeometry.simple(img.width, img.height)
        self._last = Frame(geometry=geometry, pixels=np.asarray(img), time=t, extra=extra, elements=elements,
                           elements_source=source)
        return self._last

    def _scale(self, width: int, height: int) -> float:
        """Screenshot pixels per device pixel (the hierarchy's bounds are device pixels), asked of
        the device once per screenshot size. uiautomator2 takes full-size screenshots, so it is 1
        where either side matches the display's (its height may leave out the navigation bar)."""
        if (width, height) not in self._scales:
            try:
                info = self.device.info
                dw, dh = int(info["displayWidth"]), int(info["displayHeight"])
            except Exception:  # an older server: assume full size, as uiautomator2 takes it
                dw = dh = 0
            sides = {dw, dh}
            self._scales[(width, height)] = (1.0 if width in sides or height in sides or min(dw, dh) <= 0
                                             else min(width, height) / min(dw, dh))
        return self._scales[(width, height)]

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
            except Exception:  # the phone may be gone already; nothing to keep
                pass
