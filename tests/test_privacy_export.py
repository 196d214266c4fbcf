"""What leaves the machine by export and with audio: a bundle or JSONL export of a reviewed
recording is its redacted version (no original frame, no unmasked text, read back by OCR); an
export that would write unreviewed data asks (the app) or is refused (the CLI) unless the
originals are asked for; audio without a transcript is uploaded only when a person approved it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox
from test_redaction import CARD, EMAIL, PHONE, _recording, _submit_and_sync, _window_png

from agent.redaction import review
from agent.redaction.frames import decode
from agent.redaction.patterns import find_pii

ROOT = Path(__file__).resolve().parents[1]
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(28)  # what the recorder stores per audio segment, in short


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("rapidocr")
    from agent.redaction.ocr import OcrEngine

    return OcrEngine()


def _approved(store, engine, **kw):
    ep = _recording(store, _window_png())
    review.scan(store, ep.id, engine=engine)
    review.approve(store, ep.id, "ana", keep_originals=True, **kw)
    return ep


def _answer(button_text: str, seen: list) -> None:
    """Click `button_text` in the next message box that opens (its exec() blocks the caller)."""
    def click():
        box = next(w for w in QApplication.topLevelWidgets() if isinstance(w, QMessageBox) and w.isVisible())
        seen.append(box.text())
        next(b for b in box.buttons() if b.text().replace("&", "") == button_text).click()

    QTimer.singleShot(0, click)


def _export(qtbot, page, path, ids):
    with qtbot.waitSignal(page.taskFinished, timeout=60000) as blocker:
        assert page.export_to(path, ids)
    assert not isinstance(blocker.args[1], BaseException), blocker.args[1]
    return blocker.args[1]


def test_bundle_of_an_approved_recording_holds_no_original(qtbot, store, engine, tmp_path):
    """The issue's item 4: Library -> Export -> Bundle of an approved recording held the original
    frames and the unmasked thought."""
    from agent.storage.store import Store
    from app.library_view import LibraryPage

    ep = _approved(store, engine)
    originals = ep.blob_hashes()
    plan = store.load_episode(ep.id).meta["redaction"]
    redacted = {e["redacted"] for e in plan["frames"].values()}
    page = LibraryPage(store)
    qtbot.addWidget(page)
    page.refresh()
    res = _export(qtbot, page, tmp_path / "one.zip", [ep.id])
    assert res["episodes"] == 1 and not res["originals"]
    with zipfile.ZipFile(tmp_path / "one.zip") as z:
        blobs = {n[len("blobs/"):]: z.read(n) for n in z.namelist() if n.startswith("blobs/")}
        text = z.read(f"episodes/{ep.id}.json").decode()
    assert set(blobs) == redacted and not set(blobs) & originals  # the blurred frames only
    for data in blobs.values():
        ocr = " ".join(line.text for line in engine.read(decode(data)))
        assert "Order" in ocr and find_pii(ocr) == [], ocr
    assert EMAIL not in text and CARD not in text and PHONE not in text
    doc = json.loads(text)
    assert doc["steps"][0]["thought"] == "Write to <email> about the order"
    # imported elsewhere, it is an approved, redacted episode: it can be sent again as it is
    other = Store(tmp_path / "other")
    from agent.storage.bundle import import_file

    import_file(other, tmp_path / "one.zip")
    up = review.upload_view(other, other.load_episode(ep.id))
    assert up.blob_hashes() == redacted and up.steps[1].action.args["content"] == "<card>"
    assert other.check() == []
    other.close()


def test_app_asks_before_exporting_unreviewed_recordings(qtbot, store, engine, tmp_path):
    from app.library_view import LibraryPage

    good = _approved(store, engine)
    raw = _recording(store, _window_png())  # not reviewed
    page = LibraryPage(store)
    qtbot.addWidget(page)
    page.refresh()
    seen: list = []
    _answer("Cancel", seen)
    assert page.export_to(tmp_path / "none.zip", [good.id, raw.id]) is False
    assert "1 of 2 episodes has no approved privacy review" in seen[0] and not (tmp_path / "none.zip").exists()
    _answer("Leave them out", seen)
    res = _export(qtbot, page, tmp_path / "reviewed.jsonl", [good.id, raw.id])
    lines = (tmp_path / "reviewed.jsonl").read_text().splitlines()
    assert {json.loads(line)["episode_id"] for line in lines} == {good.id} and res["samples"] == 2
    assert CARD not in "".join(lines) and EMAIL not in "".join(lines)
    _answer("Export as recorded", seen)
    res = _export(qtbot, page, tmp_path / "all.zip", [good.id, raw.id])
    assert res["originals"] and res["unreviewed"] == [raw.id]
    with zipfile.ZipFile(tmp_path / "all.zip") as z:
        assert raw.steps[0].observation.screenshot in {n[len("blobs/"):] for n in z.namelist()}
    # nothing unreviewed: no question at all
    _export(qtbot, page, tmp_path / "quiet.zip", [good.id])
    assert len(seen) == 3


def _cli(*args, data):
    env = {**os.environ, "TANDEM_DATA": str(data)}
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *args], capture_output=True, text=True, env=env, timeout=120)


def test_cli_export_refuses_unreviewed_data_unless_originals_are_asked_for(tmp_path):
    from pii_windows import render_window

    from agent.storage.store import Store

    store = Store(tmp_path / "data")
    ep = _recording(store, render_window(seed=2, size=(300, 120), px=11, records=1).png)
    store.close()
    for out in ("b.zip", "s.jsonl"):
        r = _cli("export", "--out", str(tmp_path / out), data=tmp_path / "data")
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr.count("\n") == 1 and "export failed: 1 of 1 episode has no approved privacy review" in r.stderr
        assert ep.id in r.stderr and "--include-originals" in r.stderr and "Traceback" not in r.stderr
        assert not any(p.name.startswith(out) for p in tmp_path.iterdir())  # nothing left behind
    r = _cli("export", "--out", str(tmp_path / "b.zip"), "--include-originals", data=tmp_path / "data")
    assert r.returncode == 0, r.stderr
    assert "wrote 1 episode and" in r.stdout and "original screenshots and text included" in r.stderr
    with zipfile.ZipFile(tmp_path / "b.zip") as z:
        assert CARD in z.read(f"episodes/{ep.id}.json").decode()


# ---------------------------------------------------------------- audio without a transcript
def _with_audio(store, ep):
    ep = store.load_episode(ep.id)
    h = store.put_blob(WAV)
    ep.meta.pop("transcript")
    ep.meta.update(audio=[{"blob": h, "t0": 0.0, "t1": 2.0}], audio_blobs=[h])
    store.save_episode(ep)
    return h


def test_untranscribed_audio_is_not_uploaded_without_approval(qtbot, store, engine):
    """The issue's item 6: an approved recording with audio but no transcript uploaded the audio."""
    from app.privacy_review import PrivacyReviewDialog
    from trainer.backend.store import BackendStore

    ep = _recording(store, _window_png())
    audio = _with_audio(store, ep)
    dlg = PrivacyReviewDialog(store, ep.id, engine=engine)
    qtbot.addWidget(dlg)
    dlg.show()
    qtbot.waitUntil(lambda: not dlg.busy, timeout=60000)
    assert dlg.audio.isVisible() and not dlg.audio.isChecked()
    assert "The audio has no transcript and stays on this computer" in dlg.status.text()
    dlg.reviewer.setText("ana")
    dlg.approve_btn.click()
    qtbot.waitUntil(lambda: "Queued for sync" in dlg.status.text(), timeout=60000)
    up = review.upload_view(store, store.load_episode(ep.id))
    assert audio not in up.blob_hashes() and "audio" not in up.meta
    assert {"where": {"field": "audio"}, "kind": "untranscribed", "found_by": "detector", "decision": "withheld",
            "decided_by": "detector"} in up.meta["redaction"]["decisions"]
    report = _submit_and_sync(store, ep.id)
    assert report.ok and report.sent[0][0] == ep.id
    backend = BackendStore(store.root / "backend").store
    assert not backend.has_blob(audio) and "audio_blobs" not in backend.load_episode(ep.id).meta
    assert store.has_blob(audio)  # it stays on this machine

    # the annotator listens and approves it as audio: now it goes, recorded as their decision
    dlg = PrivacyReviewDialog(store, ep.id, engine=engine)
    qtbot.addWidget(dlg)
    dlg.show()
    qtbot.waitUntil(lambda: not dlg.busy, timeout=60000)
    dlg.reviewer.setText("ana")
    dlg.audio.setChecked(True)
    assert "it is uploaded as it is" in dlg.status.text()
    dlg.approve_btn.click()
    qtbot.waitUntil(lambda: "Queued for sync" in dlg.status.text(), timeout=60000)
    up = review.upload_view(store, store.load_episode(ep.id))
    assert up.meta["audio_blobs"] == [audio]
    assert any(d["kind"] == "untranscribed" and d["decision"] == "kept" and d["decided_by"] == "ana"
               for d in up.meta["redaction"]["decisions"])


def test_export_leaves_untranscribed_audio_out_too(store, engine, tmp_path):
    from agent.storage.bundle import write_bundle

    ep = _recording(store, _window_png())
    audio = _with_audio(store, ep)
    review.scan(store, ep.id, engine=engine)
    review.approve(store, ep.id, "ana", keep_originals=True)
    write_bundle(store, tmp_path / "a.zip", [ep.id])
    with zipfile.ZipFile(tmp_path / "a.zip") as z:
        assert f"blobs/{audio}" not in z.namelist()
