"""The action space, declared once.

Each action names its parameters, the platforms it exists on and whether it is risky. The
prompt text, the parser, validation, the formatter, the executors and the editing UI all read
this registry; nothing else lists actions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: agent.schema imports this registry
    from agent.schema import Action

SCROLL_DIRECTIONS = ("up", "down", "left", "right")

# Keys UI-TARS emits in hotkey(key='ctrl c'); anything else single-character is allowed too.
NAMED_KEYS = frozenset(
    """ctrl control alt shift win super meta cmd command option enter return tab space backspace
    delete del esc escape home end pageup pagedown up down left right insert capslock printscreen
    f1 f2 f3 f4 f5 f6 f7 f8 f9 f10 f11 f12 plus minus""".split()
)


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # point | text | key | direction | app
    required: bool = True
    aliases: tuple[str, ...] = ()  # other names models use for it
    doc: str = ""


@dataclass(frozen=True)
class ActionSpec:
    name: str
    params: tuple[Param, ...]
    platforms: tuple[str, ...]
    doc: str
    risky: bool = False  # the "risky" gate asks a human before these
    terminal: bool = False  # ends the episode

    def param(self, name: str) -> Param | None:
        for p in self.params:
            if p.name == name or name in p.aliases:
                return p
        return None

    def signature(self) -> str:
        """The prompt line for this action, in UI-TARS's own notation."""
        parts = []
        for p in self.params:
            if p.kind == "point":
                n = "x1,y1" if p.name == "start_box" else "x3,y3"
                parts.append(f"{p.name}='<|box_start|>({n})<|box_end|>'")
            elif p.kind == "direction":
                parts.append(f"{p.name}='{' or '.join(SCROLL_DIRECTIONS)}'")
            else:
                parts.append(f"{p.name}=''")
        line = f"{self.name}({', '.join(parts)})"
        return f"{line} # {self.doc}" if self.doc else line


_POINT = ("point", "start_point")
_END = ("end_point",)

DESKTOP = ("desktop", "sandbox")
MOBILE = ("android",)
ALL_GUI = DESKTOP + MOBILE
TOOLS = ("terminal",)

_SPECS = [
    ActionSpec("click", (Param("start_box", "point", aliases=_POINT),), ALL_GUI, ""),
    ActionSpec("left_double", (Param("start_box", "point", aliases=_POINT),), DESKTOP, ""),
    ActionSpec("right_single", (Param("start_box", "point", aliases=_POINT),), DESKTOP, ""),
    ActionSpec(
        "drag",
        (Param("start_box", "point", aliases=_POINT), Param("end_box", "point", aliases=_END)),
        ALL_GUI,
        "",
    ),
    ActionSpec("hotkey", (Param("key", "key", aliases=("hotkey", "keys")),), DESKTOP, ""),
    ActionSpec(
        "type",
        (Param("content", "text", aliases=("text",)),),
        ALL_GUI,
        'If you want to submit your input, use "\\n" at the end of `content`.',
    ),
    ActionSpec(
        "scroll",
        (Param("start_box", "point", required=False, aliases=_POINT), Param("direction", "direction")),
        ALL_GUI,
        "",
    ),
    ActionSpec("wait", (), ALL_GUI, "Sleep for 5s and take a screenshot to check for any changes."),
    ActionSpec(
        "finished",
        (Param("content", "text", required=False),),
        ALL_GUI + ("terminal",),
        "Use escape characters \\', \\\", and \\n in content part to ensure we can parse the content in normal python string format.",
        terminal=True,
    ),
    ActionSpec(
        "call_user",
        (),
        ALL_GUI + ("terminal",),
        "Submit the task and call the user when the task is unsolvable, or when you need the user's help.",
        terminal=True,
    ),
    # mobile
    ActionSpec("long_press", (Param("start_box", "point", aliases=_POINT),), MOBILE, ""),
    ActionSpec("open_app", (Param("app_name", "app"),), MOBILE, ""),
    ActionSpec("press_home", (), MOBILE, ""),
    ActionSpec("press_back", (), MOBILE, ""),
    # tools: the terminal and files (the report's GUI-SDK). Always gated.
    ActionSpec(
        "run_command",
        (Param("command", "text", aliases=("cmd",)), Param("cwd", "text", required=False)),
        TOOLS,
        "Run a shell command and read its output.",
        risky=True,
    ),
    ActionSpec("read_file", (Param("path", "text"),), TOOLS, "Read a text file.", risky=True),
    ActionSpec(
        "write_file",
        (Param("path", "text"), Param("content", "text")),
        TOOLS,
        "Write a text file.",
        risky=True,
    ),
]

REGISTRY: dict[str, ActionSpec] = {s.name: s for s in _SPECS}

# Other spellings of named keys that models write (UI-TARS-desktop's parser accepts these), and
# the one name each becomes, so that the gate, the executors and training data see one spelling.
KEY_ALIASES = {
    "control": "ctrl", "option": "alt", "opt": "alt", "command": "cmd", "super": "win", "meta": "win",
    "windows": "win", "escape": "esc", "del": "delete", "return": "enter", "arrowup": "up", "arrowdown": "down",
    "arrowleft": "left", "arrowright": "right", "pgup": "pageup", "pgdn": "pagedown", "page_up": "pageup",
    "page_down": "pagedown",
}
MODIFIER_ORDER = ("ctrl", "alt", "shift", "cmd", "win")
# a left or right modifier is the modifier: lctrl, ctrl_l, ctrlleft (pyautogui), leftctrl, rightctrl, rwin, super_r...
KEY_ALIASES.update({
    spelling: KEY_ALIASES.get(mod, mod)
    for mod in ("ctrl", "control", "alt", "option", "shift", "cmd", "command", "win", "super", "meta")
    for side in ("left", "right")
    for spelling in (side[0] + mod, mod + "_" + side[0], mod + side, side + mod, mod + "_" + side, side + "_" + mod)
})


