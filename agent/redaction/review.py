"""Scan an episode for personal data, approve what will be blurred and masked, and build the
redacted version that leaves the machine.

    scan(store, id)            OCR every frame not scanned yet, find personal data in every text
                               field, keep it in the episode's plan (status 'scanned')
    approve(store, id, by)     write the blurred frames as new blobs beside the originals; with
                               keep_originals off, the episode itself becomes the redacted one
                               and the originals are deleted
    upload_view(store, ep)     what sync sends: redacted frames, masked text, and a record of
                               each decision (what, where, by whom) in meta['redaction']; audio
                               only when its transcript holds no personal data, or when it has
                               no transcript and a person approved it as audio (approve(audio=True))

    auto_redact(store, id)     scan and approve as AUTOMATIC: how a supervised or autonomous run on
                               a real screen is cleared (agent.redaction.runs), done by
                               upload_view when the run has no current approved plan

All of it runs after recording stops, in a worker (the app) or the CLI, never on the capture
path. Recordings made by the recorder are not uploaded before their review is approved, unless
the store's setting privacy.require_review is false; runs on a real screen neither, when the
setting privacy.runs is 'review'.
"""
from __future__ import annotations

import copy
import json
import time
from dataclasses import replace

from agent.redaction import RedactionError
from agent.redaction.frames import blur_rects, decode, find_regions
from agent.redaction.ocr import shared_engine
from agent.redaction.patterns import Span, find_pii, mask
from agent.redaction.plan import DETECTOR, META_KEY, empty_plan, new_box, plan_of, text_sha
from agent.redaction.runs import AUTOMATIC, real_run, runs_mode
from agent.schema import Episode
from agent.wording import command_name

REQUIRE_REVIEW_KEY = "privacy.require_review"  # default True
KEEP_ORIGINALS_KEY = "privacy.keep_originals"  # default True
META_TEXTS = ("end_reason", "unexecuted")  # the run's texts kept in meta (agent.run.loop)
_SECRET = "\u2022"  # what the recorder stores for a masked keystroke (agent.recorder.reduce.MASK_CHAR)


# ---------------------------------------------------------------- text fields
def text_fields(ep: Episode) -> list[tuple[str, str]]:
    """(key, text) of every piece of free text in the episode that could hold personal data and
    is uploaded: the instruction, thoughts, typed text, the model's replies, the proposals kept
    beside corrections, rejection records, tool output and notes (anything in a step's info, and an
    observation's tool_output), window titles and screen text (anything in an observation's extra), the names and values of
    the observation's elements (a label holding an e-mail address, a field's text), why a run
    ended and what it left unexecuted."""
    out = [("instruction", ep.instruction)]
    out += [kv for k in META_TEXTS for kv in _nested_strings(ep.meta.get(k), f"meta/{k}")]
    for s in ep.steps:
        p, pv = f"step/{s.index}", s.provenance
        out.append((f"{p}/thought", s.thought))
        out += [(f"{p}/action/{k}", v) for k, v in s.action.args.items()]
        out += [(f"{p}/raw_response", s.raw_response), (f"{p}/provenance/proposal_thought", pv.proposal_thought),
                (f"{p}/provenance/reason", pv.reason)]
        if pv.proposal_action is not None:
            out += [(f"{p}/provenance/proposal_action/{k}", v) for k, v in pv.proposal_action.args.items()]
        out += _nested_strings(s.info, f"{p}/info")
        out += _nested_strings(s.observation.extra, f"{p}/observation/extra")
        if s.observation.tool_output is not None:  # a command and what it printed, a file's path and content
            out += [(f"{p}/observation/tool_output/{k}", s.observation.tool_output[k]) for k in ("target", "output")]
        for i, e in enumerate(s.observation.elements or ()):
            out += [(f"{p}/observation/elements/{i}/name", e.name), (f"{p}/observation/elements/{i}/value", e.value)]
    return [(k, t) for k, t in out if isinstance(t, str) and t]


def _escape(part) -> str:  # a dict key inside a field key, as a JSON pointer escapes it
    return str(part).replace("~", "~0").replace("/", "~1")


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


def _nested_strings(obj, prefix: str) -> list[tuple[str, str]]:
    if isinstance(obj, str):
        return [(prefix, obj)]
    if isinstance(obj, dict):
        return [kv for k, v in obj.items() for kv in _nested_strings(v, f"{prefix}/{_escape(k)}")]
    if isinstance(obj, list):
        return [kv for i, v in enumerate(obj) for kv in _nested_strings(v, f"{prefix}/{i}")]
    return []


