"""Personal data out of recordings: the recognizers, OCR of real Qt windows, the review plan,
approval, the redacted upload through a real backend on loopback (its blobs read back by OCR),
and the review dialog with real widgets."""
from __future__ import annotations

import asyncio
import random

import pytest
from pii_windows import fake_card, fake_iban, render_window, score

from agent.redaction import RedactionError, review
from agent.redaction.frames import blur_rects, decode, find_regions, span_box
from agent.redaction.patterns import find_pii, iban_ok, luhn_ok, mask
from agent.schema import Action, Episode, Observation, Provenance, ScreenGeometry, Step

EMAIL, PHONE, CARD = "jane.doe@example.com", "+1 (415) 555-0132", "4111 1111 1111 1111"


# ---------------------------------------------------------------- recognizers
@pytest.mark.parametrize("text,kind,value", [
    ("From: jane.doe@example.com today", "email", "jane.doe@example.com"),
    ("Call me at +1 (415) 555-0132.", "phone", "+1 (415) 555-0132"),
    ("tel 030 12345678", "phone", "030 12345678"),
    ("Card: 4111-1111-1111-1111 exp", "card", "4111-1111-1111-1111"),
    ("Amex 3782 822463 10005", "card", "3782 822463 10005"),
    ("IBAN DE89 3704 0044 0532 0130 00 please", "iban", "DE89 3704 0044 0532 0130 00"),
    ("host 192.168.10.24 down", "ip", "192.168.10.24"),
    ("v6 fe80::1ff:fe23:4567:890a", "ip", "fe80::1ff:fe23:4567:890a"),
    ("export KEY=sk-live-9fA8dK2mQz7XwP4vLr1sT6uY", "key", "sk-live-9fA8dK2mQz7XwP4vLr1sT6uY"),
    ("token ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5", "key", "ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"),
])
def test_each_recognizer_finds_its_kind(text, kind, value):
    spans = find_pii(text)
    assert [(s.kind, s.text) for s in spans] == [(kind, value)]


@pytest.mark.parametrize("text", [
    "Invoice date 2024-03-15", "Total: 1,249.99 EUR", "Order #48213", "Version 3.10.2", "Screen 1920x1080",
    "Card: 4111 1111 1111 1112",  # fails Luhn
    "IBAN DE88 3704 0044 0532 0130 00",  # wrong check digits
    "server 300.1.2.3", "Build 20240315", "hash 3f2a9c0e1b7d4a5f8e6c2b1a0d9f8e7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e",
    "Meeting notes for tomorrow, 12:45", "order 123456789",
])
def test_ordinary_text_is_not_personal_data(text):
    assert find_pii(text) == []


def test_checksums_and_masking():
    rng = random.Random(5)
    for _ in range(50):
        assert luhn_ok("".join(c for c in fake_card(rng) if c.isdigit()))
        assert iban_ok(fake_iban(rng).replace(" ", ""))
    assert not luhn_ok("4111111111111112") and not iban_ok("DE89370400440532013001")
    text = f"mail {EMAIL}, card {CARD}"
    assert mask(text, find_pii(text)) == "mail <email>, card <card>"
    with pytest.raises(ValueError, match="unknown kind of personal data 'name'"):
        find_pii(text, kinds=("email", "name"))


def test_span_box_lies_inside_its_line_with_padding():
    line = (100.0, 10.0, 300.0, 30.0)
    text = "Mail: a@b.cd"  # 12 characters over 200 px
    x0, y0, x1, y1 = span_box(line, text, 6, 12)
    assert 100 <= x0 < 100 + 6 * 200 / 12 and x1 == 300  # one character of padding, kept in the line
    assert y0 < 10 and y1 > 30


# ---------------------------------------------------------------- OCR on real windows
@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("rapidocr")
    from agent.redaction.ocr import OcrEngine

    return OcrEngine()


