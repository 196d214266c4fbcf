"""The one trajectory schema: an episode of steps, tau = {(thought_t, action_t, observation_t)}.

A recording, a supervised run, an autonomous run and a sandbox rollout are all episodes.
Coordinates inside actions are stored normalized to the screenshot (0..1 fractions of its
width and height); the screen geometry stored beside each observation turns them into screen
pixels (see agent.coords). Everything here is plain data with explicit to_dict/from_dict so the
same JSON travels through the store, the export and the sync protocol.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from agent.actions import REGISTRY
from agent.elements import ElementError, elements_from_dicts
from agent.errors import TandemError

SCHEMA_VERSION = 1

EPISODE_KINDS = ("recording", "supervised", "autonomous", "rollout")
ROUTES = ("unscored", "sft", "ct", "rejected")
PROVENANCES = ("human", "agent", "corrected")


class SchemaError(TandemError, ValueError):
    """A dict that does not describe a valid episode, step or action."""


def monotonic() -> float:
    """The one clock for frames, input and audio (seconds, arbitrary origin)."""
    return time.monotonic()


def _lone_surrogate_at(obj) -> str | None:
    """Where in a decoded JSON document a string holds a lone UTF-16 surrogate ("\\ud800" decodes
    to one): such a string is not text, and UTF-8 (SQLite, the wire, content hashes) refuses it."""
    todo = [("", obj)]
    while todo:
        path, o = todo.pop()
        if isinstance(o, str):
            try:
                o.encode("utf-8")
            except UnicodeEncodeError:
                return path or "the document"
        elif isinstance(o, dict):
            todo += [(f"{path}.{k}" if path else str(k), v) for k, v in o.items()]
            todo += [(f"{path} key", k) for k in o if isinstance(k, str)]
        elif isinstance(o, (list, tuple)):
            todo += [(f"{path}[{i}]", v) for i, v in enumerate(o)]
    return None


def check_text(d, where: str) -> None:
    """SchemaError when a string anywhere in `d` is not encodable text (a lone surrogate)."""
    try:
        json.dumps(d, ensure_ascii=False).encode("utf-8")  # the C encoder: fast on the usual, clean document
        return
    except UnicodeEncodeError:
        pass
    except (TypeError, ValueError, RecursionError):  # not JSON-shaped: the field checks name what is wrong
        return
    at = str(_lone_surrogate_at(d)).encode("utf-8", "backslashreplace").decode()  # a key may hold it too
    raise SchemaError(f"{where}: {at} holds a lone UTF-16 surrogate, which is not text")


def _require(d: dict, key: str, where: str) -> Any:
    if not isinstance(d, dict):
        raise SchemaError(f"{where}: expected an object, got {type(d).__name__}")
    if key not in d:
        raise SchemaError(f"{where}: missing field {key!r}")
    return d[key]


@dataclass(frozen=True)
class ScreenGeometry:
    """Where a screenshot came from.

    logical size and origin are in the OS input coordinate space (what pyautogui/xdotool take);
    physical size is the captured pixel size; scale_factor = physical / logical.
    """

    logical_width: int
    logical_height: int
    physical_width: int
    physical_height: int
    scale_factor: float = 1.0
    origin_x: int = 0
    origin_y: int = 0

    @classmethod
    def simple(cls, width: int, height: int, scale: float = 1.0, origin=(0, 0)) -> ScreenGeometry:
        """Geometry of a screenshot of `width`x`height` physical pixels at `scale`."""
        return cls(
            logical_width=round(width / scale),
            logical_height=round(height / scale),
            physical_width=width,
            physical_height=height,
            scale_factor=scale,
            origin_x=origin[0],
            origin_y=origin[1],
        )

    def to_dict(self) -> dict:
        return {
            "logical_width": self.logical_width,
            "logical_height": self.logical_height,
            "physical_width": self.physical_width,
            "physical_height": self.physical_height,
            "scale_factor": self.scale_factor,
            "origin_x": self.origin_x,
            "origin_y": self.origin_y,
        }

    @classmethod
    def from_dict(cls, d: dict) -> ScreenGeometry:
        where = "geometry"
        try:
            g = cls(
                logical_width=int(_require(d, "logical_width", where)),
                logical_height=int(_require(d, "logical_height", where)),
                physical_width=int(_require(d, "physical_width", where)),
                physical_height=int(_require(d, "physical_height", where)),
                scale_factor=float(d.get("scale_factor", 1.0)),
                origin_x=int(d.get("origin_x", 0)),
                origin_y=int(d.get("origin_y", 0)),
            )
        except (TypeError, ValueError) as e:
            if isinstance(e, SchemaError):
                raise
            raise SchemaError(f"{where}: {e}") from None
        if min(g.logical_width, g.logical_height, g.physical_width, g.physical_height) <= 0:
            raise SchemaError(f"{where}: sizes must be positive, got {g.to_dict()}")
        if g.scale_factor <= 0:
            raise SchemaError(f"{where}: scale_factor must be positive, got {g.scale_factor}")
        return g


@dataclass(frozen=True)
class Action:
    """A typed action: a registry name and its arguments.

    Point arguments are (x, y) tuples. Inside the schema they are normalized to the screenshot
    (0..1); the grammar layer works with the same class in model space (see agent.grammar).
    """

    name: str
    args: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "args": {k: list(v) if isinstance(v, tuple) else v for k, v in self.args.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> Action:
        name = _require(d, "name", "action")
        args = d.get("args") or {}
        if not isinstance(args, dict):
            raise SchemaError(f"action {name!r}: args must be an object")
        spec = REGISTRY.get(name)
        if spec is None:
            raise SchemaError(f"action: unknown action {name!r}")
        out = {}
        for k, v in args.items():
            p = spec.param(k)
            if p is None:
                raise SchemaError(f"action {name!r}: unknown argument {k!r}")
            if p.kind == "point":
                if not (isinstance(v, (list, tuple)) and len(v) == 2):
                    raise SchemaError(f"action {name!r}: {k} must be [x, y], got {v!r}")
                v = (float(v[0]), float(v[1]))
            out[k] = v
        return cls(name, out)

    def points(self) -> list[tuple[float, float]]:
        """The action's points in declaration order (start before end)."""
        spec = REGISTRY[self.name]
        return [self.args[p.name] for p in spec.params if p.kind == "point" and p.name in self.args]

    def map_points(self, fn) -> Action:
        """A copy with every point replaced by fn(point)."""
        return Action(self.name, {k: (fn(v) if isinstance(v, tuple) else v) for k, v in self.args.items()})


