"""Reduction of a recording's raw events to actions and steps: pure functions, versioned.

The recorder keeps every raw event (agent.storage.store raw_events), so a better reducer can be run
again over old recordings; REDUCER_VERSION goes into the episode's meta so one can tell which
reducer made a recording's steps.

Raw events are dicts with a monotonic time `t` (agent.schema.monotonic) and a `kind`:
    mouse_down / mouse_up   x, y (screen pixels, the OS input space), button: left|right|middle
    move                    x, y (throttled by the recorder; reduction does not need them)
    scroll                  x, y, dx, dy (dy > 0 is up, dx > 0 is right, in wheel clicks)
    key_down / key_up       key: a single character ('a', 'A', '1', ' ') or a named key
                            (pynput's names: 'enter', 'backspace', 'ctrl_l', 'shift', 'cmd',
                            'page_up', 'f5', ...); secret: true when the recorder masked it
    frame                   t_end, blob (hash), width, height, why: pre|settled|change|start|stop
    note                    text (a typed think-aloud note, attached to the step at t)
    elements                t_end, elements ([agent.elements.Element dicts] or None), source: the
                            active window's element list, read from t to t_end (agent.recorder.element_watch)
    pause / resume / denied / allowed / secret_on / secret_off / start / stop   (markers)

Rules (thresholds in `Thresholds`, one place):
- left down+up moving at most `drag_min_px` -> click; moving further -> drag(start, end).
- a click within `double_click_s` (first up to second down) and `double_click_px` of the
  previous click -> the pair becomes one left_double.
- right down+up -> right_single at the press point. Middle clicks have no action in the
  action space and are skipped (the raw events keep them).
- scroll events in one direction, each within `scroll_merge_s` of the previous and
  `scroll_merge_px` of the first -> one scroll at the first position; `info.clicks` says how far.
- printable characters (with or without shift) -> one `type` per run; backspace removes the
  last typed character (or, at the start of a run, is a hotkey 'backspace'); Enter adds "\n"
  and ends the run; a run also ends at any mouse action, hotkey, or a gap > `type_gap_s`.
  A run that ends empty (typed and erased) is no action. Masked (secret) characters collapse
  into one SECRET_PLACEHOLDER per run of them.
- a non-modifier key pressed while ctrl, alt or cmd/super is held -> hotkey, keys in the order
  ctrl alt shift win then the key ('ctrl shift t'); named keys without such a modifier (tab,
  esc, arrows, delete, f-keys, ...) -> hotkey of that key, with 'shift' when shift is held.
  A modifier pressed and released alone is no action, except super/cmd alone -> hotkey 'win'.
  Keys outside the action space's key names (media keys, num_lock) are skipped.
- an input gap of at least `wait_idle_s` during which the screen changed -> wait.
- a step's element list is the last one read entirely between the previous action's end (and
  the last pause, resume, denied or allowed marker) and its own start; without one, the step
  says why (elements_source "none: ...").
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from agent import coords
from agent.elements import elements_from_dicts
from agent.schema import Action, Observation, Provenance, ScreenGeometry, Step

REDUCER_VERSION = 1
SECRET_PLACEHOLDER = "<secret>"
MASK_CHAR = "\u2022"  # what the recorder stores instead of a secret keystroke


@dataclass(frozen=True)
class Thresholds:
    """Every reduction threshold, in seconds and screen pixels."""

    drag_min_px: float = 6.0  # press-to-release movement above this is a drag, not a click
    double_click_s: float = 0.5  # first release to second press, at most (typical OS default)
    double_click_px: float = 6.0  # the two presses at most this far apart
    scroll_merge_s: float = 0.8  # wheel clicks closer than this in time merge into one scroll
    scroll_merge_px: float = 40.0  # ...and closer than this to the first one
    type_gap_s: float = 3.0  # a pause longer than this between keys starts a new type action
    wait_idle_s: float = 5.0  # no input this long while the screen changed -> a wait step

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> Thresholds:
        d = d or {}
        names = set(cls.__dataclass_fields__)
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown reduction thresholds: {', '.join(sorted(unknown))}")
        return cls(**{k: float(v) for k, v in d.items()})


@dataclass
class ActionRecord:
    """One reduced action in screen pixels, with the time span of the input that made it."""

    name: str
    args: dict  # points as (x, y) screen pixels
    t_start: float
    t_end: float
    info: dict = field(default_factory=dict)


MODIFIERS = {
    "ctrl": "ctrl", "ctrl_l": "ctrl", "ctrl_r": "ctrl",
    "alt": "alt", "alt_l": "alt", "alt_r": "alt",
    "shift": "shift", "shift_l": "shift", "shift_r": "shift",
    "cmd": "win", "cmd_l": "win", "cmd_r": "win", "super": "win", "super_l": "win", "super_r": "win",
}
_MOD_ORDER = ("ctrl", "alt", "shift", "win")
# alt_gr composes characters (European layouts): it is neither a hotkey modifier nor an action
_IGNORED = {"alt_gr", "caps_lock", "num_lock", "scroll_lock"}
# pynput key names -> the action space's key names (agent.actions.NAMED_KEYS)
KEY_NAMES = {
    "enter": "enter", "tab": "tab", "space": "space", "backspace": "backspace", "delete": "delete",
    "esc": "esc", "escape": "esc", "home": "home", "end": "end", "page_up": "pageup",
    "page_down": "pagedown", "up": "up", "down": "down", "left": "left", "right": "right",
    "insert": "insert", "print_screen": "printscreen", **{f"f{i}": f"f{i}" for i in range(1, 13)},
}


def _char_of(key: str) -> str | None:
    if key == "space":
        return " "
    if len(key) == 1 and key.isprintable():
        return key
    return None


def _hotkey_name(key: str) -> str | None:
    """The action space's name for a key in a hotkey, or None when it has none."""
    if key in KEY_NAMES:
        return KEY_NAMES[key]
    if len(key) == 1:
        if key == "+":
            return "plus"
        if key == "-":
            return "minus"
        if ord(key) < 32:  # some platforms report ctrl+c as '\x03'
            return chr(ord(key) + 96)
        return key.lower() if key.isprintable() and not key.isspace() else None
    return None


