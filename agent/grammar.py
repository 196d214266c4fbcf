"""The UI-TARS grammar: `Thought: ...\nAction: click(start_box='(x,y)')`.

`parse_response` turns a model's text into its thought and actions (points in model space) or
into a `ParseError` value naming what is wrong; it never raises on model output.
`format_response` / `format_action` write the same grammar back: parse(format(a)) == a.
`to_normalized` converts the parsed points into the schema's normalized space.
The prompt is built from the action registry.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from agent import coords
from agent.actions import REGISTRY, actions_for, canonical_keys, validate
from agent.schema import Action


@dataclass(frozen=True)
class ParseError:
    """A model output that cannot be executed, and why. A value, never raised."""

    reason: str
    raw: str = ""

    def __bool__(self) -> Literal[False]:  # `if parsed:` reads as "parsed fine" (and narrows the type)
        return False


@dataclass
class ParsedResponse:
    thought: str
    actions: list[Action]
    reflection: str | None = None
    summary: str | None = None
    raw: str = ""
    space: str | None = None  # None: points are in model space; else normalized from this space

    def __bool__(self) -> Literal[True]:
        return True


_SECTION = re.compile(r"^[ \t]*(Thought|Reflection|Action_Summary|Action)[ \t]*[:：]", re.MULTILINE)
_NUM = r"[-+]?\d+(?:\.\d+)?"
_BRACKETED = re.compile(
    rf"^[\(\[]\s*({_NUM})\s*[, ]\s*({_NUM})\s*(?:[, ]\s*({_NUM})\s*[, ]\s*({_NUM})\s*)?[\)\]]$"
)
_BARE = re.compile(rf"^({_NUM})\s*[, ]\s*({_NUM})(?:\s*[, ]\s*({_NUM})\s*[, ]\s*({_NUM}))?$")
_BBOX = re.compile(rf"^<bbox>\s*({_NUM})\s+({_NUM})\s+({_NUM})\s+({_NUM})\s*</bbox>$")
_POINT = re.compile(rf"^<point>\s*({_NUM})\s+({_NUM})\s*</point>$")


def parse_point(text: str) -> tuple[float, float] | str:
    """A point from any coordinate form UI-TARS models write; a box gives its centre.
    Returns the reason as a string when it cannot be read."""
    s = str(text).replace("<|box_start|>", "").replace("<|box_end|>", "").strip()
    # one space for every run: the patterns' optional separators then cannot backtrack over long
    # whitespace runs (a malformed box with 200-space runs took 32 s before)
    s = re.sub(r"\s+", " ", s)
    for pattern in (_BBOX, _POINT, _BRACKETED, _BARE):
        m = pattern.match(s)
        if m:
            nums = [float(g) for g in m.groups() if g is not None]
            if len(nums) == 4:
                x1, y1, x2, y2 = nums
                return ((x1 + x2) / 2, (y1 + y2) / 2)
            return (nums[0], nums[1])
    return f"cannot read coordinates from {text!r}"


# The most actions one reply may hold. UI-TARS writes one action a reply (rarely two or three,
# split by a blank line), the sandbox's experts and the recipe one; a reply with more is not a
# step but a script the gate would judge from one screen, so it is refused as a format mistake.
MAX_ACTIONS_PER_REPLY = 16


class _Syntax(Exception):
    """Internal: a syntax error inside the action text, turned into a ParseError."""


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}


class _CallReader:
    """Reads `name(key='value', ...)` calls one after another from the action text."""

    def __init__(self, text: str):
        self.s = text
        self.i = 0

    def ws(self):
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1

    def at_end(self) -> bool:
        self.ws()
        return self.i >= len(self.s)

    def ident(self) -> str | None:
        m = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(self.s, self.i)
        if not m:
            return None
        self.i = m.end()
        return m.group(0)

    def quoted(self, name: str, key: str) -> str:
        q = self.s[self.i]
        self.i += 1
        out = []
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "\\" and self.i + 1 < len(self.s):
                nxt = self.s[self.i + 1]
                out.append(_ESCAPES.get(nxt, "\\" + nxt))
                self.i += 2
                continue
            if c == q and self._closes(self.i + 1):
                self.i += 1
                return "".join(out)
            out.append(c)
            self.i += 1
        raise _Syntax(f"unterminated quote in argument {key!r} of {name}(...): the response was cut off or a quote is missing")

    _NEXT_ARG = re.compile(r"\s*(?:[A-Za-z_][A-Za-z0-9_]{0,63}\s*=|['\"(<\[\-+0-9]|\))")
    _NEXT_CALL = re.compile(r"\s*(?:$|[A-Za-z_][A-Za-z0-9_]{0,63}\s*\()")

    def _closes(self, j: int) -> bool:
        """Does the quote just before j close the value? Only where the call goes on from there:
        ', key=...' or another argument, or ')' followed by the end or the next call. Otherwise it
        is a quote inside the text, unescaped, which models write (it's, print('hi'), 'yes'),
        and UI-TARS's own parser keeps as text."""
        while j < len(self.s) and self.s[j] in " \t":
            j += 1
        if j >= len(self.s):
            return True
        if self.s[j] == ",":
            return bool(self._NEXT_ARG.match(self.s, j + 1))
        if self.s[j] == ")":
            return bool(self._NEXT_CALL.match(self.s, j + 1))
        return False

    def bare(self) -> str:
        depth, start = 0, self.i
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in "([{<":
                depth += 1
            elif c in ")]}>":
                if depth == 0:
                    break
                depth -= 1
            elif c == "," and depth == 0:
                break
            self.i += 1
        return self.s[start : self.i].strip()

    def call(self) -> tuple[str, list[tuple[str | None, str]]]:
        self.ws()
        name = self.ident()
        if name is None:
            raise _Syntax(f"expected an action name at {self.s[self.i:self.i + 30]!r}")
        self.ws()
        if self.i >= len(self.s) or self.s[self.i] != "(":
            raise _Syntax(f"expected '(' after {name!r}")
        self.i += 1
        args: list[tuple[str | None, str]] = []
        while True:
            self.ws()
            if self.i >= len(self.s):
                raise _Syntax(f"{name}(...) is not closed: missing ')' (the response may be truncated)")
            if self.s[self.i] == ")":
                self.i += 1
                return name, args
            save = self.i
            key = self.ident()
            self.ws()
            if key is not None and self.i < len(self.s) and self.s[self.i] == "=":
                self.i += 1
                self.ws()
            else:  # a positional argument
                key, self.i = None, save
            if self.i < len(self.s) and self.s[self.i] in "'\"":
                value = self.quoted(name, key or "0")
            else:
                value = self.bare()
                if not value:
                    raise _Syntax(f"empty value for argument {key!r} of {name}(...)")
            args.append((key, value))
            self.ws()
            if self.i < len(self.s) and self.s[self.i] == ",":
                self.i += 1
            elif self.i < len(self.s) and self.s[self.i] != ")":
                raise _Syntax(f"expected ',' or ')' in {name}(...) at {self.s[self.i:self.i + 20]!r}")


def _build_action(name: str, args: list[tuple[str | None, str]]) -> Action | str:
    spec = REGISTRY.get(name)
    if spec is None:
        return f"unknown action {name!r}"
    out: dict = {}
    for pos, (key, value) in enumerate(args):
        if key is None:
            if pos >= len(spec.params):
                return f"{name}: too many arguments"
            p = spec.params[pos]
        else:
            named = spec.param(key)
            if named is None:
                return f"{name}: unknown argument {key!r}"
            p = named
        if p.name in out:
            return f"{name}: argument {p.name!r} given twice"
        if p.kind == "point":
            pt = parse_point(value)
            if isinstance(pt, str):
                return f"{name}: {p.name}: {pt}"
            out[p.name] = pt
        elif p.kind == "key":
            out[p.name] = canonical_keys(value)
        elif p.kind == "direction":
            out[p.name] = value.strip().lower()
        else:
            out[p.name] = value
    action = Action(name, out)
    problem = validate(action, normalized=False)
    if problem:
        return problem
    for pt in action.points():
        if pt[0] < 0 or pt[1] < 0:
            return f"{name}: coordinates {pt} are negative"
    return action


def _sections(text: str) -> dict[str, str]:
    marks = list(_SECTION.finditer(text))
    out: dict[str, str] = {}
    for k, m in enumerate(marks):
        label = m.group(1)
        if label in out:
            if label == "Action":  # a second Action: header continues the action list
                end = marks[k + 1].start() if k + 1 < len(marks) else len(text)
                out[label] += "\n\n" + text[m.end() : end]
            continue
        end = marks[k + 1].start() if k + 1 < len(marks) else len(text)
        out[label] = text[m.end() : end]
    return out


def parse_response(text, platform: str | None = None) -> ParsedResponse | ParseError:
    """Parse a model response. Points stay in model space. Whatever the text, a bad response is a
    ParseError naming what is wrong; an exception is a bug in the parser (the fuzz tests look for
    them), never charged to the model as a format mistake."""
    if not isinstance(text, str):
        return ParseError(f"response must be text, got {type(text).__name__}", repr(text))
    raw = text
    if not text.strip():
        return ParseError("empty response", raw)
    text = re.sub(r"^```[a-zA-Z]*\s*$", "", text, flags=re.MULTILINE)
    sec = _sections(text)
    if "Action" not in sec:
        # 'Action:' after other text on its line ("I'll open it. Action: click(...)", as in
        # UI-TARS-desktop's fixtures): the last one starts the action, as their parser reads it
        at = max(text.rfind("Action:"), text.rfind("Action："))
        if at > 0:
            sec = _sections(text[:at] + "\n" + text[at:])
    if "Action" not in sec:
        return ParseError("no 'Action:' section in the response", raw)
    body = sec["Action"].strip()
    if not body:
        return ParseError("the 'Action:' section is empty", raw)
    reader = _CallReader(body)
    actions: list[Action] = []
    try:
        while not reader.at_end():
            if len(actions) == MAX_ACTIONS_PER_REPLY:
                return ParseError(f"the reply holds more than {MAX_ACTIONS_PER_REPLY} actions; "
                                  "propose one step (a few actions at most) at a time", raw)
            name, args = reader.call()
            built = _build_action(name, args)
            if isinstance(built, str):
                return ParseError(built, raw)
            if platform and platform not in REGISTRY[name].platforms:
                return ParseError(f"action {name!r} is not available on {platform}", raw)
            actions.append(built)
    except _Syntax as e:
        return ParseError(str(e), raw)
    if not actions:
        return ParseError("no action found in the 'Action:' section", raw)
    # a Reflection / Action_Summary reply has no Thought: its summary is the thought (as UI-TARS parses it)
    thought = sec.get("Thought", sec.get("Action_Summary", "")).strip()
    return ParsedResponse(
        thought=thought,
        actions=actions,
        reflection=(sec["Reflection"].strip() if "Reflection" in sec else None),
        summary=(sec["Action_Summary"].strip() if "Action_Summary" in sec else None),
        raw=raw,
    )


def to_normalized(parsed: ParsedResponse, space: str, image_width: int, image_height: int,
                  extent: tuple[int, int] | None = None) -> ParsedResponse | ParseError:
    """Model-space points -> normalized (0..1) points; out-of-range coordinates are an error.
    `extent`: the (width, height) the model's coordinates span when it is not the space's own for
    this screenshot (a local model whose processor resizes with other limits)."""

    def norm(p):
        if extent is None:
            return coords.model_to_normalized(p, space, image_width, image_height)
        w, h = extent
        if not (0 <= p[0] <= w and 0 <= p[1] <= h):
            raise coords.CoordinateError(f"point ({p[0]:g}, {p[1]:g}) lies outside the model's image {w}x{h}")
        return (p[0] / w, p[1] / h)

    out = []
    for a in parsed.actions:
        try:
            out.append(a.map_points(norm))
        except coords.CoordinateError as e:
            return ParseError(f"{a.name}: {e}", parsed.raw)
    return ParsedResponse(parsed.thought, out, parsed.reflection, parsed.summary, parsed.raw, space)


def parse_normalized(text, space: str, image_width: int, image_height: int, platform=None):
    """parse_response + to_normalized: what policies and the agent loop call."""
    parsed = parse_response(text, platform)
    if not parsed:
        return parsed
    return to_normalized(parsed, space, image_width, image_height)


def parse_reply(text, space: str, image_width: int, image_height: int, *, platforms: tuple[str, ...] = (),
                extent: tuple[int, int] | None = None) -> ParsedResponse | ParseError:
    """The one parse of a model's reply, done where the reply arrives (a policy's `parse`, the
    episode runner), whose actions are then handed on as they are: the grammar, every action
    available on one of `platforms` (none given: any), its points normalized to the screenshot
    (to_normalized, with the model's `extent` where it differs from the space's own)."""
    parsed = parse_response(text)
    if not parsed:
        return parsed
    for a in parsed.actions:
        if platforms and not set(REGISTRY[a.name].platforms) & set(platforms):
            return ParseError(f"action {a.name!r} is not available on {'/'.join(platforms)}", parsed.raw)
    return to_normalized(parsed, space, image_width, image_height, extent)


# ---------------------------------------------------------------- formatting


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def escape_text(s: str) -> str:
    return (
        s.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    )


def format_action(action: Action) -> str:
    """One action in the grammar; points must already be in model space."""
    spec = REGISTRY[action.name]
    parts = []
    for p in spec.params:
        if p.name not in action.args:
            continue
        v = action.args[p.name]
        if p.kind == "point":
            parts.append(f"{p.name}='({_num(v[0])},{_num(v[1])})'")
        else:
            parts.append(f"{p.name}='{escape_text(str(v))}'")
    return f"{action.name}({', '.join(parts)})"


def format_for_display(action: Action, geometry=None) -> str:
    """An action as people read it: points in screen pixels where the screen is known (what the
    executor clicks, marked 'px'), else as fractions of the screen to 3 decimals; never a
    normalized float with 16 digits."""
    if not action.points():
        return format_action(action)
    if geometry is not None:
        try:
            return format_action(action.map_points(lambda p: coords.normalized_to_screen(p, geometry))) + " px"
        except coords.CoordinateError:
            pass
    return format_action(action.map_points(lambda p: (round(p[0], 3), round(p[1], 3))))


def format_response(thought: str, actions: list[Action]) -> str:
    body = "\n\n".join(format_action(a) for a in actions)
    return f"Thought: {thought}\nAction: {body}" if thought else f"Action: {body}"


def format_normalized(thought: str, actions: list[Action], space: str, image_width: int, image_height: int) -> str:
    """Schema actions (normalized points) -> the grammar in `space`, for training targets."""
    model = [a.map_points(lambda p: coords.normalized_to_model(p, space, image_width, image_height)) for a in actions]
    return format_response(thought, model)


TOOL_OUTPUT_LIMIT = 2_000  # characters of a tool's output in a prompt (the stored output keeps more)


def format_tool_output(out: dict, limit: int = TOOL_OUTPUT_LIMIT) -> str:
    """A tool action's result (agent.schema's Observation.tool_output) as the model reads it, the
    one rendering the live prompt (agent.policies.memory) and the SFT export share:

        $ grep -c x data.csv          [read_file notes.txt]        [write_file out.txt]
        (exit 0)                      hello                        wrote 5 bytes to out.txt
        12

    An output longer than `limit` keeps its head and its tail (an error is usually at the end)."""
    text = out.get("output") or ""
    if len(text) > limit:
        head = text[: limit // 2]
        text = f"{head}\n[... {len(text) - limit} characters cut ...]\n{text[len(text) - (limit - len(head)):]}"
    if out["tool"] == "run_command":
        code = out.get("exit_code")
        first = f"$ {out['target']}\n" + ("(did not run)" if code is None else f"(exit {code})")
    else:
        first = f"[{out['tool']} {out['target']}]"
    return f"{first}\n{text}" if text else first


# ---------------------------------------------------------------- prompts

_COMPUTER_PROMPT = """You are a GUI agent. You are given a task and your action history, with screenshots. You need to perform the next action to complete the task.

## Output Format
```
Thought: ...
Action: ...
```

## Action Space

{action_space}

## Note
- Use {language} in `Thought` part.
- Write a small plan and finally summarize your next action (with its target element) in one sentence in `Thought` part.

## User Instruction
{instruction}
"""


def action_space_text(platform: str) -> str:
    return "\n".join(s.signature() for s in actions_for(platform))


def system_prompt(instruction: str, platform: str = "desktop", language: str = "English") -> str:
    """UI-TARS-1.5's computer/mobile-use prompt with the action space read from the registry."""
    return _COMPUTER_PROMPT.format(
        action_space=action_space_text(platform), language=language, instruction=instruction
    )