@dataclass
class Observation:
    screenshot: str | None  # blob hash of the pre-action frame
    width: int  # screenshot pixel size
    height: int
    geometry: ScreenGeometry
    time: float = 0.0  # monotonic clock of the frame
    post_screenshot: str | None = None  # frame after the screen settled
    post_time: float | None = None
    extra: dict = field(default_factory=dict)  # e.g. a UI hierarchy, focused window title
    # what was on the pre-action frame (agent.elements.Element, screenshot pixels); None: no list
    elements: list | None = None
    # where the list came from (atspi | uiautomator2 | dom | sandbox), or why there is none ("none: ...")
    elements_source: str | None = None
    # what the previous tool action (run_command, read_file, write_file) gave back, seen with this frame:
    # {"tool", "target" (the command or the path), "exit_code" (int, None for file tools), "output", "truncated"}
    tool_output: dict | None = None

    def to_dict(self) -> dict:
        d: dict = {
            "screenshot": self.screenshot,
            "width": self.width,
            "height": self.height,
            "geometry": self.geometry.to_dict(),
            "time": self.time,
            "post_screenshot": self.post_screenshot,
            "post_time": self.post_time,
            "extra": self.extra,
        }
        # written only when present: an episode without lists keeps its dict (and content hash) as before
        if self.elements is not None:
            d["elements"] = [e.to_dict() for e in self.elements]
        if self.elements_source is not None:
            d["elements_source"] = self.elements_source
        if self.tool_output is not None:
            d["tool_output"] = dict(self.tool_output)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Observation:
        where = "observation"
        try:
            return cls(
                screenshot=d.get("screenshot") if isinstance(d, dict) else None,
                width=int(_require(d, "width", where)),
                height=int(_require(d, "height", where)),
                geometry=ScreenGeometry.from_dict(_require(d, "geometry", where)),
                time=float(d.get("time", 0.0)),
                post_screenshot=d.get("post_screenshot"),
                post_time=d.get("post_time"),
                extra=dict(d.get("extra") or {}),
                elements=_elements(d.get("elements"), where),
                elements_source=_elements_source(d.get("elements_source"), where),
                tool_output=_tool_output(d.get("tool_output"), where),
            )
        except (TypeError, ValueError) as e:
            if isinstance(e, SchemaError):
                raise
            raise SchemaError(f"{where}: {e}") from None


def _elements(items, where: str) -> list | None:
    """An observation's element list (agent.elements), validated; None stays None (no list)."""
    if items is None:
        return None

    try:
        return elements_from_dicts(items, f"{where}: elements")
    except ElementError as e:
        raise SchemaError(str(e)) from None