def _dist(a, b) -> float:
    return math.hypot(a[0] - b[0], a[1] - b[1])


def reduce_actions(events: list[dict], th: Thresholds = Thresholds()) -> list[ActionRecord]:
    """Raw events -> actions in screen pixels, ordered by start time (no waits; see add_waits)."""
    evs = sorted((e for e in events if e.get("kind") != "frame"), key=lambda e: e["t"])
    out: list[ActionRecord] = []
    held: dict[str, int] = {}  # modifier -> count of its keys held (left and right)
    down: dict[str, dict] = {}  # mouse button -> its press event
    last_click: ActionRecord | None = None
    scroll: ActionRecord | None = None
    typing: dict | None = None  # {"chars": [...], "t0", "t1", "secret"}
    lone_mod: str | None = None  # a modifier pressed with nothing else yet

    def end_typing():
        nonlocal typing
        if typing is None:
            return
        text, secret_run = [], False
        for c in typing["chars"]:
            if c == MASK_CHAR:
                if not secret_run:
                    text.append(SECRET_PLACEHOLDER)
                secret_run = True
            else:
                text.append(c)
                secret_run = False
        content = "".join(text)
        if content:
            info = {"secret": True} if typing["secret"] else {}
            out.append(ActionRecord("type", {"content": content}, typing["t0"], typing["t1"], info))
        typing = None

    def end_scroll():
        nonlocal scroll
        if scroll is not None:
            out.append(scroll)
            scroll = None

    for e in evs:
        kind, t = e["kind"], float(e["t"])
        if kind in ("pause", "resume", "denied", "allowed", "stop"):
            # input around a gap in capture does not continue across it
            end_typing()
            end_scroll()
            down.clear()
            held.clear()
            last_click = None
            continue
        if kind == "mouse_down":
            end_typing()
            end_scroll()
            lone_mod = None
            down[e.get("button", "left")] = e
        elif kind == "mouse_up":
            button = e.get("button", "left")
            start = down.pop(button, None)
            if start is None:  # its press happened before the recording (or a pause)
                continue
            p0, p1 = (int(start["x"]), int(start["y"])), (int(e["x"]), int(e["y"]))
            if button == "right":
                out.append(ActionRecord("right_single", {"start_box": p0}, start["t"], t))
                last_click = None
            elif button == "left":
                if _dist(p0, p1) > th.drag_min_px:
                    out.append(ActionRecord("drag", {"start_box": p0, "end_box": p1}, start["t"], t))
                    last_click = None
                elif (
                    last_click is not None
                    and last_click.name == "click"
                    and out and out[-1] is last_click
                    and start["t"] - last_click.t_end <= th.double_click_s
                    and _dist(p0, last_click.args["start_box"]) <= th.double_click_px
                ):
                    last_click.name = "left_double"
                    last_click.t_end = t
                    last_click = None  # a third click starts over
                else:
                    last_click = ActionRecord("click", {"start_box": p0}, start["t"], t)
                    out.append(last_click)
        elif kind == "scroll":
            end_typing()
            lone_mod = None
            dx, dy = float(e.get("dx", 0)), float(e.get("dy", 0))
            if dy == 0 and dx == 0:
                continue
            if abs(dy) >= abs(dx):
                direction, clicks = ("up" if dy > 0 else "down"), abs(dy)
            else:
                direction, clicks = ("right" if dx > 0 else "left"), abs(dx)
            p = (int(e["x"]), int(e["y"]))
            if (
                scroll is not None
                and scroll.args["direction"] == direction
                and t - scroll.t_end <= th.scroll_merge_s
                and _dist(p, scroll.args["start_box"]) <= th.scroll_merge_px
            ):
                scroll.t_end = t
                scroll.info["clicks"] += clicks
            else:
                end_scroll()
                scroll = ActionRecord("scroll", {"start_box": p, "direction": direction}, t, t, {"clicks": clicks})
            last_click = None
        elif kind == "key_down":
            key = str(e.get("key", ""))
            mod = MODIFIERS.get(key)
            if mod:
                held[mod] = held.get(mod, 0) + 1
                lone_mod = mod if len(held) == 1 else None
                continue
            lone_mod = None
            if key in _IGNORED:
                continue
            last_click = None
            chord = [m for m in _MOD_ORDER if held.get(m) and m != "shift"]
            char = _char_of(key)
            if e.get("secret") and char is not None:
                char = MASK_CHAR
            if chord:
                end_typing()
                end_scroll()
                name = _hotkey_name(key)
                if name is None:
                    continue
                keys = chord + (["shift"] if held.get("shift") else [])
                keys = [m for m in _MOD_ORDER if m in keys] + [name]
                out.append(ActionRecord("hotkey", {"key": " ".join(keys)}, t, t))
                continue
            if typing is not None and t - typing["t1"] > th.type_gap_s:
                end_typing()
            if char is not None:
                end_scroll()
                if typing is None:
                    typing = {"chars": [], "t0": t, "t1": t, "secret": False}
                typing["chars"].append(char)
                typing["t1"] = t
                typing["secret"] = typing["secret"] or char == MASK_CHAR
            elif key == "backspace" and typing is not None and typing["chars"]:
                typing["chars"].pop()
                typing["t1"] = t
            elif key == "enter" and not held.get("shift"):
                end_scroll()
                if typing is None:
                    typing = {"chars": [], "t0": t, "t1": t, "secret": False}
                typing["chars"].append("\n")
                typing["t1"] = t
                end_typing()
            else:
                name = _hotkey_name(key)
                end_typing()
                end_scroll()
                if name is None:
                    continue
                keys = (["shift"] if held.get("shift") else []) + [name]
                out.append(ActionRecord("hotkey", {"key": " ".join(keys)}, t, t))
        elif kind == "key_up":
            key = str(e.get("key", ""))
            mod = MODIFIERS.get(key)
            if mod:
                if held.get(mod):
                    held[mod] -= 1
                    if not held[mod]:
                        del held[mod]
                if lone_mod == mod and mod == "win":
                    end_typing()
                    end_scroll()
                    out.append(ActionRecord("hotkey", {"key": "win"}, t, t))
                lone_mod = None
    end_typing()
    end_scroll()
    out.sort(key=lambda a: a.t_start)
    return out


