"""What leaves the machine of an agent run: supervised and autonomous runs on a real screen are
redacted automatically with the privacy review's recognizers (or wait for a person's review, by
the team's setting privacy.runs) before upload, every uploaded text field is masked (window
titles, the model's replies, proposals kept beside corrections, rejection records, tool output),
and sandbox rollouts, whose screens are synthetic, go as they are. The end-to-end test drives
the real app on Xvfb against a window showing an e-mail address and reads the backend's copy
back by OCR."""
from __future__ import annotations

import json
import os

import pytest
from test_redaction import CARD, EMAIL, PHONE, _submit_and_sync, _window_png

from agent.redaction import RedactionError, review
from agent.redaction.frames import decode
from agent.redaction.patterns import find_pii
from agent.redaction.runs import AUTOMATIC, RUNS_KEY
from agent.schema import Action, Episode, Observation, Provenance, ScreenGeometry, Step

TITLE = f"Inbox - {EMAIL} - Mail"
OTHER = "maria.rossi@example.org"


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("rapidocr")
    from agent.redaction.ocr import OcrEngine

    return OcrEngine()


def _run(store, png: bytes, *, kind="supervised", platform="desktop") -> Episode:
    """A supervised run as AgentLoop leaves it: the focused window's title beside each frame, the
    model's raw reply, a corrected step keeping the model's proposal, a rejection and a parse
    failure in the next step's info, a tool's output (in a step's info and beside the next frame)."""
    g = ScreenGeometry.simple(1100, 420)
    h = store.put_blob(png)
    extra = {"focused_window": {"title": TITLE, "app": "mail"}, "mime": "image/png"}
    steps = [
        Step(0, Observation(h, 1100, 420, g, 0.0, extra=extra), f"Write to {EMAIL}",
             Action("type", {"content": CARD}),
             Provenance("corrected", proposal_thought=f"Mail {OTHER} instead",
                        proposal_action=Action("type", {"content": f"{OTHER}"}), decision="edit", decided_by="ana"),
             0.0, 0.1, raw_response=f"Thought: Mail {OTHER} instead\nAction: type(content='{OTHER}')",
             info={"tool_output": f"sent to {PHONE}"}),
        Step(1, Observation(h, 1100, 420, g, 1.0, extra=extra,
                            tool_output={"tool": "run_command", "target": f"grep {EMAIL} mail.txt", "exit_code": 0,
                                         "output": f"call {PHONE}\n", "truncated": False}), "Done", Action("finished", {"content": "ok"}),
             Provenance("agent"), 1.0, 2.0, raw_response="Thought: Done\nAction: finished(content='ok')",
             info={"rejections": [{"thought": f"Call {PHONE}", "actions": [{"name": "type", "args": {"content": CARD}}],
                                   "raw": f"Thought: Call {PHONE}", "reason": f"not {OTHER}", "by": "ana"}],
                   "parse_failures": [{"raw": f"Thought: {EMAIL} ???", "reason": "no Action"}]}),
    ]
    ep = Episode("Answer the last mail", kind=kind, platform=platform, steps=steps,
                 meta={"gate": "always", "end_reason": "finished",
                       "unexecuted": {"rejections": [{"thought": f"Forward it to {OTHER}", "actions": [], "raw": "",
                                                      "reason": "no", "by": "ana"}]}})
    store.save_episode(ep)
    return ep


def _texts(ep: Episode) -> str:
    return json.dumps(ep.to_dict(), ensure_ascii=False)


