"""The annotator's review before anything leaves the machine: delete steps, blur regions.

Both change what is stored, not just the view: a deleted step's frames (when no other step uses
them) and its raw input events in its time span are removed; a blurred region is written into a
new image blob, every step and raw frame event that used the old image now points at the new
one, and the old blob is deleted when nothing else uses it. Elements of a blurred pre-action
frame's list whose box meets the region lose their name and value (the text the blur hides), in
the steps and in the raw lists they were reduced from.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace

from agent.recorder.errors import RecorderError
from agent.recorder.reduce import list_event_for
from agent.redaction import RedactionError
from agent.redaction.frames import blur_rects

INPUT_KINDS = ("mouse_down", "mouse_up", "move", "scroll", "key_down", "key_up", "note", "frame")


def delete_step(store, episode_id: str, index: int) -> None:
    """Remove a step, the raw input in its span (so re-reduction cannot bring it back) and the
    images only it used; later steps are renumbered."""
    delete_steps(store, episode_id, [index])


def delete_steps(store, episode_id: str, indices) -> None:
    """delete_step for several steps at once: one revision, one transaction."""
    ep = store.load_episode(episode_id)
    wanted = set(int(i) for i in indices)
    gone = [s for s in ep.steps if s.index in wanted]
    missing = sorted(wanted - {s.index for s in gone})
    if missing:
        raise RecorderError(f"episode {episode_id} has no step {missing[0]} (it has {len(ep.steps)})")
    before = ep.blob_hashes()
    ep.steps = [s for s in ep.steps if s.index not in wanted]
    for i, s in enumerate(ep.steps):
        s.index = i
    marks = ",".join("?" * len(INPUT_KINDS))
    with store.transaction():
        store.save_episode(ep, bump_revision=True)
        for step in gone:
            store.execute(
                f"DELETE FROM raw_events WHERE episode_id = ? AND t >= ? AND t <= ? AND kind IN ({marks})",
                [episode_id, step.t_start, step.t_end, *INPUT_KINDS],
            )
    store.remove_unreferenced(before - ep.blob_hashes())


def blur_image(data: bytes, rect, strength: int = 16) -> bytes:
    """Pixelate then blur a normalized rect (x0, y0, x1, y1) of an encoded image; same format back."""
    try:
        return blur_rects(data, [rect], strength)
    except RedactionError as e:
        raise RecorderError(str(e)) from None


def blur_region(store, episode_id: str, index: int, rect, which: str = "pre") -> str:
    """Blur `rect` (normalized x0, y0, x1, y1) in step `index`'s pre-action frame ('pre') or
    post-action frame ('post'). Every use of that image in the episode gets the blurred one.
    Returns the new blob's hash."""
    if which not in ("pre", "post"):
        raise RecorderError(f"which must be 'pre' or 'post', got {which!r}")
    ep = store.load_episode(episode_id)
    step = next((s for s in ep.steps if s.index == index), None)
    if step is None:
        raise RecorderError(f"episode {episode_id} has no step {index}")
    old = step.observation.screenshot if which == "pre" else step.observation.post_screenshot
    if not old:
        raise RecorderError(f"step {index} has no {which}-action frame")
    new = store.put_blob(blur_image(store.get_blob(old), rect))
    listed = []  # (step, previous step's end) of the steps whose list describes the blurred frame
    for k, s in enumerate(ep.steps):
        if s.observation.screenshot == old:
            s.observation.screenshot = new
            if s.observation.elements:
                s.observation.elements = _blank_covered(s.observation.elements, rect, s.observation.width,
                                                        s.observation.height)
            listed.append((s, ep.steps[k - 1].t_end if k else -math.inf))
        if s.observation.post_screenshot == old:
            s.observation.post_screenshot = new
    with store.transaction():
        store.save_episode(ep, bump_revision=True)
        store.execute("UPDATE raw_events SET data = replace(data, ?, ?) WHERE episode_id = ? AND kind = 'frame'",
                      [old, new, episode_id])
        _blank_raw_lists(store, episode_id, listed, rect)
    store.remove_unreferenced({old} - {new})
    return new


def _covered(box, rect, width: int, height: int) -> bool:
    x0, y0, x1, y1 = rect[0] * width, rect[1] * height, rect[2] * width, rect[3] * height
    return box[0] < x1 and x0 < box[2] and box[1] < y1 and y0 < box[3]


def _blank_covered(elements, rect, width: int, height: int) -> list:
    return [replace(e, name="", value=None) if _covered(e.box, rect, width, height) else e for e in elements]


def _blank_raw_lists(store, episode_id: str, listed, rect) -> None:
    """The raw `elements` events the listed steps' lists came from, blanked as the steps' are."""
    if not listed:
        return
    rows = store.query("SELECT seq, t, data FROM raw_events WHERE episode_id = ? AND kind = 'elements'", [episode_id])
    if not rows:
        return
    events = sorted(({"seq": r["seq"], "t": r["t"], **json.loads(r["data"])} for r in rows), key=lambda e: e.get("t_end", e["t"]))
    gaps = [r["t"] for r in store.query("SELECT t FROM raw_events WHERE episode_id = ? AND kind IN "
                                        "('pause', 'resume', 'denied', 'allowed')", [episode_id])]
    for step, after in listed:
        e = list_event_for(events, gaps, step.t_start, after)
        if e is None or not e.get("elements"):
            continue
        w, h = step.observation.width, step.observation.height
        e["elements"] = [{**{k: v for k, v in d.items() if k != "value"}, "name": ""}
                         if _covered(d["box"], rect, w, h) else d for d in e["elements"]]
        data = {k: v for k, v in e.items() if k not in ("seq", "t", "kind")}
        store.execute("UPDATE raw_events SET data = ? WHERE episode_id = ? AND seq = ?", [json.dumps(data), episode_id, e["seq"]])
