"""Export episodes as multimodal chat samples in the UI-TARS prompt format.

One sample per step: the system prompt with the action space and the instruction, then the
history (earlier thoughts and actions as assistant turns, the last N screenshots as user image
turns), and the target: that step's thought and action as the final assistant turn. This is the
`messages` + `images` form that common SFT trainers read (LLaMA-Factory, TRL, ms-swift): each
user image turn holds an `<image>` placeholder, matched in order by the `images` list.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from agent import coords
from agent.grammar import format_normalized, system_prompt
from agent.schema import Episode

IMAGE_TOKEN = "<image>"


def image_ext(data: bytes) -> str:
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return ".png"
    if data[:3] == b"\xff\xd8\xff":
        return ".jpg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ".webp"
    return ".bin"


def step_target(ep: Episode, i: int, space: str) -> str:
    s = ep.steps[i]
    return format_normalized(s.thought, [s.action], space, s.observation.width, s.observation.height)


def episode_samples(ep: Episode, *, space: str = coords.SMART_RESIZE, max_images: int = 5, image_ref=None):
    """Yield (sample_dict) for each step with a screenshot. image_ref(hash) -> what to put in
    `images` (a path); defaults to the hash itself."""
    image_ref = image_ref or (lambda h: h)
    sys_text = system_prompt(ep.instruction, "android" if ep.platform == "android" else "desktop")
    for t, step in enumerate(ep.steps):
        if not step.observation.screenshot:
            continue
        messages = [{"role": "system", "content": sys_text}]
        images = []
        first_image = max(0, t - max_images + 1)  # the last N screenshots, the current one included
        for k in range(t + 1):
            s = ep.steps[k]
            if k >= first_image and s.observation.screenshot:
                messages.append({"role": "user", "content": IMAGE_TOKEN})
                images.append(image_ref(s.observation.screenshot))
            if k < t:
                messages.append({"role": "assistant", "content": step_target(ep, k, space)})
        messages.append({"role": "assistant", "content": step_target(ep, t, space)})
        yield {
            "id": f"{ep.id}-{step.index}",
            "episode_id": ep.id,
            "step": step.index,
            "kind": ep.kind,
            "route": ep.route,
            "provenance": step.provenance.source,
            "coords": space,
            "messages": messages,
            "images": images,
        }


def export_jsonl(store, out_path, episode_ids=None, *, space=coords.SMART_RESIZE, max_images=5, route=None, progress=None) -> dict:
    """Write samples to `out_path` and their images into `images/` beside it. Episodes whose privacy
    review was approved are written redacted (blurred screenshots, masked text: what a sync would
    send); recordings not reviewed yet are written as they are and listed under "unreviewed".

    Returns counts. The image files are hard links to the store's blobs where possible.
    """
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    img_dir = out_path.parent / "images"
    img_dir.mkdir(exist_ok=True)
    ids = list(episode_ids) if episode_ids else [e.id for e in store.list_episodes(route=route)]
    names: dict[str, str] = {}

    def image_ref(h: str) -> str:
        if h not in names:
            src = store.blob_path(h)
            with open(src, "rb") as f:
                ext = image_ext(f.read(16))
            dst = img_dir / f"{h}{ext}"
            if not dst.exists():
                try:
                    os.link(src, dst)
                except OSError:
                    shutil.copyfile(src, dst)
            names[h] = f"images/{dst.name}"
        return names[h]

    from agent.redaction import RedactionError
    from agent.redaction.review import upload_view

    n_samples, unreviewed = 0, []
    tmp = out_path.with_suffix(out_path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for k, eid in enumerate(ids):
            ep = store.load_episode(eid)
            try:  # training data is what may leave the machine: the privacy review's redacted version
                ep = upload_view(store, ep)
            except RedactionError:  # a recording not reviewed yet: exported as it is, and said
                unreviewed.append(eid)
            for sample in episode_samples(ep, space=space, max_images=max_images, image_ref=image_ref):
                f.write(json.dumps(sample, ensure_ascii=False) + "\n")
                n_samples += 1
            if progress:
                progress(k + 1, len(ids))
    os.replace(tmp, out_path)
    return {"episodes": len(ids), "samples": n_samples, "images": len(names), "path": str(out_path),
            "unreviewed": unreviewed}