def _set_nested(obj, parts: list[str], text: str) -> None:
    for part in parts[:-1]:
        obj = obj[int(part)] if isinstance(obj, list) else obj[_unescape(part)]
    last = parts[-1]
    if isinstance(obj, list):
        obj[int(last)] = text
    else:
        obj[_unescape(last)] = text


def _set_text(ep: Episode, key: str, text: str) -> None:
    """Put `text` where field `key` (of text_fields) lives; nested containers are changed in place."""
    parts = key.split("/")
    if parts == ["instruction"]:
        ep.instruction = text
        return
    if parts[0] == "meta":
        _set_nested(ep.meta, parts[1:], text)
        return
    step = next(s for s in ep.steps if s.index == int(parts[1]))
    where, rest = parts[2], parts[3:]
    if where == "thought":
        step.thought = text
    elif where == "raw_response":
        step.raw_response = text
    elif where == "action":
        step.action = type(step.action)(step.action.name, {**step.action.args, rest[0]: text})
    elif where == "provenance" and rest[0] == "proposal_action":
        a = step.provenance.proposal_action
        step.provenance.proposal_action = type(a)(a.name, {**a.args, rest[1]: text})
    elif where == "provenance":
        setattr(step.provenance, rest[0], text)
    elif where == "info":
        _set_nested(step.info, rest, text)
    elif rest[0] == "tool_output":  # observation/tool_output/target|output
        step.observation.tool_output = {**step.observation.tool_output, rest[1]: text}
    elif rest[0] == "elements":  # observation/elements/<i>/name|value
        i = int(rest[1])
        step.observation.elements[i] = replace(step.observation.elements[i], **{rest[2]: text})
    else:  # observation/extra/...
        _set_nested(step.observation.extra, rest[1:], text)


_FIELD_WORDS = {"thought": "thought", "action": "typed text", "raw_response": "model's reply",
                "proposal_thought": "model's proposal", "proposal_action": "model's proposal",
                "reason": "rejection reason", "spoken": "spoken", "notes": "note", "rejections": "rejected proposal",
                "parse_failures": "unreadable reply", "focused_window": "window title", "more_actions": "typed text",
                "element_name": "element name", "element_value": "element text", "tool_output": "tool output",
                "tool_result": "tool call", "target": "tool call", "output": "tool output"}


def field_label(key: str) -> str:
    """Where a text field is, in words a person reads ("Step 2 window title")."""
    parts = key.split("/")
    if parts[0] != "step":  # "instruction", "meta/end_reason", "meta/unexecuted/..."
        return {"instruction": "Instruction", "end_reason": "Why the run ended",
                "unexecuted": "Proposal left unexecuted"}.get(parts[min(1, len(parts) - 1)], key)
    named = parts[2] if parts[2] in ("thought", "action", "raw_response") else parts[3] if len(parts) > 3 else ""
    if parts[2] == "observation":
        named = f"element_{parts[5]}" if len(parts) > 5 and parts[3] == "elements" else parts[4] if len(parts) > 4 else ""
    default = "screen text" if parts[2] == "observation" else "step info"
    return f"Step {int(parts[1]) + 1} {_FIELD_WORDS.get(named, default)}"


def _spans_for(plan: dict, key: str, text: str) -> list[dict]:
    """The plan's spans for a field whose text is unchanged; else the detector's, all masked."""
    entry = plan["texts"].get(key)
    if entry is not None and entry["sha"] == text_sha(text):
        return entry["spans"]
    return [_detected_span(s) for s in find_pii(text)]


def _detected_span(s: Span) -> dict:
    return {**s.to_dict(), "by": DETECTOR, "blur": True, "decided_by": DETECTOR}


# ---------------------------------------------------------------- scan
def _frames(ep: Episode) -> list[tuple[str, int, str]]:
    """(blob hash, step index, 'pre' | 'post') of each distinct frame, in step order."""
    seen, out = set(), []
    for s in ep.steps:
        for which, h in (("pre", s.observation.screenshot), ("post", s.observation.post_screenshot)):
            if h and h not in seen:
                seen.add(h)
                out.append((h, s.index, which))
    return out


def pending_frames(store, episode_id: str) -> int:
    """How many frames of the episode its plan has not scanned yet."""
    ep = store.load_episode(episode_id)
    plan = plan_of(ep) or {"frames": {}}
    return sum(h not in plan["frames"] for h, _, _ in _frames(ep))