def test_every_uploaded_text_field_of_a_run_is_masked(qapp, store, engine):
    """The issue's item 5: text_fields() skipped observation.extra, raw_response and the proposal
    fields, and needs_review() held only recordings, so a run went out as it was."""
    ep = _run(store, _window_png())
    original = _texts(store.load_episode(ep.id))
    assert all(v in original for v in (EMAIL, OTHER, CARD, PHONE))
    up = review.upload_view(store, store.load_episode(ep.id))
    sent = _texts(up)
    for value in (EMAIL, OTHER, CARD, PHONE):
        assert value not in sent, value
    s0, s1 = up.steps
    assert s0.observation.extra["focused_window"] == {"title": "Inbox - <email> - Mail", "app": "mail"}
    assert s0.provenance.proposal_action.args["content"] == "<email>" and "<email>" in s0.raw_response
    assert s0.action.args["content"] == "<card>" and s0.info["tool_output"] == "sent to <phone>"
    assert s1.info["rejections"][0]["actions"][0]["args"]["content"] == "<card>"
    assert s1.observation.tool_output == {"tool": "run_command", "target": "grep <email> mail.txt", "exit_code": 0,
                                          "output": "call <phone>\n", "truncated": False}  # a command's output too
    assert s1.info["rejections"][0]["reason"] == "not <email>"
    # every frame was read and blurred by the automatic redaction, recorded as its decision
    plan = store.load_episode(ep.id).meta["redaction"]
    assert plan["status"] == "approved" and plan["approved_by"] == AUTOMATIC
    (frame,) = plan["frames"].values()
    assert sorted(b["kind"] for b in frame["boxes"]) == ["card", "email", "phone"]
    assert up.steps[0].observation.screenshot == frame["redacted"] != ep.steps[0].observation.screenshot
    fields = {d["where"].get("field") for d in up.meta["redaction"]["decisions"]}
    assert {"step/0/observation/extra/focused_window/title", "step/0/raw_response",
            "step/0/provenance/proposal_action/content", "step/1/info/rejections/0/reason"} <= fields
    # the stored run keeps what happened; only the upload is masked
    assert EMAIL in store.load_episode(ep.id).steps[0].thought
    assert up.meta["unexecuted"]["rejections"][0]["thought"] == "Forward it to <email>"
    assert review.field_label("step/0/observation/extra/focused_window/title") == "Step 1 window title"
    assert review.field_label("meta/unexecuted/rejections/0/thought") == "Proposal left unexecuted"
    assert review.field_label("instruction") == "Instruction"
    assert review.field_label("step/1/info/rejections/0/reason") == "Step 2 rejected proposal"


def test_a_text_edit_after_the_automatic_redaction_is_masked_too(qapp, store, engine):
    ep = _run(store, _window_png(), kind="autonomous")
    review.upload_view(store, store.load_episode(ep.id))
    edited = store.load_episode(ep.id)
    edited.steps[1].thought = f"Reply to {OTHER}"
    store.save_episode(edited, bump_revision=True)
    up = review.upload_view(store, store.load_episode(ep.id))
    assert up.steps[1].thought == "Reply to <email>"


def test_the_app_redacts_a_run_in_the_background_before_queueing_it(qtbot, store, engine):
    """Supervise and Drive queue a finished run; its frames are read in a worker first, so the
    sync's own thread does not spend its connection's time on OCR."""
    from agent.sync.outbox import Outbox
    from app.agent_run import queue_for_sync

    ep = _run(store, _window_png())
    assert queue_for_sync(store, None, ep.id) == "queued for sync once its personal data is blurred"
    qtbot.waitUntil(lambda: Outbox(store).get(ep.id) is not None, timeout=60_000)
    plan = store.load_episode(ep.id).meta["redaction"]
    assert plan["status"] == "approved" and plan["approved_by"] == AUTOMATIC
    assert not review.auto_redaction_due(store, store.load_episode(ep.id))
    sandbox = _run(store, _window_png(), platform="sandbox")
    assert queue_for_sync(store, None, sandbox.id) == "queued for sync (sent when sync runs)"


def test_the_library_exports_a_run_redacted_without_asking(qtbot, store, engine, tmp_path):
    """An export writes what a sync sends: the run is redacted in the export's worker (the check
    before it reads no frame), so the bundle holds the blurred frame and the masked text."""
    import zipfile

    from test_privacy_export import _export

    from agent.storage.export import without_review
    from app.library_view import LibraryPage

    ep = _run(store, _window_png())
    assert without_review(store, [ep.id]) == [] and "redaction" not in store.load_episode(ep.id).meta  # no OCR yet
    page = LibraryPage(store)
    qtbot.addWidget(page)
    asked = []
    page.confirm_originals = lambda *a: asked.append(a) or "cancel"
    res = _export(qtbot, page, tmp_path / "run.zip", [ep.id])
    assert not asked and res["episodes"] == 1 and not res["originals"]
    with zipfile.ZipFile(tmp_path / "run.zip") as z:
        blobs = {n[len("blobs/"):]: z.read(n) for n in z.namelist() if n.startswith("blobs/")}
        text = z.read(f"episodes/{ep.id}.json").decode()
    assert EMAIL not in text and CARD not in text and TITLE not in text
    (data,) = blobs.values()
    assert "Order" in " ".join(line.text for line in engine.read(decode(data)))
    assert not find_pii(" ".join(line.text for line in engine.read(decode(data))))