def test_ocr_finds_and_blur_hides_data_in_a_qt_window(qapp, engine):
    shot = render_window(seed=11, size=(1100, 420), px=13, records=4)
    found = find_regions(decode(shot.png), engine)
    result = score(shot.truth, [(r.kind, r.rect) for r in found], size=(1100, 420))
    for kind in ("email", "phone", "card"):
        if kind in result:
            assert result[kind]["covered"] == result[kind]["truth"], (kind, result[kind])
    assert sum(r["right"] for r in result.values()) == len(found)  # every box lies on personal data
    blurred = blur_rects(shot.png, [r.rect for r in found])
    assert find_regions(decode(blurred), engine) == []  # nothing legible is left behind


PHONE_LINES = ["call her at 4155550132", "call her at 415 555 0132", "call her at (415) 555-0132",
               "call her at 030 12345678", "tel 06 12 34 56 78", "Call me at 0612345678", "Phone: +1 (415) 555-0132"]


@pytest.mark.parametrize("family", ["DejaVu Sans", "DejaVu Serif", "DejaVu Sans Mono"])
def test_phone_blur_covers_the_first_digit(qapp, engine, family):
    """A number after narrow letters ("call her at 4155550132") was blurred from its second digit
    on: the box was cut as if every character were equally wide, and OCR still read "call her at 4"."""
    from pii_windows import render_lines

    png = render_lines(PHONE_LINES, size=(700, 300), px=16, family=family)
    found = find_regions(decode(png), engine)
    assert sorted(r.kind for r in found) == ["phone"] * len(PHONE_LINES)
    left = [line.text for line in engine.read(decode(blur_rects(png, [r.rect for r in found])))]
    assert len(left) == len(PHONE_LINES) and not any(c.isdigit() for t in left for c in t), left
    assert all(t.lower().startswith(("call", "te", "phone")) for t in left)  # the words before it stay readable


def test_bad_images_are_refused_clearly(engine):
    with pytest.raises(RedactionError, match="not a decodable image"):
        decode(b"not a png at all")
    with pytest.raises(RedactionError, match="H x W x 3 uint8"):
        engine.read([[1, 2, 3]])
    with pytest.raises(RedactionError, match="normalized"):
        blur_rects(render_window(seed=1, size=(200, 100), px=11, records=1).png, [(0.5, 0.5, 0.2, 0.9)])


# ---------------------------------------------------------------- review, approve, upload
def _recording(store, png: bytes, *, raw_keys: bool = True) -> Episode:
    """A recording as the recorder leaves it: a frame of the window, a click, the card typed."""
    g = ScreenGeometry.simple(1100, 420)
    h = store.put_blob(png)
    steps = [
        Step(0, Observation(h, 1100, 420, g, 0.0), f"Write to {EMAIL} about the order",
             Action("click", {"start_box": (0.5, 0.5)}), Provenance("human"), 0.0, 0.1),
        Step(1, Observation(h, 1100, 420, g, 1.0), "Type the card number",
             Action("type", {"content": CARD}), Provenance("human"), 1.0, 2.0),
    ]
    ep = Episode(f"Pay with card and call {PHONE}", steps=steps,
                 meta={"recording": {"status": "stopped"}, "transcript": [{"text": "call", "start": 0, "end": 1}]})
    store.save_episode(ep)
    if raw_keys:
        store.append_raw_events(ep.id, [{"t": 1.0 + i * 0.01, "kind": "key_down", "key": c} for i, c in enumerate(CARD)])
    return ep


def _window_png():
    from pii_windows import render_lines

    return render_lines([f"E-mail: {EMAIL}", f"Phone: {PHONE}", f"Card number: {CARD}", "Order #48213 shipped"],
                        size=(1100, 420), px=16)