# ---------------------------------------------------------------- frames and steps
def frames_of(events: list[dict]) -> list[dict]:
    """The frame events, by capture time."""
    return sorted((e for e in events if e.get("kind") == "frame" and e.get("blob")), key=lambda e: e["t"])


def frame_before(frames: list[dict], t: float) -> dict | None:
    """The last frame whose capture finished before t (the screen before an action began)."""
    best = None
    for f in frames:
        if f.get("t_end", f["t"]) <= t:
            best = f
        else:
            break
    return best


NO_FRESH_LIST = "none: no element list was read between the previous action and this one"


def list_event_for(lists: list[dict], gaps: list[float], t_start: float, after: float) -> dict | None:
    """The `elements` event (of `lists`, sorted by t_end) read last entirely after `after` (the
    previous action's end) and after the last capture gap (pause, resume, denied, allowed) before
    an action starting at t_start; None when there is none."""
    floor = max([after] + [g for g in gaps if g <= t_start])
    best = None
    for e in lists:
        if e.get("t_end", e["t"]) > t_start:
            break
        if e["t"] >= floor:
            best = e
    return best


def elements_for(lists: list[dict], gaps: list[float], t_start: float, after: float):
    """(elements, source) for an action starting at t_start (see list_event_for); (None, None)
    when the recording read no lists at all (older recordings, lists switched off)."""
    if not lists:
        return None, None
    best = list_event_for(lists, gaps, t_start, after)
    if best is None:
        return None, NO_FRESH_LIST
    if best.get("elements") is None:
        return None, str(best.get("source") or "none")

    return elements_from_dicts(best["elements"], "raw elements event"), str(best.get("source") or "atspi")