def scan(store, episode_id: str, *, engine=None, progress=None, cancel=None) -> dict:
    """Find personal data in frames the plan has not seen and in changed text; saves the plan
    and returns it. progress(done, total, text) is told after each frame; cancel() -> True stops
    early (what was scanned is kept)."""
    engine = engine or shared_engine()
    ep = store.load_episode(episode_id)
    plan = plan_of(ep) or empty_plan(engine.version())
    todo = [f for f in _frames(ep) if f[0] not in plan["frames"]]
    found = {}
    for n, (h, index, which) in enumerate(todo):
        if cancel is not None and cancel():
            break
        if progress:
            progress(n, len(todo), f"Reading step {index + 1}'s {'screenshot' if which == 'pre' else 'after-action frame'} ({n + 1} of {len(todo)})")
        regions = find_regions(decode(store.get_blob(h)), engine)
        found[h] = {"boxes": [new_box(r.rect, r.kind, DETECTOR, r.score) for r in regions], "redacted": None}
    if progress:
        progress(len(found), len(todo), "Saving what was found")
    # merge into the latest version of the episode: it may have been edited meanwhile
    ep = store.load_episode(episode_id)
    latest = plan_of(ep) or plan
    latest["frames"].update(found)
    live = {h for h, _, _ in _frames(ep)}
    latest["frames"] = {h: e for h, e in latest["frames"].items() if h in live}
    fields = dict(text_fields(ep))
    texts = {}
    for key, text in fields.items():
        entry = latest["texts"].get(key)
        if entry is not None and entry["sha"] == text_sha(text):
            texts[key] = entry
        else:
            spans = [_detected_span(s) for s in find_pii(text)]
            if spans:
                texts[key] = {"sha": text_sha(text), "spans": spans}
    latest["texts"] = texts
    if found or latest.get("status") != "approved" or any(f not in latest["frames"] for f in live):
        latest["status"] = "scanned"
    ep.meta[META_KEY] = latest
    store.save_episode(ep, bump_revision=True)
    return latest


def save_plan(store, episode_id: str, plan: dict) -> None:
    """Keep a plan edited in review (boxes added, removed, kept clear)."""
    ep = store.load_episode(episode_id)
    ep.meta[META_KEY] = plan
    store.save_episode(ep, bump_revision=True)


# ---------------------------------------------------------------- approve
def approve(store, episode_id: str, by: str, *, plan: dict | None = None, keep_originals: bool | None = None,
            audio: bool | None = None, progress=None) -> dict:
    """Approve the plan (the one given, else the stored one): blurred frames are written as new
    blobs. keep_originals (default: the store's setting, else True) False replaces the episode's
    frames and text with the redacted ones and deletes the originals. audio True approves audio
    that has no transcript for upload as it is (recorded as `by`'s decision), False takes that
    approval back; None leaves the plan's as it is (none: the audio stays on this machine)."""
    if not by or not str(by).strip():
        raise RedactionError("approving a redaction needs the reviewer's name")
    ep = store.load_episode(episode_id)
    plan = plan if plan is not None else plan_of(ep)
    if plan is None:
        raise RedactionError(f"episode {episode_id} has not been scanned for personal data yet")
    unscanned = [f"step {i + 1}" for h, i, _ in _frames(ep) if h not in plan["frames"]]
    if unscanned:
        raise RedactionError(f"episode {episode_id}: frames of {', '.join(unscanned[:3])} were not scanned yet")
    for n, (h, entry) in enumerate(sorted(plan["frames"].items())):
        if progress:
            progress(n, len(plan["frames"]), f"Blurring frame {n + 1} of {len(plan['frames'])}")
        rects = [b["rect"] for b in entry["boxes"] if b["blur"]]
        entry["redacted"] = store.put_blob(blur_rects(store.get_blob(h), rects)) if rects else h
    plan.update(status="approved", approved_by=str(by).strip(), approved_at=time.time())
    if audio is not None:
        plan["audio"] = {"approved_by": plan["approved_by"], "approved_at": plan["approved_at"]} if audio else None
    ep.meta[META_KEY] = plan
    store.save_episode(ep, bump_revision=True)
    if keep_originals is None:
        keep_originals = bool(store.get_setting(KEEP_ORIGINALS_KEY, True))
    if not keep_originals:
        apply_in_place(store, episode_id)
    return plan