def test_scan_approve_and_upload_view(qapp, store, engine):
    ep = _recording(store, _window_png())
    with pytest.raises(RedactionError, match="personal data check needed.*not been reviewed"):
        review.upload_view(store, store.load_episode(ep.id))
    plan = review.scan(store, ep.id, engine=engine)
    kinds = sorted(b["kind"] for e in plan["frames"].values() for b in e["boxes"])
    assert kinds == ["card", "email", "phone"]
    assert {k: [s["kind"] for s in e["spans"]] for k, e in plan["texts"].items()} == {
        "instruction": ["phone"], "step/0/thought": ["email"], "step/1/action/content": ["card"]}
    with pytest.raises(RedactionError, match="not approved yet"):
        review.upload_view(store, store.load_episode(ep.id))
    # a person keeps the phone region clear and adds a box of their own
    from agent.redaction import plan as P

    h = ep.steps[0].observation.screenshot
    phone_box = next(i for i, b in enumerate(plan["frames"][h]["boxes"]) if b["kind"] == "phone")
    P.set_blur(plan, h, phone_box, False, "ana")
    P.add_box(plan, h, (0.0, 0.9, 0.2, 1.0), "ana")
    with pytest.raises(RedactionError, match="reviewer's name"):
        review.approve(store, ep.id, " ", plan=plan)
    review.approve(store, ep.id, "ana", plan=plan, keep_originals=True)
    local = store.load_episode(ep.id)
    up = review.upload_view(store, local)
    assert local.steps[1].action.args["content"] == CARD  # the original stays local
    assert up.steps[1].action.args["content"] == "<card>"
    assert up.steps[0].thought == "Write to <email> about the order" and up.instruction == "Pay with card and call <phone>"
    assert up.steps[0].observation.screenshot != h and store.has_blob(up.steps[0].observation.screenshot)
    assert h not in up.blob_hashes() and "frames" not in up.meta["redaction"]
    decisions = up.meta["redaction"]["decisions"]
    kept = [d for d in decisions if d["decision"] == "kept"]
    assert kept and all(d["kind"] == "phone" and d["decided_by"] == "ana" and d["found_by"] == "detector" for d in kept)
    assert any(d["kind"] == "manual" and d["found_by"] == "ana" for d in decisions)
    assert any(d["where"] == {"field": "step/1/action/content", "span": [0, len(CARD)]} for d in decisions)
    assert store.check() == []  # redacted frames are referenced, nothing dangling
    # editing a thought after approval: the detector masks the new text (never sent in clear)
    s0 = local.steps[0]
    s0.thought = "Mail bob@example.org next"
    store.update_step(ep.id, s0)
    assert review.upload_view(store, store.load_episode(ep.id)).steps[0].thought == "Mail <email> next"


def test_exported_training_data_is_the_redacted_version(qapp, store, engine, tmp_path):
    """`export` writes what a sync would send: the approved review's blurred frames and masked
    text; a recording not reviewed yet is refused, or exported as it is when the originals are
    asked for, and named in the result."""
    import json

    from agent.storage.export import ExportRefused, export_jsonl

    ep = _recording(store, _window_png())
    with pytest.raises(ExportRefused, match="1 of 1 episode has no approved privacy review"):
        export_jsonl(store, tmp_path / "a" / "samples.jsonl", [ep.id])
    assert not (tmp_path / "a" / "samples.jsonl").exists()
    raw = export_jsonl(store, tmp_path / "a" / "samples.jsonl", [ep.id], include_originals=True)
    assert raw["unreviewed"] == [ep.id] and raw["originals"]
    review.scan(store, ep.id, engine=engine)
    review.approve(store, ep.id, "ana", keep_originals=True)
    res = export_jsonl(store, tmp_path / "b" / "samples.jsonl", [ep.id])
    assert res["unreviewed"] == []
    text = (tmp_path / "b" / "samples.jsonl").read_text()
    assert CARD not in text and EMAIL not in text and "<card>" in text
    images = {json.loads(line)["images"][-1] for line in text.splitlines()}
    original = ep.steps[0].observation.screenshot
    assert not any(original in i for i in images)  # the blurred frames, not the original
    assert CARD in (tmp_path / "a" / "samples.jsonl").read_text()  # before the review: as recorded


