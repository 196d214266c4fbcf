"""Element lists: what is on the screen, as a platform's accessibility layer names it.

Each observation may carry a list of elements (the sandbox's widget tree, a browser's DOM, AT-SPI on
Linux desktops, uiautomator2's hierarchy on Android): role, name, box in screenshot pixels, states.
A model sees it as one compact line per element after the screenshot, in the reply's coordinate
space, so a stock model can copy numbers and the default model's pointer (agent.vlm.pointer) can pick
an entry and write its centre:

    Elements:
    [0] button 'Save' (12,40,84,68)
    [1] checkbox 'Dark mode' (12,76,120,104) checked

A click at a box's centre must act on its element (for a check box: its box and label, not the
empty part to its right): that centre is what the pointer writes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from agent import coords
from agent.errors import TandemError

HEADER = "Elements:"
# roles a platform's own names are mapped onto (unknown ones pass through, lower-cased)
ROLES = ("button", "checkbox", "radio", "tab", "list_item", "menu_item", "combo", "text_field", "slider", "link",
         "label", "scrollbar", "window", "image", "other")
STATES = ("checked", "selected", "disabled", "focused", "expanded", "editable", "password")
MAX_NAME = 60  # characters of a name shown to the model
LINE_RE = re.compile(r"^\[(\d+)\] (\S+) '(.*)' \((-?\d+),(-?\d+),(-?\d+),(-?\d+)\)(.*)$")
NO_LIST = "(no element list on this platform: use the screenshot)"


class ElementError(TandemError, ValueError):
    """A malformed element (or list); the message names the element and what is wrong."""


@dataclass(frozen=True)
class Element:
    role: str
    name: str
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 in screenshot pixels (x1, y1 exclusive)
    states: tuple[str, ...] = ()
    value: str | None = None  # a text field's text, a slider's "30 of 0-100"

    @property
    def center(self) -> tuple[float, float]:
        x0, y0, x1, y1 = self.box
        return ((x0 + x1) / 2, (y0 + y1) / 2)

    def contains(self, x: float, y: float) -> bool:
        x0, y0, x1, y1 = self.box
        return x0 <= x < x1 and y0 <= y < y1

    def to_dict(self) -> dict:
        d = {"role": self.role, "name": self.name, "box": list(self.box)}
        if self.states:
            d["states"] = list(self.states)
        if self.value is not None:
            d["value"] = self.value
        return d

    @classmethod
    def from_dict(cls, d, where: str = "element") -> Element:
        if not isinstance(d, dict):
            raise ElementError(f"{where}: expected an object, got {type(d).__name__}")
        role, name, box = d.get("role"), d.get("name", ""), d.get("box")
        if not isinstance(role, str) or not role:
            raise ElementError(f"{where}: 'role' must be a non-empty string, got {role!r}")
        if not isinstance(name, str):
            raise ElementError(f"{where}: 'name' must be a string, got {type(name).__name__}")
        if (not isinstance(box, (list, tuple)) or len(box) != 4
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in box)):
            raise ElementError(f"{where}: 'box' must be four numbers x0, y0, x1, y1, got {box!r}")
        x0, y0, x1, y1 = (int(round(v)) for v in box)
        if x1 < x0 or y1 < y0:
            raise ElementError(f"{where}: 'box' {box!r} ends before it starts")
        states = d.get("states") or ()
        if not isinstance(states, (list, tuple)) or not all(isinstance(s, str) for s in states):
            raise ElementError(f"{where}: 'states' must be a list of strings, got {states!r}")
        value = d.get("value")
        if value is not None and not isinstance(value, str):
            raise ElementError(f"{where}: 'value' must be a string, got {type(value).__name__}")
        return cls(role, name, (x0, y0, x1, y1), tuple(states), value)


def elements_from_dicts(items, where: str = "elements") -> list[Element]:
    if not isinstance(items, (list, tuple)):
        raise ElementError(f"{where}: expected a list, got {type(items).__name__}")
    return [Element.from_dict(d, f"{where}[{i}]") for i, d in enumerate(items)]


def clean_name(name: str) -> str:
    """A name as one line the list grammar can carry: whitespace folded, quotes made typographic, cut."""
    s = " ".join(str(name).split()).replace("'", "\u2019")
    return s if len(s) <= MAX_NAME else s[: MAX_NAME - 1] + "\u2026"


def model_box(box, space: str, width: int, height: int) -> tuple[int, int, int, int]:
    """A screenshot-pixel box in the reply's coordinate space (agent.coords) for a width x height shot."""
    x0, y0, x1, y1 = box
    a = coords.normalized_to_model(coords.image_to_normalized((x0, y0), width, height), space, width, height)
    b = coords.normalized_to_model(coords.image_to_normalized((x1, y1), width, height), space, width, height)
    return (a[0], a[1], b[0], b[1])


def model_center(box: tuple[int, int, int, int]) -> tuple[int, int]:
    """The point the pointer writes for an entry: its model-space box's centre, in whole pixels."""
    return ((box[0] + box[2]) // 2, (box[1] + box[3]) // 2)


def format_lines(elements, space: str, width: int, height: int) -> str:
    """The list as the model reads it: a header, then one line per element (boxes in model space)."""
    lines = [HEADER]
    for k, e in enumerate(elements):
        x0, y0, x1, y1 = model_box(e.box, space, width, height)
        tail = "".join(f" {s}" for s in e.states)
        if e.value:
            tail += f" value '{clean_name(e.value)}'"
        lines.append(f"[{k}] {e.role} '{clean_name(e.name)}' ({x0},{y0},{x1},{y1}){tail}")
    return "\n".join(lines)


@dataclass
class Entry:
    """One parsed line of a list as the model saw it (model-space box)."""
    index: int
    role: str
    name: str
    box: tuple[int, int, int, int]
    start: int = 0  # character offsets of the line in the text it was found in
    name_end: int = 0  # offset one past the name's last character
    states: tuple[str, ...] = field(default_factory=tuple)

    @property
    def center(self) -> tuple[int, int]:
        return model_center(self.box)


def parse_block(text: str, offset: int = 0) -> list[Entry]:
    """The entries of the last element list in `text` (the current observation's), with their
    character offsets (plus `offset`); [] when the text holds none."""
    at = text.rfind(HEADER)
    if at < 0:
        return []
    out = []
    pos = at + len(HEADER) + 1
    for line in text[at + len(HEADER):].split("\n")[1:]:
        m = LINE_RE.match(line)
        if not m:
            break
        box = tuple(int(m.group(i)) for i in range(4, 8))
        name_start = pos + line.index("'") + 1
        out.append(Entry(int(m.group(1)), m.group(2), m.group(3), box, offset + pos,
                         offset + name_start + len(m.group(3)), tuple(m.group(8).split())))
        pos += len(line) + 1
    return out


def entry_at(entries, x: float, y: float):
    """The index (in `entries`) of the smallest entry whose model-space box holds (x, y), or None."""
    best, area = None, None
    for i, e in enumerate(entries):
        x0, y0, x1, y1 = e.box
        if x0 <= x <= x1 and y0 <= y <= y1:
            a = (x1 - x0) * (y1 - y0)
            if area is None or a < area:
                best, area = i, a
    return best