TOOL_OUTPUT_TOOLS = ("run_command", "read_file", "write_file")


def _tool_output(out, where: str) -> dict | None:
    """A tool action's result beside an observation, validated; None stays None (no tool ran)."""
    if out is None:
        return None
    where = f"{where}: tool_output"
    if not isinstance(out, dict):
        raise SchemaError(f"{where} must be an object, got {type(out).__name__}")
    if out.get("tool") not in TOOL_OUTPUT_TOOLS:
        raise SchemaError(f"{where}: tool must be one of {TOOL_OUTPUT_TOOLS}, got {out.get('tool')!r}")
    for name in ("target", "output"):
        if not isinstance(out.get(name), str):
            raise SchemaError(f"{where}: {name} must be a string, got {type(out.get(name)).__name__}")
    code = out.get("exit_code")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
        raise SchemaError(f"{where}: exit_code must be an integer or null, got {code!r}")
    return {"tool": out["tool"], "target": out["target"], "exit_code": code, "output": out["output"],
            "truncated": bool(out.get("truncated", False))}


def _elements_source(source, where: str) -> str | None:
    if source is not None and not isinstance(source, str):
        raise SchemaError(f"{where}: elements_source must be a string, got {type(source).__name__}")
    return source


@dataclass
class Provenance:
    """Who produced a step. A correction keeps the agent's original proposal beside it."""

    source: str = "human"  # human | agent | corrected
    proposal_thought: str | None = None
    proposal_action: Action | None = None
    policy_version: str | None = None
    decision: str | None = None  # approve | edit | reject | takeover, when a human gated it
    reason: str | None = None  # a rejection's reason
    decided_by: str | None = None
    decision_seconds: float | None = None

    def __post_init__(self):
        if self.source not in PROVENANCES:
            raise SchemaError(f"provenance: source must be one of {PROVENANCES}, got {self.source!r}")

    def after_edit(self, old_thought: str, old_action: Action, thought: str, action: Action) -> Provenance:
        """A human edit of an agent's step makes it a correction that keeps the agent's proposal;
        human steps stay human; a correction keeps its original proposal."""
        if (thought, action) == (old_thought, old_action) or self.source != "agent":
            return self
        return replace(self, source="corrected", proposal_thought=old_thought, proposal_action=old_action, decision="edit")

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "proposal_thought": self.proposal_thought,
            "proposal_action": self.proposal_action.to_dict() if self.proposal_action else None,
            "policy_version": self.policy_version,
            "decision": self.decision,
            "reason": self.reason,
            "decided_by": self.decided_by,
            "decision_seconds": self.decision_seconds,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Provenance:
        if not isinstance(d, dict):
            raise SchemaError("provenance: expected an object")
        pa = d.get("proposal_action")
        return cls(
            source=d.get("source", "human"),
            proposal_thought=d.get("proposal_thought"),
            proposal_action=Action.from_dict(pa) if pa else None,
            policy_version=d.get("policy_version"),
            decision=d.get("decision"),
            reason=d.get("reason"),
            decided_by=d.get("decided_by"),
            decision_seconds=d.get("decision_seconds"),
        )


@dataclass
class Step:
    index: int
    observation: Observation
    thought: str
    action: Action
    provenance: Provenance = field(default_factory=Provenance)
    t_start: float = 0.0  # monotonic: when the action began
    t_end: float = 0.0  # monotonic: when it ended
    reward: float = 0.0
    terminated: bool = False  # a real end (finished, verifier said done)
    truncated: bool = False  # cut by a limit: bootstrap, never merge with terminated
    raw_response: str | None = None  # the model's text, when a model proposed it
    info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "observation": self.observation.to_dict(),
            "thought": self.thought,
            "action": self.action.to_dict(),
            "provenance": self.provenance.to_dict(),
            "t_start": self.t_start,
            "t_end": self.t_end,
            "reward": self.reward,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "raw_response": self.raw_response,
            "info": self.info,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Step:
        where = "step"
        try:
            return cls(
                index=int(_require(d, "index", where)),
                observation=Observation.from_dict(_require(d, "observation", where)),
                thought=str(d.get("thought") or ""),
                action=Action.from_dict(_require(d, "action", where)),
                provenance=Provenance.from_dict(d.get("provenance") or {}),
                t_start=float(d.get("t_start", 0.0)),
                t_end=float(d.get("t_end", 0.0)),
                reward=float(d.get("reward", 0.0)),
                terminated=bool(d.get("terminated", False)),
                truncated=bool(d.get("truncated", False)),
                raw_response=d.get("raw_response"),
                info=_step_info(d.get("info")),
            )
        except (TypeError, ValueError) as e:
            if isinstance(e, SchemaError):
                raise
            raise SchemaError(f"{where}: {e}") from None