def test_delete_originals_replaces_the_local_copy(qapp, store, engine):
    ep = _recording(store, _window_png())
    original = ep.steps[0].observation.screenshot
    review.scan(store, ep.id, engine=engine)
    review.approve(store, ep.id, "ana", keep_originals=False)
    local = store.load_episode(ep.id)
    assert not store.has_blob(original) and local.steps[1].action.args["content"] == "<card>"
    assert all(e["key"] == "\u2022" and e["secret"] for e in store.raw_events(ep.id) if e["kind"] == "key_down")
    assert local.meta["redaction"]["in_place"] and local.meta["redaction"]["record"]
    up = review.upload_view(store, local)  # still uploadable, nothing to redo
    assert up.steps[0].observation.screenshot == local.steps[0].observation.screenshot
    assert store.check() == []


def _submit_and_sync(store, episode_id):
    """Queue the episode and sync it to the app's embedded backend (a real server on loopback)."""
    from agent.sync.client import SyncClient
    from agent.sync.outbox import Outbox
    from app.sync.embedded import start_embedded_backend

    url, token, stop = start_embedded_backend(store)
    try:
        Outbox(store).submit(episode_id)
        return asyncio.run(SyncClient(store, url, token).sync(deadline=30))
    finally:
        stop()


def test_unreviewed_recordings_are_not_synced(store):
    from agent.sync.outbox import Outbox

    ep = _recording(store, render_window(seed=2, size=(300, 120), px=11, records=1).png)
    report = _submit_and_sync(store, ep.id)
    assert report.failed and "personal data check needed" in report.failed[0][1]
    assert Outbox(store).get(ep.id).state == "held"  # not failed: it goes once the review passes


@pytest.mark.parametrize("keep", [True, False])
def test_redacted_recording_reaches_the_backend(qapp, store, engine, keep):
    """The issue's 'done when': submitted and synced, the backend's frames show no e-mail, phone
    or card number (read back by OCR), the typed card is masked, the original kept or deleted."""
    from trainer.backend.store import BackendStore

    png = _window_png()
    before = {r.kind for r in find_regions(decode(png), engine)}
    assert before == {"email", "phone", "card"}
    ep = _recording(store, png)
    review.scan(store, ep.id, engine=engine)
    review.approve(store, ep.id, "ana", keep_originals=keep)
    report = _submit_and_sync(store, ep.id)
    assert report.ok and report.sent[0][0] == ep.id
    backend = BackendStore(store.root / "backend")
    remote = backend.store.load_episode(ep.id)
    assert remote.steps[1].action.args["content"] == "<card>"
    for h in remote.blob_hashes():
        text = " ".join(line.text for line in engine.read(decode(backend.store.get_blob(h))))
        assert "Order" in text  # the rest of the window is still there
        assert find_pii(text) == [], text
    assert remote.meta["redaction"]["approved_by"] == "ana"
    assert store.has_blob(ep.steps[0].observation.screenshot) is keep


# ---------------------------------------------------------------- the review dialog
def _wait(qtbot, cond, timeout=60000):
    qtbot.waitUntil(cond, timeout=timeout)


