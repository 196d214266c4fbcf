"""The redaction plan of one episode, kept in episode.meta['redaction'] (plain JSON):

    {"version": 1, "engine": "...", "status": "scanned" | "approved",
     "approved_by": name, "approved_at": wall time, "in_place": bool,
     "audio": {"approved_by", "approved_at"} | null  (audio without a transcript approved for upload),
     "frames": {blob hash: {"boxes": [box, ...], "redacted": blob hash | null}},
     "texts":  {field key: {"sha": sha256 of the text, "spans": [span, ...]}}}

    box  = {"rect": [x0, y0, x1, y1] normalized, "kind": "email" | ... | "manual",
            "by": "detector" | a person's name, "blur": bool, "decided_by": "detector" | name,
            "score": OCR confidence or null}
    span = {"start", "end", "kind", "by", "blur", "decided_by"}

Field keys name where text lives: "instruction", "step/3/thought", "step/3/action/content",
"step/3/info/spoken", "step/3/info/notes/0". A plan keeps offsets, never the text it masks.
"""
from __future__ import annotations

import hashlib

from agent.redaction import RedactionError
from agent.redaction.frames import check_rect
from agent.redaction.patterns import KINDS

PLAN_VERSION = 1
META_KEY = "redaction"
BOX_KINDS = KINDS + ("manual",)
DETECTOR = "detector"


def text_sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def empty_plan(engine: str) -> dict:
    return {"version": PLAN_VERSION, "engine": engine, "status": "scanned", "approved_by": None,
            "approved_at": None, "in_place": False, "audio": None, "frames": {}, "texts": {}}


def plan_of(ep) -> dict | None:
    """The episode's plan, checked; None when it has none."""
    plan = ep.meta.get(META_KEY)
    if plan is None:
        return None
    if not isinstance(plan, dict) or plan.get("version") != PLAN_VERSION:
        raise RedactionError(f"episode {ep.id}: meta['{META_KEY}'] is not a version-{PLAN_VERSION} redaction plan")
    return plan


def new_box(rect, kind: str, by: str, score: float | None = None) -> dict:
    if kind not in BOX_KINDS:
        raise RedactionError(f"unknown kind of box {kind!r}; known: {', '.join(BOX_KINDS)}")
    if not by:
        raise RedactionError("a box needs who found it (the detector or a person's name)")
    return {"rect": [round(v, 5) for v in check_rect(rect)], "kind": kind, "by": by, "blur": True,
            "decided_by": by, "score": score}


def add_box(plan: dict, frame: str, rect, person: str) -> dict:
    """A person's own box on a frame of the plan."""
    entry = _frame(plan, frame)
    box = new_box(rect, "manual", person)
    entry["boxes"].append(box)
    entry["redacted"] = None
    plan["status"] = "scanned"
    return box


def set_blur(plan: dict, frame: str, i: int, blur: bool, person: str) -> None:
    """Blur box i of a frame or keep it clear (a person's decision, recorded as theirs)."""
    boxes = _frame(plan, frame)["boxes"]
    if not 0 <= i < len(boxes):
        raise RedactionError(f"frame {frame[:12]} has {len(boxes)} boxes, not box {i}")
    if boxes[i]["kind"] == "manual" and not blur:
        boxes.pop(i)  # a person's own box taken back: nothing to record
    else:
        boxes[i]["blur"], boxes[i]["decided_by"] = bool(blur), person
    _frame(plan, frame)["redacted"] = None
    plan["status"] = "scanned"


def set_span_blur(plan: dict, key: str, i: int, blur: bool, person: str) -> None:
    entry = plan["texts"].get(key)
    if entry is None or not 0 <= i < len(entry["spans"]):
        raise RedactionError(f"no span {i} in text field {key!r}")
    entry["spans"][i]["blur"], entry["spans"][i]["decided_by"] = bool(blur), person
    plan["status"] = "scanned"


def _frame(plan: dict, frame: str) -> dict:
    entry = plan["frames"].get(frame)
    if entry is None:
        raise RedactionError(f"frame {frame[:12]}… is not in the redaction plan (scan the episode first)")
    return entry


def counts(plan: dict | None) -> dict:
    """{'boxes': n to blur, 'kept': n left clear, 'spans': n to mask, 'frames': n with boxes}."""
    out = {"boxes": 0, "kept": 0, "spans": 0, "frames": 0}
    if not plan:
        return out
    for entry in plan["frames"].values():
        blur = sum(b["blur"] for b in entry["boxes"])
        out["boxes"] += blur
        out["kept"] += len(entry["boxes"]) - blur
        out["frames"] += blur > 0
    out["spans"] = sum(s["blur"] for e in plan["texts"].values() for s in e["spans"])
    return out
