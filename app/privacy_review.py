"""The privacy review: what will be blurred and masked before a recording leaves the machine.

Scanning (OCR of every frame) starts in a worker when the dialog opens, with progress shown;
the annotator looks through the frames, clicks a box to keep that region clear (or blur it
again), drags to add a box, unticks a text span to leave it, ticks "Upload the audio as it is"
for audio that has no transcript (else that audio stays here), then approves: the blurred frames
are written in a worker and the episode is queued for sync. Nothing here runs on the capture
path. Models (agent.redaction) hold the plan; this widget only shows it and writes decisions back.
"""
from __future__ import annotations

import copy
import getpass

from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QPainter, QPen, QPixmap
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from agent.redaction import RedactionError, review
from agent.redaction import plan as P
from agent.redaction.patterns import PLACEHOLDERS
from agent.sync.outbox import Outbox
from agent.wording import plural
from app.label_layout import place_labels
from app.screenshot_canvas import fit_rect
from app.workers import run_in_background

REVIEWER_KEY = "privacy.reviewer"


class RedactionCanvas(QWidget):
    """A frame with its boxes: red = will be blurred, grey dashed = kept clear, each tagged with
    its kind inside the image. Click a box to switch it; drag on the image to add one."""

    boxToggled = Signal(int)
    boxDrawn = Signal(tuple)  # normalized (x0, y0, x1, y1)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.pixmap: QPixmap | None = None
        self.boxes: list[dict] = []
        self._drag: tuple[QPointF, QPointF] | None = None
        self.setMinimumSize(480, 300)
        self.setMouseTracking(True)

    def set_frame(self, pixmap: QPixmap | None, boxes: list[dict]) -> None:
        self.pixmap, self.boxes = pixmap, boxes
        self.update()

    def _target(self) -> QRectF:
        if self.pixmap is None:
            return QRectF()
        return QRectF(*fit_rect(self.pixmap.width(), self.pixmap.height(), self.width(), self.height(), 4))

    def _norm(self, p: QPointF) -> tuple[float, float]:
        t = self._target()
        return (min(1.0, max(0.0, (p.x() - t.x()) / t.width())), min(1.0, max(0.0, (p.y() - t.y()) / t.height())))

    def box_at(self, p: QPointF) -> int | None:
        x, y = self._norm(p)
        for i in reversed(range(len(self.boxes))):
            x0, y0, x1, y1 = self.boxes[i]["rect"]
            if x0 <= x <= x1 and y0 <= y <= y1:
                return i
        return None

    def widget_rect(self, rect) -> QRectF:
        t = self._target()
        x0, y0, x1, y1 = rect
        return QRectF(t.x() + x0 * t.width(), t.y() + y0 * t.height(), (x1 - x0) * t.width(), (y1 - y0) * t.height())

    @staticmethod
    def tag(box: dict) -> str:
        return box["kind"] + ("" if box["blur"] else " (kept)")

    def label_rects(self) -> list[QRectF]:
        """Where each box's tag is drawn, in widget pixels: inside the image, beside its box, and
        clear of the other tags (see app.label_layout)."""
        t, fm = self._target(), self.fontMetrics()
        if self.pixmap is None or t.isEmpty():
            return []
        rects = [self.widget_rect(b["rect"]) for b in self.boxes]
        placed = place_labels([(r.left(), r.top(), r.right(), r.bottom()) for r in rects],
                              [(fm.horizontalAdvance(self.tag(b)) + 6, fm.height()) for b in self.boxes],
                              (t.left(), t.top(), t.right(), t.bottom()))
        return [QRectF(QPointF(x0, y0), QPointF(x1, y1)) for x0, y0, x1, y1 in placed]

    def mousePressEvent(self, event):
        if self.pixmap is not None and event.button() == Qt.LeftButton:
            self._drag = (event.position(), event.position())

    def mouseMoveEvent(self, event):
        if self._drag is not None:
            self._drag = (self._drag[0], event.position())
            self.update()

    def mouseReleaseEvent(self, event):
        if self._drag is None:
            return
        a, b = self._drag[0], event.position()
        self._drag = None
        self.update()
        if abs(a.x() - b.x()) < 4 and abs(a.y() - b.y()) < 4:
            i = self.box_at(b)
            if i is not None:
                self.boxToggled.emit(i)
            return
        (x0, y0), (x1, y1) = self._norm(a), self._norm(b)
        rect = (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))
        if rect[2] > rect[0] and rect[3] > rect[1]:
            self.boxDrawn.emit(rect)

    def paintEvent(self, event):
        p = QPainter(self)
        p.fillRect(self.rect(), QColor("#f1f3f4"))
        if self.pixmap is None:
            p.drawText(self.rect(), Qt.AlignCenter, "No frame")
            return
        p.setRenderHint(QPainter.SmoothPixmapTransform)
        p.drawPixmap(self._target(), self.pixmap, QRectF(self.pixmap.rect()))
        for b in self.boxes:
            r = self.widget_rect(b["rect"])
            if b["blur"]:
                p.fillRect(r, QColor(217, 48, 37, 70))
                p.setPen(QPen(QColor("#d93025"), 2))
            else:
                p.setPen(QPen(QColor("#5f6368"), 1.5, Qt.DashLine))
            p.drawRect(r)
        for b, tr in zip(self.boxes, self.label_rects(), strict=True):
            p.setPen(QPen(QColor("#d93025" if b["blur"] else "#5f6368"), 1))
            p.fillRect(tr, QColor(255, 255, 255, 230))
            p.drawText(tr, Qt.AlignCenter, self.fontMetrics().elidedText(self.tag(b), Qt.ElideRight, int(tr.width())))
        if self._drag is not None:
            p.setPen(QPen(QColor("#1a73e8"), 2, Qt.DashLine))
            p.drawRect(QRectF(self._drag[0], self._drag[1]).normalized())