def apply_in_place(store, episode_id: str) -> Episode:
    """Make the stored episode its redacted version and delete the original frames and typed keys
    (consented to by the keep-originals setting being off)."""
    ep = store.load_episode(episode_id)
    plan = plan_of(ep)
    if plan is None or plan["status"] != "approved":
        raise RedactionError(f"episode {episode_id}: only an approved redaction can replace the originals")
    red = upload_view(store, ep)
    red.meta = {**ep.meta, META_KEY: _in_place_plan(plan, red.meta[META_KEY]["decisions"])}
    masked_steps = {int(k.split("/")[1]) for k, e in plan["texts"].items()
                    if k.startswith("step/") and "/action/" in k and any(s["blur"] for s in e["spans"])}
    old = ep.blob_hashes() - red.blob_hashes()
    with store.transaction():
        store.save_episode(red, bump_revision=True)
        for h, entry in plan["frames"].items():
            if entry["redacted"] != h:
                store.execute("UPDATE raw_events SET data = replace(data, ?, ?) WHERE episode_id = ? AND kind = 'frame'",
                              [h, entry["redacted"], episode_id])
        _mask_raw_elements(store, episode_id)
        for s in ep.steps:  # the typed keys behind masked text: kept as the recorder keeps secret keys
            if s.index in masked_steps:
                store.execute(
                    "UPDATE raw_events SET data = json_set(data, '$.key', ?, '$.secret', json('true')) "
                    "WHERE episode_id = ? AND kind IN ('key_down', 'key_up') AND t >= ? AND t <= ? "
                    "AND length(json_extract(data, '$.key')) = 1", [_SECRET, episode_id, s.t_start - 1.0, s.t_end])
    store.remove_unreferenced(old)
    return red


def _mask_raw_elements(store, episode_id: str) -> None:
    """The recorder's raw element lists (what re-reduction rebuilds the steps' lists from) with
    every personal datum the recognizers find masked: the originals go, as the frames do."""
    for row in store.query("SELECT seq, data FROM raw_events WHERE episode_id = ? AND kind = 'elements'", [episode_id]):
        seq, d = row["seq"], json.loads(row["data"])
        changed = False
        for e in d.get("elements") or ():
            for k in ("name", "value"):
                text = e.get(k)
                spans = find_pii(text) if isinstance(text, str) and text else []
                if spans:
                    e[k], changed = mask(text, spans), True
        if changed:
            store.execute("UPDATE raw_events SET data = ? WHERE episode_id = ? AND seq = ?",
                          [json.dumps(d), episode_id, seq])


def _in_place_plan(plan: dict, decisions: list) -> dict:
    """The plan of an episode that is its own redacted version: approved, its redacted frames
    are the frames, the decisions kept as a record."""
    frames = {e["redacted"]: {"boxes": e["boxes"], "redacted": e["redacted"]} for e in plan["frames"].values()}
    return {**plan, "in_place": True, "record": decisions, "frames": frames, "texts": {}}


def redacted_episode(store, ep: Episode) -> Episode:
    """upload_view as an episode standing on its own (what an export writes): its plan says it is
    redacted in place, so where it is imported it can be sent or exported again as it is."""
    red = upload_view(store, ep)
    plan = plan_of(ep)
    if plan is not None and plan["status"] == "approved":
        red.meta[META_KEY] = _in_place_plan(plan, red.meta[META_KEY]["decisions"])
    return red


# ---------------------------------------------------------------- runs
def auto_redaction_due(store, ep: Episode) -> bool:
    """A run on a real screen, cleared automatically (privacy.runs = auto), whose plan is missing,
    not approved, or does not cover every frame it has now."""
    if not real_run(ep) or runs_mode(store) != "auto":
        return False
    plan = plan_of(ep)
    return plan is None or plan["status"] != "approved" or any(
        not (plan["frames"].get(h) or {}).get("redacted") for h, _, _ in _frames(ep))


def auto_redact(store, episode_id: str, *, engine=None) -> dict:
    """Clear a run the way a reviewer who accepts every finding would: scan it with the privacy
    review's recognizers and approve the plan as AUTOMATIC. Returns the approved plan."""
    scan(store, episode_id, engine=engine)
    return approve(store, episode_id, AUTOMATIC)


# ---------------------------------------------------------------- upload
def needs_review(store, ep: Episode) -> bool:
    """Not sent before a person approved its privacy review: recordings (unless
    privacy.require_review is false), and runs on a real screen when privacy.runs is 'review'."""
    if "recording" in ep.meta:
        return bool(store.get_setting(REQUIRE_REVIEW_KEY, True))
    return real_run(ep) and runs_mode(store) == "review"


