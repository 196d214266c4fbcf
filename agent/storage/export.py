"""Export episodes as multimodal chat samples in the UI-TARS prompt format.

One sample per step: the system prompt with the action space and the instruction, then the
history (earlier thoughts and actions as assistant turns, the last N screenshots as user image
turns, each tool action's output as a user text turn), and the target: that step's thought and action as the final assistant turn. This is the
`messages` + `images` form that common SFT trainers read (LLaMA-Factory, TRL, ms-swift): each
user image turn holds an `<image>` placeholder, matched in order by the `images` list.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from agent import coords
from agent.errors import TandemError
from agent.grammar import TOOL_OUTPUT_LIMIT, format_normalized, format_tool_output, system_prompt
from agent.redaction import RedactionError
from agent.redaction.review import auto_redaction_due, redacted_episode, upload_view
from agent.schema import Episode
from agent.wording import command_name, plural

IMAGE_TOKEN = "<image>"


class ExportRefused(TandemError):
    """An export that would write data the privacy review has not cleared, refused; the message
    says how many episodes and which."""


def without_review(store, episode_ids) -> list[str]:
    """The episodes that have no redacted version to export: recordings whose privacy review is
    not approved (or that changed since). Exporting them writes their original frames and text.
    A run redacted automatically has one; it is made when the export writes it (in its worker:
    this check reads no frame)."""
    out = []
    for eid in episode_ids:
        try:
            ep = store.load_episode(eid)
            if not auto_redaction_due(store, ep):
                upload_view(store, ep)
        except RedactionError:
            out.append(eid)
    return out


def check_exportable(store, episode_ids, include_originals: bool) -> list[str]:
    """The ids without an approved review (see without_review); ExportRefused when there are any
    and the originals were not asked for."""
    ids = list(episode_ids)
    missing = without_review(store, ids)
    if missing and not include_originals:
        one = len(missing) == 1
        it = "it" if one else "them"
        raise ExportRefused(
            f"{len(missing)} of {plural(len(ids), 'episode')} {'has' if one else 'have'} no approved privacy review "
            f"({', '.join(missing[:3])}{', …' if len(missing) > 3 else ''}): exporting {it} would write the original "
            f"screenshots and text. Review {it} first (`{command_name()} redact scan ID`, then `redact approve ID "
            f"--by NAME`), or export the originals on purpose with --include-originals")
    return missing


def export_view(store, ep: Episode, include_originals: bool = False) -> Episode:
    """What an export writes of `ep`: the version a sync sends (the privacy review's blurred
    frames and masked text, audio only as the review allows), or as stored with include_originals.
    A recording not reviewed yet raises RedactionError unless include_originals."""
    return ep if include_originals else redacted_episode(store, ep)


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


def episode_samples(ep: Episode, *, space: str = coords.SMART_RESIZE, max_images: int = 5, image_ref=None,
                    tool_output_limit: int = TOOL_OUTPUT_LIMIT):
    """Yield (sample_dict) for each step with a screenshot. image_ref(hash) -> what to put in
    `images` (a path); defaults to the hash itself. A tool action's output is a user text turn
    before the next screenshot, rendered as the live prompt renders it (agent.grammar.format_tool_output)."""
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
            if s.observation.tool_output is not None:  # what the tool action before step k gave back
                messages.append({"role": "user", "content": format_tool_output(s.observation.tool_output, tool_output_limit)})
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


def export_jsonl(store, out_path, episode_ids=None, *, space=coords.SMART_RESIZE, max_images=5, route=None, progress=None,
                 include_originals: bool = False) -> dict:
    """Write samples to `out_path` and their images into `images/` beside it: the privacy
    review's redacted version of each episode (export_view). A recording without an approved
    review refuses the export (ExportRefused, nothing written) unless include_originals, which
    writes every episode as stored; those without a review are listed under "unreviewed".

    Returns counts. The image files are hard links to the store's blobs where possible.
    """
    ids = list(episode_ids) if episode_ids else [e.id for e in store.list_episodes(route=route)]
    unreviewed = check_exportable(store, ids, include_originals)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    img_dir = out_path.parent / "images"
    img_dir.mkdir(exist_ok=True)
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

    n_samples = 0
    tmp = out_path.with_suffix(out_path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for k, eid in enumerate(ids):
            ep = export_view(store, store.load_episode(eid), include_originals)
            route = store.judgement(eid).route  # the flywheel's, of the content stored (not the export view's)
            for sample in episode_samples(ep, space=space, max_images=max_images, image_ref=image_ref):
                sample["route"] = route
                f.write(json.dumps(sample, ensure_ascii=False) + "\n")
                n_samples += 1
            if progress:
                progress(k + 1, len(ids))
    os.replace(tmp, out_path)
    return {"episodes": len(ids), "samples": n_samples, "images": len(names), "path": str(out_path),
            "unreviewed": unreviewed, "originals": include_originals}
