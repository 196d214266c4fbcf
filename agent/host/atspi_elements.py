"""Element lists on Linux desktops: the active application's accessibility tree (AT-SPI 2, read
over D-Bus with jeepney, as agent.host.password_focus does) as agent.elements.Element, boxes in the
screenshot's pixels. Qt-free.

Which window: the top-level window AT-SPI marks ACTIVE, with the popups (menus, tooltips, combo
lists) its application shows beside it; where no window is active (no window manager: X focus
follows the pointer), the showing windows of the application that owns the focused X window
(`focused_pid`). This process's own windows are never listed.

What is listed: nodes that are SHOWING, whose role maps onto agent.elements.ROLES (push button ->
button, check box -> checkbox, text / entry / password text -> text_field, ...), boxes from
Component.GetExtents in screen coordinates, turned into screenshot pixels with the frame's
ScreenGeometry (origin, logical size, physical size) and cut to the screenshot and to the
scrolling container they sit in (a list's rows scrolled out of view are dropped). A password
field gets the state "password" and never a value. Reading is bounded (depth, nodes visited,
children per node, elements kept, and a time budget) so a huge tree (a browser, a spreadsheet)
cannot stall recording; calls are pipelined, one round trip per tree level.

Where there is no accessibility bus, `read` answers (None, "none: <why>").
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from agent.elements import Element
from agent.host.password_focus import a11y_bus_address
from agent.schema import ScreenGeometry

SOURCE = "atspi"
ACCESSIBLE = "org.a11y.atspi.Accessible"
REGISTRY = ("org.a11y.atspi.Registry", "/org/a11y/atspi/accessible/root")
MAX_VALUE = 200  # characters of a text field's text read as its value

# AtspiStateType bits (atspi-constants.h)
ACTIVE, CHECKED, EDITABLE, ENABLED, EXPANDED, FOCUSED, PRESSED, SELECTED, SENSITIVE, SHOWING = 1, 4, 7, 8, 10, 12, 20, 23, 24, 25

# AtspiRole numbers (atspi-constants.h) -> agent.elements.ROLES; roles not named here are containers
# (panels, fillers, scroll panes, tool bars...): walked through, never listed
ROLES = {
    43: "button", 62: "button", 129: "button",  # push button, toggle button, push button menu
    7: "checkbox", 44: "radio", 37: "tab",  # check box, radio button, page tab
    32: "list_item", 56: "list_item", 91: "list_item",  # list item, table cell, tree item
    35: "menu_item", 8: "menu_item", 45: "menu_item", 33: "menu_item",  # menu item, check/radio menu item, menu (a menu bar's entry)
    11: "combo",  # combo box
    61: "text_field", 79: "text_field", 40: "text_field", 52: "text_field",  # text, entry, password text, spin button
    51: "slider", 15: "slider", 48: "scrollbar", 88: "link",  # slider, dial, scroll bar, link
    29: "label", 83: "label", 116: "label", 81: "label",  # label, heading, static, caption
    27: "image", 26: "image",  # image, icon
}
PASSWORD_TEXT, TEXT, SPIN_BUTTON, SLIDER, DIAL, COMBO_BOX = 40, 61, 52, 51, 15, 11
NAMED_ONLY = ("label", "image")  # listed only when they have a name
SCROLLERS = (31, 55, 65, 66, 49, 68, 98)  # list, table, tree, tree table, scroll pane, viewport, list box: clip
POPUPS = (41, 33, 69, 64, 31, 98)  # popup menu, menu, window, tool tip, list, list box: top-levels shown beside a window


@dataclass(frozen=True)
class Limits:
    """Bounds on one reading."""

    max_depth: int = 40
    max_nodes: int = 3000  # nodes whose role and state are read
    max_children: int = 150  # children read of one node (a 10,000-row table gives its first ones)
    max_elements: int = 300
    budget_s: float = 0.4  # wall-clock time for one reading


@dataclass
class _Node:
    bus: str
    path: str
    key: tuple  # child indices from the window: sorting by it gives the tree's reading order
    depth: int
    clip: tuple | None  # the scrolling container's box (screen coordinates) it must lie in


@dataclass
class Reading:
    """One reading: the list (None when there is none), where it came from or why none, and
    whether a limit cut it short."""

    elements: list[Element] | None
    source: str
    truncated: str | None = None


class _OutOfTime(Exception):
    pass


def screen_box_to_shot(x: float, y: float, w: float, h: float, g: ScreenGeometry, clip=None):
    """A box in screen coordinates (the OS input space, where AT-SPI's SCREEN extents live) ->
    (x0, y0, x1, y1) in the screenshot's pixels, cut to `clip` (screen x0, y0, x1, y1) and to the
    screenshot; None when nothing of it is left."""
    x0, y0, x1, y1 = float(x), float(y), float(x) + float(w), float(y) + float(h)
    if clip is not None:
        x0, y0, x1, y1 = max(x0, clip[0]), max(y0, clip[1]), min(x1, clip[2]), min(y1, clip[3])
    sx, sy = g.physical_width / g.logical_width, g.physical_height / g.logical_height
    box = (round((x0 - g.origin_x) * sx), round((y0 - g.origin_y) * sy),
           round((x1 - g.origin_x) * sx), round((y1 - g.origin_y) * sy))
    box = (max(0, box[0]), max(0, box[1]), min(g.physical_width, box[2]), min(g.physical_height, box[3]))
    return box if box[0] < box[2] and box[1] < box[3] else None


def _bits(words) -> set[int]:
    return {32 * i + b for i, w in enumerate(words) for b in range(32) if int(w) >> b & 1}


def _prop(n: _Node, iface: str, name: str) -> tuple:
    return (n.bus, n.path, "org.freedesktop.DBus.Properties", "Get", "ss", (iface, name))


def _number(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


class AtspiElements:
    """Reads element lists; one D-Bus connection, opened on the first read, used by one thread
    at a time (a lock guards it). focused_pid() -> the pid owning the focused X window or None:
    the fallback where no window is ACTIVE."""

    def __init__(self, limits: Limits = Limits(), *, enable_bridges: bool = True, focused_pid=None,
                 exclude_pids=None):
        self.limits = limits
        self.enable_bridges = enable_bridges
        self.focused_pid = focused_pid
        self.exclude_pids = {os.getpid()} if exclude_pids is None else set(exclude_pids)
        self.available: bool | None = None  # None: not tried yet
        self.reason = "not started"
        self._conn = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------ connection
    def open(self) -> AtspiElements:
        """Connect to the accessibility bus; never raises (see `available` and `reason`)."""
        with self._lock:
            self._open()
        return self

    def _open(self) -> None:
        if self._conn is not None or self.available is False:
            return
        try:
            from jeepney.io.blocking import open_dbus_connection

            self._conn = open_dbus_connection(bus=a11y_bus_address(self.enable_bridges))
            self.available, self.reason = True, SOURCE
        except Exception as e:  # any failure means "this desktop gives no list"
            self.available = False
            if isinstance(e, KeyError) and "DBUS_SESSION_BUS_ADDRESS" in str(e):
                self.reason = "none: no accessibility bus (this session has no D-Bus: DBUS_SESSION_BUS_ADDRESS is not set)"
            else:
                self.reason = f"none: no accessibility bus ({type(e).__name__}: {e})"

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                except OSError:
                    pass
                self._conn = None

    # ------------------------------------------------------------ D-Bus, pipelined
    def _calls(self, calls, deadline: float) -> list:
        """Send every (bus, path, interface, method, signature, body) at once, then read the
        replies: a reply's body, or None for an error (the object went away, no such interface)."""
        from jeepney import DBusAddress, MessageType, new_method_call
        from jeepney.low_level import HeaderFields

        conn = self._conn
        want = {}
        for i, (bus, path, iface, method, sig, body) in enumerate(calls):
            serial = next(conn.outgoing_serial)
            conn.send(new_method_call(DBusAddress(path, bus_name=bus, interface=iface), method, sig, body), serial=serial)
            want[serial] = i
        out = [None] * len(calls)
        while want:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _OutOfTime()
            try:
                msg = conn.receive(timeout=left)
            except TimeoutError:
                raise _OutOfTime() from None
            i = want.pop(msg.header.fields.get(HeaderFields.reply_serial), None)
            if i is not None and msg.header.message_type == MessageType.method_return:
                out[i] = msg.body
        return out  # replies to calls abandoned by an earlier reading arrive later and are skipped above

    # ------------------------------------------------------------ reading
    def read(self, geometry: ScreenGeometry, hidden=None) -> Reading:
        """The active window's list in `geometry`'s screenshot pixels. hidden: screen rectangles
        (x, y, w, h) painted out of the screenshot; elements centred in them are left out."""
        with self._lock:
            self._open()
            if not self.available:
                return Reading(None, self.reason)
            deadline = time.monotonic() + self.limits.budget_s
            try:
                roots = self._windows(deadline)
            except _OutOfTime:
                return Reading(None, f"none: the accessibility bus did not answer within {self.limits.budget_s:g} s")
            except (OSError, ValueError) as e:  # the bus went away: connect again next time
                self._drop(e)
                return Reading(None, self.reason)
            if isinstance(roots, str):
                return Reading(None, roots)
            try:
                found, truncated = self._walk(roots, deadline)
            except (OSError, ValueError) as e:
                self._drop(e)
                return Reading(None, self.reason)
        elements = self._finish(found, geometry, hidden)
        if len(elements) > self.limits.max_elements:
            elements, truncated = elements[: self.limits.max_elements], f"cut at {self.limits.max_elements} elements"
        return Reading(elements, SOURCE, truncated)

    def _drop(self, e: Exception) -> None:
        try:
            self._conn.close()
        except OSError:
            pass
        self._conn = None
        self.reason = f"none: the accessibility bus closed ({type(e).__name__}: {e})"

    def _windows(self, deadline: float):
        """The windows to read ([_Node]), or a reason string why none."""
        apps = self._calls([(*REGISTRY, ACCESSIBLE, "GetChildren", None, ())], deadline)[0]
        apps = [a for a in (apps[0] if apps else []) if a[0] and a[1] != "/org/a11y/atspi/null"]
        if not apps:
            return "none: no application on the accessibility bus"
        dbus = ("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus")
        replies = self._calls([(*dbus, "GetConnectionUnixProcessID", "s", (bus,)) for bus, _ in apps]
                              + [(bus, path, ACCESSIBLE, "GetChildren", None, ()) for bus, path in apps], deadline)
        pids = [r[0] if r else None for r in replies[: len(apps)]]
        tops = []  # (app index, bus, path)
        for k, r in enumerate(replies[len(apps):]):
            if r and pids[k] not in self.exclude_pids:
                tops += [(k, bus, path) for bus, path in r[0]]
        info = self._calls([c for _, bus, path in tops for c in ((bus, path, ACCESSIBLE, "GetRole", None, ()),
                                                                   (bus, path, ACCESSIBLE, "GetState", None, ()))], deadline)
        windows = []  # (app index, bus, path, role, states)
        for n, (k, bus, path) in enumerate(tops):
            role, state = info[2 * n], info[2 * n + 1]
            if role and state:
                windows.append((k, bus, path, role[0], _bits(state[0])))
        active = [w for w in windows if ACTIVE in w[4] and SHOWING in w[4]]
        if active:
            app = active[0][0]
            chosen = [active[0]] + [w for w in windows if w[0] == app and w is not active[0] and SHOWING in w[4]
                                    and w[3] in POPUPS]
        else:
            pid = self.focused_pid() if self.focused_pid is not None else None
            chosen = [w for w in windows if pid is not None and pids[w[0]] == pid and SHOWING in w[4]]
            if not chosen:
                return "none: no active window on the accessibility bus"
        return [_Node(bus, path, (i,), 0, None) for i, (_, bus, path, _, _) in enumerate(chosen)]

    def _walk(self, roots: list[_Node], deadline: float):
        """Breadth first, one pipelined batch per level: [(key, role, name, states, screen box,
        clip, node)] of the nodes to list, and why the walk stopped early (or None)."""
        lim = self.limits
        found, level, visited, truncated = [], roots, 0, None
        try:
            while level:
                if visited + len(level) > lim.max_nodes:
                    level, truncated = level[: lim.max_nodes - visited], f"cut at {lim.max_nodes} nodes"
                visited += len(level)
                replies = self._calls([c for n in level for c in (
                    (n.bus, n.path, ACCESSIBLE, "GetRole", None, ()),
                    (n.bus, n.path, ACCESSIBLE, "GetState", None, ()),
                    _prop(n, ACCESSIBLE, "Name"), _prop(n, ACCESSIBLE, "ChildCount"),  # Qt answers Get, not GetAll
                    (n.bus, n.path, "org.a11y.atspi.Component", "GetExtents", "u", (0,)))], deadline)  # 0: screen coordinates
                parents, listed_before = [], len(found)
                for i, n in enumerate(level):
                    role, state, name, count, extents = replies[5 * i: 5 * i + 5]
                    if not (role and state):
                        continue  # gone since its parent listed it
                    states = _bits(state[0])
                    if SHOWING not in states:
                        continue  # nor anything inside it
                    box = tuple(extents[0]) if extents else None
                    if role[0] in ROLES and box and box[2] > 0 and box[3] > 0:
                        found.append((n.key, role[0], str(name[0][1] if name else ""), states, box, n.clip, n))
                    count = int(count[0][1]) if count else 0
                    if count > 0 and n.depth < lim.max_depth:
                        clip = n.clip
                        if role[0] in SCROLLERS and box and box[2] > 0 and box[3] > 0:
                            inner = (box[0], box[1], box[0] + box[2], box[1] + box[3])
                            clip = inner if clip is None else (max(clip[0], inner[0]), max(clip[1], inner[1]),
                                                              min(clip[2], inner[2]), min(clip[3], inner[3]))
                        parents.append((n, count, clip))
                    elif count > 0 and truncated is None:
                        truncated = f"cut at depth {lim.max_depth}"
                calls, owners = [], []
                for n, count, clip in parents:
                    if count <= lim.max_children:
                        calls.append((n.bus, n.path, ACCESSIBLE, "GetChildren", None, ()))
                        owners.append((n, clip, None))
                    else:  # GetChildren would list (and make the toolkit build) every row
                        truncated = truncated or f"cut at {lim.max_children} children of one node"
                        for k in range(lim.max_children):
                            calls.append((n.bus, n.path, ACCESSIBLE, "GetChildAtIndex", "i", (k,)))
                            owners.append((n, clip, k))
                # this level's text fields' and sliders' values ride in the same batch (no round trip of their own)
                value_calls, value_owners = _value_calls(found, range(listed_before, len(found)))
                replies = self._calls(calls + value_calls, deadline)
                _apply_values(found, value_owners, replies[len(calls):])
                level = []
                for (n, clip, k), r in zip(owners, replies[:len(calls)], strict=True):  # the values' replies follow
                    if not r:
                        continue
                    children = [r[0]] if k is not None else r[0]
                    for j, (bus, path) in enumerate(children):
                        if bus and path != "/org/a11y/atspi/null":
                            level.append(_Node(bus, path, n.key + ((k if k is not None else j),), n.depth + 1, clip))
                if len(found) >= 2 * lim.max_elements:
                    truncated = truncated or f"cut at {lim.max_elements} elements"
                    break
        except _OutOfTime:
            truncated = f"cut by the {lim.budget_s:g} s time budget"
        return found, truncated

    def _finish(self, found: list, g: ScreenGeometry, hidden) -> list[Element]:
        """Raw nodes -> Elements in reading order: roles mapped, boxes in screenshot pixels, states."""
        out = []
        for key, role, name, states, (x, y, w, h), clip, _node, *value in sorted(found, key=lambda f: f[0]):
            cx, cy = x + w / 2, y + h / 2
            if any(hx <= cx < hx + hw and hy <= cy < hy + hh for hx, hy, hw, hh in hidden or ()):
                continue  # painted out of the screenshot (the app's own control strip)
            box = screen_box_to_shot(x, y, w, h, g, clip)
            mapped = ROLES[role]
            if box is None or (mapped in NAMED_ONLY and not name.strip()):
                continue
            if role == TEXT and EDITABLE not in states:
                mapped = "label"  # read-only text (GTK's text views, Qt's read-only fields)
                if not name.strip():
                    continue
            flags = []
            if CHECKED in states or (role == 62 and PRESSED in states):
                flags.append("checked")
            if SELECTED in states and mapped in ("tab", "list_item", "menu_item", "radio"):
                flags.append("selected")
            if not (ENABLED in states or SENSITIVE in states):
                flags.append("disabled")
            if FOCUSED in states:
                flags.append("focused")
            if EXPANDED in states:
                flags.append("expanded")
            if role == COMBO_BOX and EDITABLE in states:
                flags.append("editable")
            text = value[0] if value else None
            if role == PASSWORD_TEXT:
                flags.append("password")
                text = None  # never read, never stored
            out.append((key, Element(mapped, name, box, tuple(flags), text if text else None)))
        return _names_from_labels(out)


def _value_calls(found: list, indices) -> tuple[list, list]:
    """Calls for the text of text fields and the value of sliders among found[indices] (never a
    password field's: its role is not asked)."""
    calls, owners = [], []
    for i in indices:
        role, n = found[i][1], found[i][6]
        if role in (TEXT, 79):
            calls.append((n.bus, n.path, "org.a11y.atspi.Text", "GetText", "ii", (0, MAX_VALUE)))
            owners.append((i, "text"))
        elif role in (SLIDER, DIAL, SPIN_BUTTON):
            for p in ("CurrentValue", "MinimumValue", "MaximumValue"):
                calls.append(_prop(n, "org.a11y.atspi.Value", p))
                owners.append((i, p))
    return calls, owners


def _apply_values(found: list, owners: list, replies: list) -> None:
    """Append each value read to its found entry: 'text', or '30 of 0-100' for a slider."""
    got: dict[int, dict] = {}
    for (i, kind), r in zip(owners, replies, strict=True):
        if r:
            got.setdefault(i, {})[kind] = r[0] if kind == "text" else r[0][1]
    for i, v in got.items():
        if "text" in v:
            value = str(v["text"])
        elif "CurrentValue" in v:
            cur = v["CurrentValue"]
            value = (f"{_number(cur)} of {_number(v['MinimumValue'])}-{_number(v['MaximumValue'])}"
                     if "MinimumValue" in v and "MaximumValue" in v else _number(cur))
        else:
            continue
        found[i] = (*found[i], value)


def _names_from_labels(keyed: list) -> list[Element]:
    """An unnamed control inside which a label is listed (a GTK list row, a button holding a
    label) takes the label's name, and the label is not listed again. keyed: [(tree key, Element)]
    in reading order, so a node's descendants follow it."""
    out, taken = [], set()
    for i, (key, e) in enumerate(keyed):
        if i in taken:
            continue
        if not e.name and e.role not in NAMED_ONLY:
            for j in range(i + 1, len(keyed)):
                k2, inner = keyed[j]
                if k2[: len(key)] != key:
                    break  # past the control's descendants
                if inner.role == "label" and j not in taken:
                    e = Element(e.role, inner.name, e.box, e.states, e.value)
                    taken.add(j)
                    break
        out.append(e)
    return out