def upload_view(store, ep: Episode) -> Episode:
    """The version of `ep` that may leave the machine (a new object). A run cleared automatically
    is scanned and approved here first, when it was not yet (that plan is kept in the store)."""
    if auto_redaction_due(store, ep):
        auto_redact(store, ep.id)
        ep = store.load_episode(ep.id)
    plan = plan_of(ep)
    if plan is None or plan["status"] != "approved":
        if needs_review(store, ep):
            state = "its review is not approved yet" if plan else "it has not been reviewed yet"
            raise RedactionError(
                f"not sent: personal data check needed ({state}). Open the episode in the app and "
                f"choose Review privacy, or run `{command_name()} redact scan {ep.id}`, then "
                f"`{command_name()} redact approve {ep.id} --by NAME`")
        return ep
    out = Episode.from_dict(copy.deepcopy(ep.to_dict()))  # masking changes nested info in place
    decisions = []
    for s in out.steps:
        for which in ("pre", "post"):
            attr = "screenshot" if which == "pre" else "post_screenshot"
            h = getattr(s.observation, attr)
            if not h:
                continue
            entry = plan["frames"].get(h)
            if entry is None or not entry.get("redacted") or not store.has_blob(entry["redacted"]):
                raise RedactionError(
                    f"not sent: step {s.index + 1} changed after its privacy review was approved; review it again")
            setattr(s.observation, attr, entry["redacted"])
            decisions += [{"where": {"step": s.index, "frame": which, "rect": b["rect"]}, "kind": b["kind"],
                           "found_by": b["by"], "decision": "blurred" if b["blur"] else "kept",
                           "decided_by": b["decided_by"]} for b in entry["boxes"]]
    for key, text in text_fields(out):
        spans = _spans_for(plan, key, text)
        chosen = [Span(sp["kind"], sp["start"], sp["end"], "") for sp in spans if sp["blur"]]
        if chosen:
            _set_text(out, key, mask(text, chosen))
        decisions += [{"where": {"field": key, "span": [sp["start"], sp["end"]]}, "kind": sp["kind"],
                       "found_by": sp["by"], "decision": "masked" if sp["blur"] else "kept",
                       "decided_by": sp["decided_by"]} for sp in spans]
    decisions += plan.get("record", [])
    decisions += _audio_decisions(out, plan)
    out.meta[META_KEY] = {"version": plan["version"], "engine": plan["engine"], "approved_by": plan["approved_by"],
                          "approved_at": plan["approved_at"], "decisions": decisions}
    return out


def untranscribed_audio(ep: Episode) -> bool:
    """Audio with no transcript words: nothing could check what it says (the torch-free bundle
    cannot transcribe), so it leaves the machine only when a person approved it as audio."""
    return bool(ep.meta.get("audio_blobs")) and not ep.meta.get("transcript")


def _audio_decisions(out: Episode, plan: dict) -> list[dict]:
    """Mask the transcript of `out`; take its audio out when the transcript holds personal data,
    or when there is no transcript and the plan's `audio` approval is missing. The decisions."""
    untranscribed = untranscribed_audio(out)
    spoken = _mask_transcript(out)
    if not out.meta.get("audio_blobs") or not (spoken or untranscribed):
        return []
    approval = plan.get("audio")
    if untranscribed and approval:
        return [{"where": {"field": "audio"}, "kind": "untranscribed", "found_by": DETECTOR, "decision": "kept",
                 "decided_by": approval["approved_by"]}]
    out.meta.pop("audio_blobs", None)
    out.meta.pop("audio", None)
    return [{"where": {"field": "audio"}, "kind": "spoken" if spoken else "untranscribed", "found_by": DETECTOR,
             "decision": "withheld", "decided_by": DETECTOR}]


def _mask_transcript(ep: Episode) -> int:
    """Mask transcript words that are part of personal data; returns how many spans were found."""
    words = ep.meta.get("transcript")
    if not isinstance(words, list) or not words:
        return 0
    texts = [str(w.get("word", w.get("text", ""))) if isinstance(w, dict) else str(w) for w in words]
    joined, starts = "", []
    for t in texts:
        starts.append(len(joined))
        joined += t + " "
    spans = find_pii(joined)
    for sp in spans:
        for i, st in enumerate(starts):
            if st < sp.end and st + len(texts[i]) > sp.start and isinstance(words[i], dict):
                key = "word" if "word" in words[i] else "text"
                words[i] = {**words[i], key: f"<{sp.kind}>"}
    return len(spans)