def _step_info(info) -> dict:
    """A step's info, with the actions it holds validated: `more_actions` (the later actions of a
    multi-action reply) become training targets, so an unknown one is refused here, where the
    episode arrives, not when the flywheel builds its samples."""
    info = dict(info or {})
    more = info.get("more_actions")
    if more is not None:
        if not isinstance(more, list):
            raise SchemaError(f"step info: more_actions must be a list of actions, got {type(more).__name__}")
        for a in more:
            Action.from_dict(a)
    return info


@dataclass
class Outcome:
    success: bool | None = None  # None: not judged yet
    reward: float | None = None
    source: str | None = None  # verifier | annotator | supervisor | orm | rules

    def to_dict(self) -> dict:
        return {"success": self.success, "reward": self.reward, "source": self.source}

    @classmethod
    def from_dict(cls, d: dict | None) -> Outcome:
        d = d or {}
        return cls(success=d.get("success"), reward=d.get("reward"), source=d.get("source"))


@dataclass
class Episode:
    instruction: str
    kind: str = "recording"
    platform: str = "desktop"  # desktop | android | sandbox | terminal
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    producer: str | None = None  # the annotator's name or the policy version
    policy_version: str | None = None
    outcome: Outcome = field(default_factory=Outcome)
    route: str = "unscored"  # as written; the flywheel's route is the store's judgement (Store.judgement)
    created_at: float = field(default_factory=time.time)  # wall clock, for people
    updated_at: float = field(default_factory=time.time)
    revision: int = 0
    schema_version: int = SCHEMA_VERSION
    steps: list[Step] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in EPISODE_KINDS:
            raise SchemaError(f"episode: kind must be one of {EPISODE_KINDS}, got {self.kind!r}")
        if self.route not in ROUTES:
            raise SchemaError(f"episode: route must be one of {ROUTES}, got {self.route!r}")

    def to_dict(self, with_steps: bool = True) -> dict:
        d: dict = {
            "id": self.id,
            "kind": self.kind,
            "instruction": self.instruction,
            "platform": self.platform,
            "producer": self.producer,
            "policy_version": self.policy_version,
            "outcome": self.outcome.to_dict(),
            "route": self.route,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "revision": self.revision,
            "schema_version": self.schema_version,
            "meta": self.meta,
        }
        if with_steps:
            d["steps"] = [s.to_dict() for s in self.steps]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Episode:
        where = "episode"
        version = int(_require(d, "schema_version", where))
        check_text(d, f"{where} {str(d.get('id'))[:80]!r}")
        if version > SCHEMA_VERSION:
            raise SchemaError(f"{where}: schema_version {version} is newer than this Tandem ({SCHEMA_VERSION})")
        try:
            ep = cls(
                id=str(_require(d, "id", where)),
                kind=_require(d, "kind", where),
                instruction=str(_require(d, "instruction", where)),
                platform=str(d.get("platform", "desktop")),
                producer=d.get("producer"),
                policy_version=d.get("policy_version"),
                outcome=Outcome.from_dict(d.get("outcome")),
                route=d.get("route", "unscored"),
                created_at=float(d.get("created_at", 0.0)),
                updated_at=float(d.get("updated_at", 0.0)),
                revision=int(d.get("revision", 0)),
                schema_version=version,
                steps=[Step.from_dict(s) for s in d.get("steps") or []],
                meta=dict(d.get("meta") or {}),
            )
        except (TypeError, ValueError) as e:
            if isinstance(e, SchemaError):
                raise
            raise SchemaError(f"{where}: {e}") from None
        seen = set()
        for st in ep.steps:  # a step is stored under (episode, index)
            if st.index in seen:
                raise SchemaError(f"{where} {ep.id[:80]!r}: step index {st.index} appears twice")
            seen.add(st.index)
        return ep

    def blob_hashes(self) -> set[str]:
        """Every blob this episode refers to (screenshots, audio)."""
        out = set()
        for s in self.steps:
            for h in (s.observation.screenshot, s.observation.post_screenshot):
                if h:
                    out.add(h)
        for h in self.meta.get("audio_blobs", []) or []:
            out.add(h)
        redaction = self.meta.get("redaction")  # the blurred frames a privacy review wrote (agent.redaction)
        if isinstance(redaction, dict) and isinstance(redaction.get("frames"), dict):
            out.update(e["redacted"] for e in redaction["frames"].values() if isinstance(e, dict) and e.get("redacted"))
        return out