def canonical_keys(text: str) -> str:
    """A key chord in one spelling: 'Control+Shift+Del' and 'shift ctrl delete' both give
    'ctrl shift delete' (aliases and left/right modifiers resolved, 'page down' joined, a key
    named twice kept once, modifiers first in a fixed order). What the parser hands the
    executors, so the chord the gate judges is the chord that is pressed."""
    words = str(text).replace("+", " ").lower().split()
    keys, i = [], 0
    while i < len(words):
        if words[i] == "page" and i + 1 < len(words) and words[i + 1] in ("up", "down"):
            keys.append("page" + words[i + 1])
            i += 2
            continue
        keys.append(KEY_ALIASES.get(words[i], words[i]))
        i += 1
    keys = list(dict.fromkeys(keys))  # 'ctrl w w' presses Ctrl+W: the same chord as 'ctrl w'
    mods = [m for m in MODIFIER_ORDER if m in keys]
    return " ".join(mods + [k for k in keys if k not in MODIFIER_ORDER])


# Hotkeys that can lose work (kept in canonical_keys spelling): close a tab or window, quit, log out,
# delete for good. The risky gate asks before any hotkey that presses one of them (see
# presses_destructive_chord), with or without more modifiers held.
DESTRUCTIVE_HOTKEYS = frozenset(canonical_keys(k) for k in {
    # Linux and Windows: close tab/window, quit, kill the X server, log out, delete for good; close
    # window and exit in tiling window managers (i3, sway: super+q, super+shift+q, super+shift+e)
    "ctrl w", "ctrl f4", "ctrl shift w", "ctrl q", "ctrl shift q", "alt f4", "ctrl alt delete", "ctrl alt backspace",
    "shift delete", "ctrl shift delete", "win q", "win shift q", "win shift e",
    # macOS: close, close all, quit, force quit, move to the bin, empty it, lock
    "cmd w", "cmd shift w", "cmd alt w", "cmd q", "cmd alt esc", "cmd alt shift esc", "cmd delete",
    "cmd shift delete", "ctrl cmd q",
})
# The desktop executor presses one key for cmd and win (Command on macOS, Super elsewhere:
# agent.executors.desktop.pyautogui_key), so the gate reads them as one.
_SAME_KEY = {"cmd": "win"}


def _chord(keys: str) -> tuple[frozenset, list[str]]:
    """(modifiers, other keys in press order) of a chord, cmd and win read as one key."""
    words = [_SAME_KEY.get(k, k) for k in canonical_keys(keys).split()]
    mods = frozenset(k for k in words if k in MODIFIER_ORDER)
    return mods, [k for k in words if k not in MODIFIER_ORDER]


_DESTRUCTIVE_CHORDS = [_chord(k) for k in DESTRUCTIVE_HOTKEYS]


def presses_destructive_chord(keys: str) -> bool:
    """Does this hotkey press a chord of DESTRUCTIVE_HOTKEYS? The executor holds the modifiers and
    presses the other keys in turn, the earlier ones still held, so 'ctrl a w' and 'ctrl alt w'
    deliver Ctrl+W as surely as 'ctrl w' does; apps that match modifiers loosely see it as one."""
    mods, others = _chord(keys)
    return any(d_mods <= mods and d_keys[0] in others for d_mods, d_keys in _DESTRUCTIVE_CHORDS)


def actions_for(platform: str) -> list[ActionSpec]:
    return [s for s in _SPECS if platform in s.platforms]


def validate(action: Action, *, normalized: bool = True) -> str | None:
    """None when the action is well formed, otherwise the reason it is not.

    With normalized=True, points must lie in the screenshot (0..1).
    """
    spec = REGISTRY.get(action.name)
    if spec is None:
        return f"unknown action {action.name!r}"
    for k in action.args:
        if (known := spec.param(k)) is None or known.name != k:
            return f"{action.name}: unknown argument {k!r}"
    for p in spec.params:
        if p.name not in action.args:
            if p.required:
                return f"{action.name}: missing argument {p.name!r}"
            continue
        v = action.args[p.name]
        if p.kind == "point":
            if not (isinstance(v, tuple) and len(v) == 2 and all(isinstance(c, (int, float)) for c in v)):
                return f"{action.name}: {p.name} must be a point (x, y), got {v!r}"
            if normalized and not all(0.0 <= c <= 1.0 for c in v):
                return f"{action.name}: {p.name} {v} lies outside the screenshot"
        elif p.kind == "direction":
            if v not in SCROLL_DIRECTIONS:
                return f"{action.name}: direction must be one of {', '.join(SCROLL_DIRECTIONS)}, got {v!r}"
        elif p.kind == "key":
            if not isinstance(v, str) or not v.strip():
                return f"{action.name}: {p.name} must name at least one key"
            for key in v.lower().split():
                if len(key) > 1 and key not in NAMED_KEYS:
                    return f"{action.name}: unknown key {key!r} in {v!r}"
        else:
            if not isinstance(v, str):
                return f"{action.name}: {p.name} must be text, got {type(v).__name__}"
            if p.kind == "app" and not v.strip():
                return f"{action.name}: {p.name} is empty"
    return None


def is_risky(action: Action) -> bool:
    spec = REGISTRY.get(action.name)
    if spec is None:
        return True
    if spec.risky:
        return True
    if action.name == "hotkey":
        return presses_destructive_chord(action.args.get("key", ""))
    return False