def test_review_dialog_scans_in_background_and_approves(qtbot, store, engine):
    from PySide6.QtCore import Qt

    from agent.sync.outbox import Outbox
    from app.privacy_review import PrivacyReviewDialog

    ep = _recording(store, _window_png())
    dlg = PrivacyReviewDialog(store, ep.id, engine=engine)
    qtbot.addWidget(dlg)
    dlg.resize(1280, 800)
    dlg.show()
    assert dlg.busy and not dlg.approve_btn.isEnabled()  # scanning runs in a worker, the window stays live
    _wait(qtbot, lambda: not dlg.busy)
    assert "Ready to approve: 3 regions to blur on 1 frame, 3 text spans to mask" in dlg.status.text()
    assert len(dlg.canvas.boxes) == 3 and dlg.spans.count() == 3
    # click the phone box: kept clear, recorded as the reviewer's decision
    dlg.reviewer.setText("ana")
    i = next(i for i, b in enumerate(dlg.canvas.boxes) if b["kind"] == "phone")
    centre = dlg.canvas.widget_rect(dlg.canvas.boxes[i]["rect"]).center().toPoint()
    qtbot.mouseClick(dlg.canvas, Qt.LeftButton, pos=centre)
    assert not dlg.canvas.boxes[i]["blur"] and dlg.canvas.boxes[i]["decided_by"] == "ana"
    # drag a new box over the lower left corner
    area = dlg.canvas.widget_rect((0.02, 0.8, 0.3, 0.95))
    qtbot.mousePress(dlg.canvas, Qt.LeftButton, pos=area.topLeft().toPoint())
    qtbot.mouseRelease(dlg.canvas, Qt.LeftButton, pos=area.bottomRight().toPoint())
    assert [b["kind"] for b in dlg.canvas.boxes].count("manual") == 1
    # untick the instruction's phone span
    item = next(dlg.spans.item(k) for k in range(dlg.spans.count()) if dlg.spans.item(k).text().startswith("Instruction"))
    item.setCheckState(Qt.Unchecked)
    assert "2 text spans to mask, 1 kept clear" in dlg.status.text()
    dlg.approve_btn.click()
    _wait(qtbot, lambda: Outbox(store).get(ep.id) is not None)
    assert "Queued for sync" in dlg.status.text()
    assert not dlg.isVisible() and not dlg.approve_btn.isEnabled()  # it closed: nothing left to approve
    up = review.upload_view(store, store.load_episode(ep.id))
    assert up.instruction == f"Pay with card and call {PHONE}" and up.steps[1].action.args["content"] == "<card>"


def test_review_dialog_tags_stay_inside_the_image_and_apart(qtbot, store, tmp_path):
    """Boxes at the frame's edges and a column of them on neighbouring lines: each box's tag is
    drawn inside the image (it was cut off past the right edge) and over no other tag."""
    from agent.redaction import plan as P
    from app.privacy_review import PrivacyReviewDialog

    ep = _recording(store, render_window(seed=3, size=(1100, 420), px=11, records=4).png, raw_keys=False)
    h = ep.steps[0].observation.screenshot
    rects = [(0.85, 0.02, 1.0, 0.07), (0.0, 0.94, 0.3, 1.0), (0.8, 0.95, 1.0, 1.0), (0.0, 0.0, 0.12, 0.05)]
    rects += [(0.7, 0.3 + 0.035 * i, 1.0, 0.33 + 0.035 * i) for i in range(6)]  # a form's lines, flush right
    plan = P.empty_plan("test")
    plan["frames"][h] = {"boxes": [P.new_box(r, "email" if i % 2 else "phone", P.DETECTOR) for i, r in enumerate(rects)],
                         "redacted": None}
    plan["frames"][h]["boxes"][4]["blur"] = False  # "phone (kept)": a longer tag
    review.save_plan(store, ep.id, plan)
    dlg = PrivacyReviewDialog(store, ep.id, autoscan=False)
    qtbot.addWidget(dlg)
    dlg.resize(1280, 800)
    dlg.show()
    qtbot.waitExposed(dlg)
    assert dlg.frame_list.currentRow() == 0 and len(dlg.canvas.boxes) == len(rects)
    image, tags = dlg.canvas._target(), dlg.canvas.label_rects()
    assert len(tags) == len(rects)
    for t in tags:
        assert (image.left() - 0.01 <= t.left() and t.right() <= image.right() + 0.01
                and image.top() - 0.01 <= t.top() and t.bottom() <= image.bottom() + 0.01), (t, image)
    assert not [(a, b) for i, a in enumerate(tags) for b in tags[i + 1:] if a.intersected(b).width() * a.intersected(b).height() > 0]
    corner = dlg.canvas.widget_rect(rects[0])
    assert tags[0].right() <= corner.left() and tags[0].top() == corner.top()  # flipped to the left, not cut off
    fm = dlg.canvas.fontMetrics()
    assert [round(t.width()) for t in tags] == [fm.horizontalAdvance(dlg.canvas.tag(b)) + 6 for b in dlg.canvas.boxes]
    dlg.grab().save(str(tmp_path / "privacy_tags.png"))  # for a person to look at: pytest --basetemp