def test_sandbox_rollouts_go_as_they_are(qapp, store):
    """The sandbox draws its screens: nothing personal to take out, and no OCR spent."""
    for kind in ("rollout", "supervised"):
        ep = _run(store, _window_png(), kind=kind, platform="sandbox")
        up = review.upload_view(store, store.load_episode(ep.id))
        assert EMAIL in _texts(up) and "redaction" not in up.meta
        assert up.steps[0].observation.screenshot == ep.steps[0].observation.screenshot


def test_a_team_can_ask_for_a_person_s_review_of_runs(qapp, store, engine):
    store.set_setting(RUNS_KEY, "review")
    ep = _run(store, _window_png())
    with pytest.raises(RedactionError, match="personal data check needed.*not been reviewed"):
        review.upload_view(store, store.load_episode(ep.id))
    report = _submit_and_sync(store, ep.id)
    assert not report.sent and "personal data check needed" in report.failed[0][1]
    review.scan(store, ep.id, engine=engine)
    review.approve(store, ep.id, "ana")
    up = review.upload_view(store, store.load_episode(ep.id))
    assert up.meta["redaction"]["approved_by"] == "ana" and EMAIL not in _texts(up)
    store.set_setting(RUNS_KEY, "sometimes")
    with pytest.raises(RedactionError, match="privacy.runs must be one of auto, review, got 'sometimes'"):
        review.upload_view(store, store.load_episode(ep.id))


@pytest.mark.desktop
def test_a_drive_run_arrives_at_the_backend_blurred_and_masked(xdisplay, tmp_path, engine):
    """The issue's item 5, as a user meets it: Drive acts on a real desktop whose window shows an
    e-mail address (and has it in its title); the run synced to a real backend on loopback holds
    no readable e-mail on any frame (OCR) and none in its text."""
    from agent.storage.store import Store
    from tests.test_agent_desktop import model_point, start_target
    from tests.test_drive_xvfb import result_of, run_driver
    from trainer.backend.store import BackendStore

    state = tmp_path / "target.json"
    os.environ["TANDEM_TARGET_NOTE"] = f"Reply to {EMAIL}"
    try:
        target = start_target(xdisplay, state)
    finally:
        del os.environ["TANDEM_TARGET_NOTE"]
    try:
        st = json.loads(state.read_text())
        f = model_point(st, "field", 1920, 1080)
        responses = [f"Thought: The mail is from {EMAIL}; click the field.\n"
                     f"Action: click(start_box='({f[0]},{f[1]})')",
                     f"Thought: Pay with the card.\nAction: type(content='{CARD}')",
                     "Thought: Done.\nAction: finished(content='done')"]
        res = result_of(*run_driver(xdisplay, tmp_path, "drive", responses))
    finally:
        target.terminate()
        target.wait(5)
    assert res["reason"] == "finished" and res["steps"] == 3
    with Store(tmp_path / "data") as store:
        local = store.load_episode(res["episode"])
        assert (local.kind, local.platform) == ("autonomous", "desktop")
        assert EMAIL in local.steps[0].observation.extra["focused_window"]["title"]
        seen = " ".join(line.text for line in engine.read(decode(store.get_blob(local.steps[0].observation.screenshot))))
        assert "email" in [s.kind for s in find_pii(seen)], seen  # the screen did show it
        report = _submit_and_sync(store, local.id)
        assert report.ok and report.sent[0][0] == local.id, report.failed
        backend = BackendStore(store.root / "backend").store
        sent = backend.load_episode(local.id)
        texts = _texts(sent)
        assert EMAIL not in texts and CARD not in texts and "<email>" in sent.steps[0].thought
        assert sent.steps[0].observation.extra["focused_window"]["title"] == "tandem target - Reply to <email>"
        frames = {s.observation.screenshot for s in sent.steps}
        assert not frames & {s.observation.screenshot for s in local.steps}
        for h in frames:
            ocr = " ".join(line.text for line in engine.read(decode(backend.get_blob(h))))
            assert "Reply to" in ocr and not [s for s in find_pii(ocr) if s.kind in ("email", "card")], ocr
        assert sent.meta["redaction"]["approved_by"] == AUTOMATIC
