"""The annotator's review before anything leaves the machine: delete steps, blur regions.

Both change what is stored, not just the view: a deleted step's frames (when no other step uses
them) and its raw input events in its time span are removed; a blurred region is written into a
new image blob, every step and raw frame event that used the old image now points at the new
one, and the old blob is deleted when nothing else uses it.
"""
from __future__ import annotations

from app.recorder.errors import RecorderError

INPUT_KINDS = ("mouse_down", "mouse_up", "move", "scroll", "key_down", "key_up", "note", "frame")


def _unlink_unused(store, hashes) -> int:
    gone = 0
    for h in hashes:
        with store.transaction():
            used = list(store.db.query("SELECT 1 FROM blob_refs WHERE hash = ? LIMIT 1", [h]))
        if not used:
            try:
                store.blob_path(h).unlink()
                gone += 1
            except FileNotFoundError:
                pass
    return gone


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
            store.db.execute(
                f"DELETE FROM raw_events WHERE episode_id = ? AND t >= ? AND t <= ? AND kind IN ({marks})",
                [episode_id, step.t_start, step.t_end, *INPUT_KINDS],
            )
    _unlink_unused(store, before - ep.blob_hashes())


def blur_image(data: bytes, rect, strength: int = 16) -> bytes:
    """Pixelate then blur a normalized rect (x0, y0, x1, y1) of an encoded image; same format back."""
    import cv2
    import numpy as np

    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise RecorderError("the stored screenshot could not be decoded")
    h, w = img.shape[:2]
    x0, y0, x1, y1 = rect
    if not (0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1):
        raise RecorderError(f"blur region must be normalized (x0, y0, x1, y1) with x0 < x1 and y0 < y1 in 0..1, got {rect}")
    a, b = int(x0 * w), int(y0 * h)
    c, d = max(a + 1, int(round(x1 * w))), max(b + 1, int(round(y1 * h)))
    roi = img[b:d, a:c]
    small = cv2.resize(roi, (max(1, roi.shape[1] // strength), max(1, roi.shape[0] // strength)), interpolation=cv2.INTER_AREA)
    roi = cv2.resize(small, (roi.shape[1], roi.shape[0]), interpolation=cv2.INTER_NEAREST)
    img[b:d, a:c] = cv2.GaussianBlur(roi, (0, 0), strength / 2)
    if data[:3] == b"\xff\xd8\xff":
        ext, params = ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 90]
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        ext, params = ".webp", [cv2.IMWRITE_WEBP_QUALITY, 90]
    else:
        ext, params = ".png", []
    ok, buf = cv2.imencode(ext, img, params)
    if not ok:
        raise RecorderError(f"could not re-encode the blurred screenshot as {ext}")
    return buf.tobytes()


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
    for s in ep.steps:
        if s.observation.screenshot == old:
            s.observation.screenshot = new
        if s.observation.post_screenshot == old:
            s.observation.post_screenshot = new
    with store.transaction():
        store.save_episode(ep, bump_revision=True)
        store.db.execute("UPDATE raw_events SET data = replace(data, ?, ?) WHERE episode_id = ? AND kind = 'frame'",
                         [old, new, episode_id])
    _unlink_unused(store, {old} - {new})
    return new