def add_waits(actions: list[ActionRecord], frames: list[dict], events: list[dict], th: Thresholds = Thresholds()) -> list[ActionRecord]:
    """Insert a wait for each input gap of at least wait_idle_s in which the screen changed
    (a frame differing from the one at the gap's start) and capture was not paused."""
    pauses = [e["t"] for e in events if e.get("kind") in ("pause", "denied")]
    out: list[ActionRecord] = []
    for i, a in enumerate(actions):
        out.append(a)
        if i + 1 >= len(actions):
            break
        t0, t1 = a.t_end, actions[i + 1].t_start
        if t1 - t0 < th.wait_idle_s or any(t0 <= p <= t1 for p in pauses):
            continue
        before = frame_before(frames, t0)
        changed = [f for f in frames if t0 < f["t"] and f.get("t_end", f["t"]) <= t1 and (before is None or f["blob"] != before["blob"])]
        if changed:
            out.append(ActionRecord("wait", {}, t0, changed[-1]["t"], {"idle_s": round(t1 - t0, 3)}))
    return out


def attach_texts(windows: list[tuple[float, float]], items: list[tuple[float, str]]) -> list[list[str]]:
    """Give each timed text to a step. Step i's window runs from the end of step i-1 (or the
    recording's start) to its own end: think-aloud mostly says what one is about to do, so words
    spoken before an action belong to it. Texts after the last step go to the last step."""
    out: list[list[str]] = [[] for _ in windows]
    if not windows:
        return out
    ends = [w[1] for w in windows]
    for t, text in sorted(items, key=lambda x: x[0]):
        i = next((k for k, end in enumerate(ends) if t <= end), len(windows) - 1)
        out[i].append(text)
    return out


def build_steps(
    events: list[dict],
    geometry: ScreenGeometry,
    th: Thresholds = Thresholds(),
    words: list[dict] | None = None,
) -> list[Step]:
    """Raw events (frames included) -> the episode's steps, coordinates normalized to the
    captured image. words: [{'text', 't0', 't1'}] on the same clock (a transcript)."""
    frames = frames_of(events)
    actions = add_waits(reduce_actions(events, th), frames, events, th)
    lists = sorted((e for e in events if e.get("kind") == "elements"), key=lambda e: e.get("t_end", e["t"]))
    gaps = [float(e["t"]) for e in events if e.get("kind") in ("pause", "resume", "denied", "allowed")]
    steps: list[Step] = []
    windows = [(a.t_start, a.t_end) for a in actions]
    notes = attach_texts(windows, [(float(e["t"]), str(e.get("text", ""))) for e in events if e.get("kind") == "note"])
    spoken = attach_texts(windows, [(float(w["t0"]), str(w["text"])) for w in (words or [])])
    for i, a in enumerate(actions):
        pre = frame_before(frames, a.t_start)
        next_start = actions[i + 1].t_start if i + 1 < len(actions) else math.inf
        after = [f for f in frames if f["t"] >= a.t_end]
        settled = [f for f in after if f.get("t_end", f["t"]) <= next_start]
        post = settled[-1] if settled else (after[0] if after else None)
        width = int(pre["width"]) if pre else geometry.physical_width
        height = int(pre["height"]) if pre else geometry.physical_height

        def norm(p):
            x, y = coords.screen_to_normalized(p, geometry)
            return (min(1.0, max(0.0, x)), min(1.0, max(0.0, y)))

        try:
            args = {k: (norm(v) if isinstance(v, tuple) else v) for k, v in a.args.items()}
        except coords.CoordinateError:
            continue  # an input outside the captured area (another monitor was not captured)
        thought = " ".join(t for t in (" ".join(notes[i]).strip(), " ".join(spoken[i]).strip()) if t)
        info = dict(a.info)
        info["screen_points"] = [list(v) for v in a.args.values() if isinstance(v, tuple)]
        if pre is not None:
            info["frame_age_s"] = round(a.t_start - pre["t"], 4)
        elements, elements_source = elements_for(lists, gaps, a.t_start, actions[i - 1].t_end if i else -math.inf)
        if notes[i]:
            info["notes"] = notes[i]
        if spoken[i]:
            info["spoken"] = " ".join(spoken[i]).strip()
        steps.append(
            Step(
                index=len(steps),
                observation=Observation(
                    screenshot=pre["blob"] if pre else None,
                    width=width,
                    height=height,
                    geometry=geometry,
                    time=pre["t"] if pre else a.t_start,
                    post_screenshot=post["blob"] if post else None,
                    post_time=post["t"] if post else None,
                    elements=elements,
                    elements_source=elements_source,
                ),
                thought=thought,
                action=Action(a.name, args),
                provenance=Provenance("human"),
                t_start=a.t_start,
                t_end=a.t_end,
                info=info,
            )
        )
    return steps