class PrivacyReviewDialog(QDialog):
    """Review one episode's redaction; `approved` is emitted with its id after approve + submit."""

    approved = Signal(str)

    def __init__(self, store, episode_id: str, window=None, parent=None, *, engine=None, autoscan: bool = True):
        super().__init__(parent)
        self.store, self.episode_id, self.window_, self.engine = store, episode_id, window, engine
        self.setWindowTitle("Review privacy before upload")
        self.resize(1280, 800)
        self.plan: dict | None = None
        self.frames: list[tuple[str, int, str]] = []
        self.busy = False
        self._cancel = False

        self.status = QLabel()
        self.status.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.setTextVisible(True)
        self.progress.hide()
        self.frame_list = QListWidget()
        self.frame_list.setMinimumWidth(220)
        self.frame_list.currentRowChanged.connect(self._show_frame)
        self.canvas = RedactionCanvas()
        self.canvas.boxToggled.connect(self.toggle_box)
        self.canvas.boxDrawn.connect(self.add_box)
        hint = QLabel("Red boxes will be blurred. Click a box to keep that region clear; drag to blur more.")
        hint.setObjectName("muted")
        self.spans = QListWidget()
        self.spans.setWordWrap(True)
        self.spans.itemChanged.connect(self._span_changed)
        self.reviewer = QLineEdit(store.get_setting(REVIEWER_KEY) or _user())
        self.reviewer.setPlaceholderText("your name: recorded with each decision")
        self.keep = QCheckBox("Keep the unredacted originals on this computer")
        self.keep.setChecked(bool(store.get_setting(review.KEEP_ORIGINALS_KEY, True)))
        self.keep.setToolTip("Off: after approval this recording is replaced by its redacted version here too")
        self.audio = QCheckBox("Upload the audio as it is")
        self.audio.setToolTip("This recording's audio has no transcript, so nothing checked what it says. "
                              "Listen to it first; unticked, the audio stays on this computer")
        self.audio.toggled.connect(lambda _: self._update_state())
        self.approve_btn = QPushButton("Approve and submit")
        self.approve_btn.setDefault(True)
        self.approve_btn.clicked.connect(self.approve)
        close = QPushButton("Close")
        close.clicked.connect(self.reject)

        centre = QWidget()
        cl = QVBoxLayout(centre)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.addWidget(self.canvas, 1)
        cl.addWidget(hint)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(QLabel("Text to mask (untick to leave as is)"))
        rl.addWidget(self.spans, 1)
        split = QSplitter(Qt.Horizontal)
        split.addWidget(self.frame_list)
        split.addWidget(centre)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        split.setSizes([230, 760, 290])
        bottom = QHBoxLayout()
        bottom.addWidget(QLabel("Reviewer"))
        bottom.addWidget(self.reviewer)
        bottom.addWidget(self.keep)
        bottom.addWidget(self.audio)
        bottom.addStretch(1)
        bottom.addWidget(close)
        bottom.addWidget(self.approve_btn)
        lay = QVBoxLayout(self)
        lay.addWidget(self.status)
        lay.addWidget(self.progress)
        lay.addWidget(split, 1)
        lay.addLayout(bottom)
        self._reload()
        if autoscan:
            self.scan()

    # ------------------------------------------------------------ model -> view
    def _reload(self) -> None:
        ep = self.store.load_episode(self.episode_id)
        self.episode = ep
        self.plan = copy.deepcopy(P.plan_of(ep))
        self.frames = review._frames(ep)
        self.audio.setVisible(review.untranscribed_audio(ep))
        self.audio.blockSignals(True)
        self.audio.setChecked(bool((self.plan or {}).get("audio")))
        self.audio.blockSignals(False)
        row = max(0, self.frame_list.currentRow())
        self.frame_list.blockSignals(True)
        self.frame_list.clear()
        for h, index, which in self.frames:
            entry = (self.plan or {"frames": {}})["frames"].get(h)
            n = "not scanned yet" if entry is None else (plural(sum(b["blur"] for b in entry["boxes"]), "region") + " to blur")
            self.frame_list.addItem(f"Step {index + 1}{'' if which == 'pre' else ' (after)'} · {n}")
        self.frame_list.blockSignals(False)
        if self.frames:
            self.frame_list.setCurrentRow(min(row, len(self.frames) - 1))
            self._show_frame(self.frame_list.currentRow())
        self._fill_spans()
        self._update_state()

    def _fill_spans(self) -> None:
        self.spans.blockSignals(True)
        self.spans.clear()
        fields = dict(review.text_fields(self.episode))
        for key, entry in sorted((self.plan or {"texts": {}})["texts"].items()):
            text = fields.get(key, "")
            for i, sp in enumerate(entry["spans"]):
                item = QListWidgetItem(f"{review.field_label(key)} — {sp['kind']}: {text[sp['start']:sp['end']]} → {PLACEHOLDERS[sp['kind']]}")
                item.setFlags(item.flags() | Qt.ItemIsUserCheckable)
                item.setCheckState(Qt.Checked if sp["blur"] else Qt.Unchecked)
                item.setData(Qt.UserRole, (key, i))
                self.spans.addItem(item)
        if not self.spans.count():
            self.spans.addItem("No personal data found in the text")
        self.spans.blockSignals(False)

    def current_frame(self) -> str | None:
        r = self.frame_list.currentRow()
        return self.frames[r][0] if 0 <= r < len(self.frames) else None

    def _show_frame(self, row: int) -> None:
        h = self.current_frame()
        pix = QPixmap()
        if h:
            pix.loadFromData(self.store.get_blob(h))
        entry = (self.plan or {"frames": {}})["frames"].get(h) if h else None
        self.canvas.set_frame(pix if h else None, entry["boxes"] if entry else [])

    def _update_state(self) -> None:
        c = P.counts(self.plan)
        unscanned = sum(h not in (self.plan or {"frames": {}})["frames"] for h, _, _ in self.frames)
        if self.busy:
            pass  # the progress bar speaks
        elif unscanned:
            self.status.setText(f"{plural(unscanned, 'frame')} not scanned yet.")
        else:
            state = "Approved" if self.plan and self.plan["status"] == "approved" else "Ready to approve"
            audio = ""
            if review.untranscribed_audio(self.episode):
                audio = (" The audio has no transcript: it is uploaded as it is." if self.audio.isChecked() else
                         " The audio has no transcript and stays on this computer unless you tick “Upload the audio”.")
            self.status.setText(f"{state}: {plural(c['boxes'], 'region')} to blur on {plural(c['frames'], 'frame')}, "
                                f"{plural(c['spans'], 'text span')} to mask, {c['kept']} kept clear by a person.{audio}")
        self.approve_btn.setEnabled(not self.busy and not unscanned and self.plan is not None)

    # ------------------------------------------------------------ scanning
    def scan(self) -> None:
        if self.busy or review.pending_frames(self.store, self.episode_id) == 0 and self.plan is not None:
            return self._update_state()
        self._start_busy("Looking for personal data…")
        run_in_background(review.scan, self.store, self.episode_id, engine=self.engine, cancel=lambda: self._cancel,
                          on_result=lambda plan: self._done("Scan finished"), on_error=self._failed,
                          on_progress=self._progress)

    def _start_busy(self, text: str) -> None:
        self.busy = True
        self.progress.setRange(0, 0)
        self.progress.setFormat(text)
        self.progress.show()
        self.status.setText(text)
        self._update_state()

    def _progress(self, done: int, total: int, text: str) -> None:
        self.progress.setRange(0, max(1, total))
        self.progress.setValue(done)
        self.progress.setFormat(text or f"{done} of {total}")

    def _done(self, text: str) -> None:
        self.busy = False
        self.progress.hide()
        self._reload()

    def _failed(self, exc) -> None:
        self.busy = False
        self.progress.hide()
        self._update_state()
        self.status.setText(f"<span style='color:#d93025'>{exc}</span>")

    # ------------------------------------------------------------ decisions
    def _person(self) -> str:
        return self.reviewer.text().strip() or _user()

    def toggle_box(self, i: int) -> None:
        h = self.current_frame()
        if self.busy or not h or not self.plan:
            return
        box = self.plan["frames"][h]["boxes"][i]
        P.set_blur(self.plan, h, i, not box["blur"], self._person())
        self._changed()

    def add_box(self, rect) -> None:
        h = self.current_frame()
        if self.busy or not h or not self.plan or h not in self.plan["frames"]:
            return
        P.add_box(self.plan, h, rect, self._person())
        self._changed()

    def _span_changed(self, item: QListWidgetItem) -> None:
        ref = item.data(Qt.UserRole)
        if ref and self.plan:
            P.set_span_blur(self.plan, ref[0], ref[1], item.checkState() == Qt.Checked, self._person())
            self._changed(spans=False)

    def _changed(self, spans: bool = True) -> None:
        review.save_plan(self.store, self.episode_id, self.plan)
        row = self.frame_list.currentRow()
        self._reload()
        self.frame_list.setCurrentRow(row)

    # ------------------------------------------------------------ approve
    def approve(self) -> None:
        if self.busy or self.plan is None:
            return
        by = self._person()
        self.store.set_setting(REVIEWER_KEY, by)
        self.store.set_setting(review.KEEP_ORIGINALS_KEY, self.keep.isChecked())
        self._start_busy("Blurring the approved regions…")
        audio = self.audio.isChecked() if review.untranscribed_audio(self.episode) else None
        run_in_background(review.approve, self.store, self.episode_id, by, plan=self.plan,
                          keep_originals=self.keep.isChecked(), audio=audio, on_result=lambda plan: self._approved(),
                          on_error=self._failed, on_progress=self._progress)

    def _approved(self) -> None:
        self._done("Approved")
        sync = getattr(self.window_, "sync", None)
        if sync is not None:
            sync.submit([self.episode_id])
        else:
            Outbox(self.store).submit(self.episode_id)
        self.status.setText(self.status.text() + " Queued for sync.")
        if self.window_ is not None and hasattr(self.window_, "notify"):
            self.window_.notify("Redacted episode queued for sync")
        self.approved.emit(self.episode_id)
        self.approve_btn.setEnabled(False)  # done: nothing left to approve here
        self.accept()

    def reject(self) -> None:
        self._cancel = True  # a scan in flight stops after its frame and keeps what it found
        super().reject()


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return "annotator"


__all__ = ["PrivacyReviewDialog", "RedactionCanvas", "RedactionError"]
