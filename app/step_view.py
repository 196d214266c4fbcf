"""The step viewer: an episode's steps, the screenshot with the action drawn on it, and an editor
for the thought and the action. Save writes the step to the store (validated first); Revert
discards the edits. Up/Down move between steps, Ctrl+S saves.

Over 500 lines because it is one widget: the list, the canvas, the editor and the step's actions
(delete, blur, mark, privacy review) share its selection and its unsaved edit, so split apart
each piece would reach into the others' state. Its pure parts live in agent.wording and
agent.schema (Provenance.after_edit).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QColor, QIcon, QKeySequence, QPainter, QPixmap, QShortcut
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSplitter,
    QStackedWidget,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from agent.actions import validate
from agent.recorder.errors import RecorderError
from agent.recorder.review import blur_region, delete_steps
from agent.schema import Action, Episode, Outcome, Provenance, Step
from agent.storage.flywheel_routes import routed_as_stored
from agent.storage.store import NotFound, StoreError
from agent.wording import action_summary, outcome_name, plural
from app.action_editor import ActionEditor
from app.privacy_review import PrivacyReviewDialog
from app.screenshot_canvas import ScreenshotCanvas, element_line
from app.tool_view import ToolOutputView, legacy_tool_output

BADGE_COLORS = {"human": "#2b9348", "agent": "#1f7ae0", "corrected": "#e07a1f"}
OUTCOMES = (("unknown", None), ("success", True), ("failure", False))


# ---------------------------------------------------------------- the step list's badges
def badge_icon(source: str) -> QIcon:
    pm = QPixmap(18, 18)
    pm.fill(Qt.transparent)
    p = QPainter(pm)
    p.setRenderHint(QPainter.Antialiasing)
    p.setPen(Qt.NoPen)
    p.setBrush(QColor(BADGE_COLORS.get(source, "#777")))
    p.drawRoundedRect(1, 1, 16, 16, 4, 4)
    p.setPen(QColor("white"))
    f = p.font()
    f.setBold(True)
    f.setPixelSize(11)
    p.setFont(f)
    p.drawText(pm.rect(), Qt.AlignCenter, source[:1].upper())
    p.end()
    return QIcon(pm)


# ---------------------------------------------------------------- widget
class StepViewer(QWidget):
    episodeChanged = Signal(str)  # the episode's id, after anything was written to the store

    PIXMAP_CACHE = 48

    def __init__(self, store, window=None, parent=None):
        super().__init__(parent)
        self.store, self.window_ = store, window
        self.episode: Episode | None = None
        self.routed_of = lambda ep: routed_as_stored(store, ep)  # the Library reads the flywheel's store
        self._row = -1
        self._pixmaps: OrderedDict[str, QPixmap] = OrderedDict()
        self._loading = False

        self.stack = QStackedWidget()
        self.empty = QLabel("Select an episode to review its steps.")
        self.empty.setAlignment(Qt.AlignCenter)
        self.empty.setObjectName("muted")
        self.empty.setWordWrap(True)
        self.stack.addWidget(self.empty)
        self.stack.addWidget(self._build_content())
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.stack)

        QShortcut(QKeySequence.Save, self, self.save, context=Qt.WidgetWithChildrenShortcut)
        # Up/Down anywhere but in text fields and spin boxes (they need the keys themselves)
        for key, delta in ((Qt.Key_PageUp, -1), (Qt.Key_PageDown, 1)):
            QShortcut(QKeySequence(key), self, lambda d=delta: self.move(d), context=Qt.WidgetWithChildrenShortcut)

    def _build_content(self) -> QWidget:
        # header: the episode and its outcome
        self.title = QLabel()
        self.title.setObjectName("title")
        self.title.setWordWrap(True)
        self.meta = QLabel()
        self.meta.setObjectName("muted")
        self.meta.setWordWrap(True)  # long meta lines wrap instead of widening the window (1024 px screens)
        self.outcome = QComboBox()
        self.outcome.addItems([n for n, _ in OUTCOMES])
        self.outcome.setToolTip("Did the episode achieve its instruction?")
        self.outcome.activated.connect(lambda i: self.mark_outcome(OUTCOMES[i][1]))
        top = QHBoxLayout()
        titles = QVBoxLayout()
        titles.setSpacing(0)
        titles.addWidget(self.title)
        titles.addWidget(self.meta)
        top.addLayout(titles, 1)
        top.addWidget(QLabel("Outcome"))
        top.addWidget(self.outcome)

        # left: the steps
        self.steps = QTreeWidget()
        self.steps.setHeaderLabels(["#", "Action", "By"])
        self.steps.setRootIsDecorated(False)
        self.steps.setUniformRowHeights(True)
        self.steps.setAlternatingRowColors(True)
        self.steps.setIconSize(QSize(16, 16))
        self.steps.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.steps.setMinimumWidth(190)
        self.steps.setSelectionMode(QTreeWidget.ExtendedSelection)  # several steps deleted at once
        self.steps.itemSelectionChanged.connect(
            lambda: self.delete_btn.setText(f"Delete {n} steps…" if (n := len(self.steps.selectedItems())) > 1
                                            else "Delete step…"))
        head = self.steps.header()
        head.setStretchLastSection(False)
        head.setSectionResizeMode(0, QHeaderView.ResizeToContents)
        head.setSectionResizeMode(1, QHeaderView.Stretch)
        head.setSectionResizeMode(2, QHeaderView.ResizeToContents)
        self.steps.currentItemChanged.connect(self._current_changed)

        # centre: the screenshot
        self.canvas = ScreenshotCanvas()
        self.canvas.pointsEdited.connect(self._points_from_canvas)
        self.canvas.navigate.connect(self.move)
        self.canvas.regionSelected.connect(self._region_selected)
        self.canvas.elementHovered.connect(self._element_hovered)
        self.hint = QLabel()
        self.hint.setObjectName("muted")
        self.hint.setWordWrap(True)
        # the step's element list (what the platform's accessibility layer said was on the screen)
        self.elements_btn = QPushButton("Elements")
        self.elements_btn.setCheckable(True)
        self.elements_btn.toggled.connect(self._elements_toggled)
        self.element_info = QLabel()
        self.element_info.setObjectName("muted")
        self.element_info.setTextInteractionFlags(Qt.TextSelectableByMouse)
        under = QHBoxLayout()
        under.addWidget(self.elements_btn)
        under.addWidget(self.element_info, 1)
        centre = QWidget()
        cl = QVBoxLayout(centre)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.addWidget(self.canvas, 1)
        cl.addLayout(under)
        cl.addWidget(self.hint)

        # right: the editor
        self.thought = QPlainTextEdit()
        self.thought.setPlaceholderText("What the actor was thinking before this action")
        self.thought.setTabChangesFocus(True)
        self.thought.textChanged.connect(self._edited)
        self.action_editor = ActionEditor()
        self.action_editor.changed.connect(self._action_edited)
        self.provenance = QLabel()
        self.provenance.setWordWrap(True)
        self.provenance.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.error = QLabel()
        self.error.setObjectName("error")
        self.error.setWordWrap(True)
        self.error.hide()
        self.save_btn = QPushButton("Save")
        self.save_btn.setToolTip("Write this step to the store (Ctrl+S)")
        self.save_btn.clicked.connect(self.save)
        self.revert_btn = QPushButton("Revert")
        self.revert_btn.setToolTip("Discard the edits of this step")
        self.revert_btn.clicked.connect(self.revert)
        self.delete_btn = QPushButton("Delete step…")
        self.delete_btn.setToolTip("Delete the selected steps (Shift or Ctrl+click in the list selects several)")
        self.delete_btn.setObjectName("danger")
        self.delete_btn.clicked.connect(lambda: self.delete_step())
        self.blur_btn = QPushButton("Blur region")
        self.blur_btn.setCheckable(True)
        self.blur_btn.setToolTip("Drag a rectangle on the screenshot to hide what is in it, for good (Esc cancels)")
        self.blur_btn.toggled.connect(self._blur_toggled)
        self.privacy_btn = QPushButton("Review privacy…")
        self.privacy_btn.setToolTip("Find e-mails, phone and card numbers on the screenshots and in the text, "
                                    "choose what is blurred, then submit the redacted recording")
        self.privacy_btn.clicked.connect(lambda: self.review_privacy())

        thought_box = QGroupBox("Thought")
        QVBoxLayout(thought_box).addWidget(self.thought)
        action_box = QGroupBox("Action")
        QVBoxLayout(action_box).addWidget(self.action_editor)
        prov_box = QGroupBox("Provenance")
        QVBoxLayout(prov_box).addWidget(self.provenance)
        # a tool step's result (the command, its exit code, the first lines), or an old text observation
        self.tool_output = ToolOutputView("Tool output")
        # two rows: one row of four buttons made the panel too wide for a 1024 px screen
        tools = QHBoxLayout()
        tools.addWidget(self.delete_btn)
        tools.addWidget(self.blur_btn)
        tools.addWidget(self.privacy_btn)
        tools.addStretch(1)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.revert_btn)
        buttons.addWidget(self.save_btn)
        panel = QWidget()
        pl = QVBoxLayout(panel)
        pl.setContentsMargins(4, 0, 4, 0)
        pl.addWidget(thought_box, 2)
        pl.addWidget(action_box)
        pl.addWidget(self.tool_output)
        pl.addWidget(prov_box)
        pl.addWidget(self.error)
        pl.addStretch(0)
        scroll = QScrollArea()
        scroll.setWidget(panel)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        scroll.setMinimumWidth(max(260, panel.minimumSizeHint().width()))
        # the buttons stay in view below the scrolling editor, also on a 700 px high screen
        side = QWidget()
        sl = QVBoxLayout(side)
        sl.setContentsMargins(0, 0, 4, 0)
        sl.addWidget(scroll, 1)
        sl.addLayout(tools)
        sl.addLayout(buttons)

        self.splitter = QSplitter(Qt.Horizontal)
        self.splitter.addWidget(self.steps)
        self.splitter.addWidget(centre)
        self.splitter.addWidget(side)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setStretchFactor(2, 0)
        self.splitter.setSizes([280, 900, 360])
        self.splitter.setCollapsible(0, False)
        self.splitter.setCollapsible(1, False)

        content = QWidget()
        lay = QVBoxLayout(content)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.addLayout(top)
        lay.addWidget(self.splitter, 1)
        return content

    # ------------------------------------------------------------ loading
    def show_meta(self) -> None:
        """The line under the title, with the route as the flywheel judged the episode now (it
        changes without the episode changing: the Library calls this when its store moves)."""
        ep = self.episode
        if ep is None:
            return
        who = f" · by {ep.producer}" if ep.producer else ""
        routed = self.routed_of(ep)
        why = routed.routing.get("why") or []
        route = f"route {routed.route}" + (f" ({why[0]})" if why and routed.route != "unscored" else "")
        self.meta.setText(f"{ep.kind} · {ep.platform} · {plural(len(ep.steps), 'step')} · {route}{who} · {ep.id}")
        self.meta.setToolTip("\n".join(why[:12]))

    def load_episode(self, episode_id: str | None, row: int = 0) -> None:
        """Show an episode (None: nothing). Unsaved edits must have been dealt with."""
        self.episode = None
        self._row = -1
        if episode_id is None:
            self.stack.setCurrentIndex(0)
            return
        try:
            self.episode = self.store.load_episode(episode_id)
        except (StoreError, ValueError) as e:
            self.stack.setCurrentIndex(0)
            self._notify(f"Cannot open episode {episode_id}: {e}")
            return
        ep = self.episode
        self.stack.setCurrentIndex(1)
        self.title.setText(ep.instruction or "(no instruction)")
        self.show_meta()
        self.outcome.setCurrentIndex([v for _, v in OUTCOMES].index(ep.outcome.success))
        self.steps.blockSignals(True)  # the row is set below, not through the signal
        self.steps.clear()
        self.steps.addTopLevelItems([QTreeWidgetItem() for _ in ep.steps])
        self._update_items()
        if ep.steps:
            self._row = min(max(0, row), len(ep.steps) - 1)
            self.steps.setCurrentItem(self.steps.topLevelItem(self._row))
        self.steps.blockSignals(False)
        self._show_step(self.current_step())

    def _update_items(self) -> None:
        for s, i in zip(self.episode.steps, range(self.steps.topLevelItemCount()), strict=False):  # rows that exist
            item = self.steps.topLevelItem(i)
            item.setText(0, str(s.index + 1))  # people count steps from 1, as Supervise and the privacy review do
            item.setText(1, action_summary(s.action, s.observation.width, s.observation.height))
            item.setText(2, s.provenance.source)
            item.setIcon(2, badge_icon(s.provenance.source))
            item.setToolTip(1, s.thought)
            f = item.font(1)
            f.setItalic(False)
            item.setFont(1, f)

    def select_step(self, row: int) -> None:
        item = self.steps.topLevelItem(row)
        if item is not None:
            self.steps.setCurrentItem(item)

    def move(self, delta: int) -> None:
        if self.episode and self.episode.steps:
            self.select_step(min(max(0, self._row + delta), len(self.episode.steps) - 1))

    def current_step(self) -> Step | None:
        if self.episode is None or not (0 <= self._row < len(self.episode.steps)):
            return None
        return self.episode.steps[self._row]

    def _current_changed(self, item, previous):
        row = self.steps.indexOfTopLevelItem(item) if item is not None else -1
        if row == self._row:
            return
        if self._row >= 0 and not self.confirm_leave():
            self.steps.blockSignals(True)
            self.steps.setCurrentItem(previous)
            self.steps.blockSignals(False)
            return
        self._row = row
        self._show_step(self.current_step())

    def _pixmap(self, digest: str | None) -> tuple[QPixmap | None, str]:
        if not digest:
            return None, "this step has no screenshot"
        if digest in self._pixmaps:
            self._pixmaps.move_to_end(digest)
            return self._pixmaps[digest], ""
        try:
            data = self.store.get_blob(digest)
        except (NotFound, StoreError) as e:
            return None, str(e)
        pm = QPixmap()
        if not pm.loadFromData(data):
            return None, f"screenshot {digest[:12]}… is not an image Qt can read"
        self._pixmaps[digest] = pm
        while len(self._pixmaps) > self.PIXMAP_CACHE:
            self._pixmaps.popitem(last=False)
        return pm, ""

    def _show_step(self, step: Step | None) -> None:
        self._loading = True
        self.error.hide()
        self.blur_btn.setChecked(False)
        for w in (self.thought, self.action_editor, self.save_btn, self.revert_btn, self.delete_btn, self.blur_btn):
            w.setEnabled(step is not None)
        if step is None:
            self.thought.setPlainText("")
            self.canvas.set_observation(None, 16, 10, "this episode has no steps")
            self.canvas.set_action(None)
            self.canvas.set_proposal(None)
            self._show_elements(None)
            self.action_editor.clear()  # else the last episode's action stays in the form
            self.provenance.setText("")
            self.hint.setText("")
            self.tool_output.set_output(None)
            self._loading = False
            return
        obs = step.observation
        pm, missing = self._pixmap(obs.screenshot)
        self.canvas.set_observation(pm, obs.width, obs.height, missing)
        self.canvas.set_action(step.action)
        self.canvas.set_proposal(step.provenance.proposal_action if step.provenance.source == "corrected" else None)
        self._show_elements(obs)
        self.thought.setPlainText(step.thought)
        self.action_editor.set_action(step.action, self.episode.platform, obs.width, obs.height)
        self.provenance.setText(self._describe(step.provenance, obs.width, obs.height))
        self._show_tool_output(step)
        self._loading = False
        self._update_dirty()
        self._update_hint(step.action)

    def _show_tool_output(self, step: Step) -> None:
        out = legacy_tool_output(step)
        text = step.observation.extra.get("text")
        if out is not None:
            self.tool_output.set_output(out)
        elif isinstance(text, str) and text and not step.observation.screenshot:  # recorded before tool_output
            self.tool_output.set_text("Text observation (what the agent saw)", text)
        else:
            self.tool_output.set_output(None)

    def _show_elements(self, obs) -> None:
        """The toggle and the canvas for this observation's element list (or why it has none)."""
        elements = obs.elements if obs is not None else None
        self.canvas.set_elements(elements)
        has = bool(elements)
        self.elements_btn.setEnabled(has)
        self.elements_btn.setText(f"Elements ({len(elements)})" if has else "Elements")
        source = obs.elements_source if obs is not None else None
        if has:
            tip = f"Outline the {plural(len(elements), 'element')} the platform listed ({source or 'unknown source'}); hover one to see it"
        elif elements is not None:
            tip = f"The platform listed no element on this screen ({source or 'unknown source'})"
        else:
            tip = f"No element list: {source.removeprefix('none: ')}" if source else "This step has no element list"
        self.elements_btn.setToolTip(tip)
        self.canvas.set_elements_shown(has and self.elements_btn.isChecked())
        self._element_hovered(None)

    def _elements_toggled(self, on: bool) -> None:
        self.canvas.set_elements_shown(on and self.elements_btn.isEnabled())
        self._element_hovered(None)

    def _element_hovered(self, index) -> None:
        step = self.current_step()
        items = step.observation.elements if step is not None else None
        if index is not None and items and 0 <= index < len(items):
            self.element_info.setText(element_line(index, items[index]))
        elif self.canvas.elements_shown():
            self.element_info.setText("Hover a box to see its element")
        else:
            self.element_info.setText("")

    @staticmethod
    def _describe(prov: Provenance, w: int, h: int) -> str:
        lines = [f"<b style='color:{BADGE_COLORS.get(prov.source, '#777')}'>{prov.source}</b>"]
        if prov.policy_version:
            lines[0] += f" · policy {prov.policy_version}"
        if prov.decision:
            lines.append(f"decision: {prov.decision}" + (f" by {prov.decided_by}" if prov.decided_by else ""))
        if prov.reason:
            lines.append(f"reason: {prov.reason}")
        if prov.source == "corrected":
            lines.append("<b>Original proposal</b>")
            if prov.proposal_thought:
                lines.append(f"<i>{_html(prov.proposal_thought)}</i>")
            if prov.proposal_action:
                lines.append(_html(action_summary(prov.proposal_action, w, h)))
        return "<br>".join(lines)

    # ------------------------------------------------------------ editing
    def draft(self) -> tuple[str, Action]:
        return self.thought.toPlainText(), self.action_editor.action()

    def is_dirty(self) -> bool:
        step = self.current_step()
        return step is not None and self.draft() != (step.thought, step.action)

    def _edited(self):
        if not self._loading:
            self._update_dirty()

    def _action_edited(self):
        if self._loading:
            return
        action = self.action_editor.action()
        self.canvas.set_action(action)
        self._update_hint(action)
        self._update_dirty()

    def _points_from_canvas(self, points: dict):
        self.action_editor.set_points(points)

    def _update_dirty(self):
        dirty = self.is_dirty()
        self.save_btn.setEnabled(dirty)
        self.revert_btn.setEnabled(dirty)
        item = self.steps.topLevelItem(self._row)
        if item is not None:
            f = item.font(1)
            f.setItalic(dirty)
            item.setFont(1, f)
        if not dirty:
            self.error.hide()

    def _update_hint(self, action: Action):
        if action.name == "drag":
            text = "Drag on the screenshot from start to end, or click the start and then the end."
        elif any(isinstance(v, tuple) for v in action.args.values()) or action.name == "scroll":
            text = "Click the screenshot to move the point."
        else:
            text = ""
        self.hint.setText(text + ("  " if text else "") + "PgUp/PgDn: previous/next step · Ctrl+S: save")

    def save(self) -> bool:
        """Validate and write the current step; False (with the reason shown) when invalid."""
        step = self.current_step()
        if step is None or not self.is_dirty():
            return step is not None
        thought, action = self.draft()
        reason = validate(action)
        if reason:
            self._show_error(f"Not saved: {reason}")
            return False
        prov = step.provenance.after_edit(step.thought, step.action, thought, action)
        new = replace(step, thought=thought, action=action, provenance=prov)
        try:
            self.store.update_step(self.episode.id, new)
        except (StoreError, ValueError) as e:
            self._show_error(f"Not saved: {e}")
            return False
        # refresh in place: save may run inside the list's own currentItemChanged handler
        self.episode = self.store.load_episode(self.episode.id)
        self._update_items()
        self._show_step(self.current_step())
        self._notify(f"Saved step {new.index + 1}")
        self.episodeChanged.emit(self.episode.id)
        return True

    def revert(self) -> None:
        self._show_step(self.current_step())

    def confirm_leave(self) -> bool:
        """Before showing something else: True when there are no unsaved edits or the user
        saved or discarded them."""
        if not self.is_dirty():
            return True
        answer = QMessageBox.question(
            self, "Unsaved changes", f"Step {self.current_step().index + 1} has unsaved changes.",
            QMessageBox.Save | QMessageBox.Discard | QMessageBox.Cancel, QMessageBox.Save,
        )
        if answer == QMessageBox.Save:
            return self.save()
        if answer == QMessageBox.Discard:
            self.revert()
            return True
        return False

    def selected_step_indices(self) -> list[int]:
        """The steps selected in the list (Shift/Ctrl+click selects several), else the current one."""
        rows = sorted({self.steps.indexOfTopLevelItem(it) for it in self.steps.selectedItems()})
        if not rows and self.current_step() is not None:
            rows = [self._row]
        return [self.episode.steps[r].index for r in rows if 0 <= r < len(self.episode.steps)] if self.episode else []

    def delete_step(self, confirm: bool = True) -> bool:
        """Delete the selected steps (one question for all of them); in a recording their raw
        input goes too, so re-reducing the recording cannot bring them back (agent.recorder.review)."""
        indices = self.selected_step_indices()
        if not indices:
            return False
        by_index = {s.index: s for s in self.episode.steps}
        what = (f"step {indices[0] + 1} ({by_index[indices[0]].action.name})" if len(indices) == 1
                else f"{len(indices)} steps ({', '.join(str(i + 1) for i in indices)})")
        if confirm and QMessageBox.question(
            self, "Delete steps" if len(indices) > 1 else "Delete step",
            f"Delete {what} from this episode? This cannot be undone.",
            QMessageBox.Yes | QMessageBox.No, QMessageBox.No,
        ) != QMessageBox.Yes:
            return False
        done = f"Deleted {what}"
        return self._change_store(lambda: delete_steps(self.store, self.episode.id, indices), done, "Not deleted")

    def _blur_toggled(self, on: bool) -> None:
        if on and self.is_dirty():
            self.blur_btn.setChecked(False)
            self._show_error("Save or revert this step's edits before blurring its screenshot.")
            return
        self.canvas.set_region_mode(on)
        if on:
            self.canvas.setFocus(Qt.OtherFocusReason)

    def _region_selected(self, rect) -> None:
        self.blur_btn.setChecked(False)
        if rect is not None:
            self.blur_region(rect)

    def blur_region(self, rect, confirm: bool = True) -> bool:
        """Blur a normalized rect of the current step's screenshot in the store: the image is
        replaced everywhere this episode uses it and the original is deleted."""
        step = self.current_step()
        if step is None or not step.observation.screenshot:
            self._show_error("This step has no screenshot to blur.")
            return False
        if confirm and QMessageBox.question(
            self, "Blur region", f"Blur this region of step {step.index + 1}'s screenshot? The original image is replaced "
            "and cannot be restored.", QMessageBox.Yes | QMessageBox.No, QMessageBox.Yes,
        ) != QMessageBox.Yes:
            return False
        return self._change_store(lambda: blur_region(self.store, self.episode.id, step.index, rect, "pre"),
                                  f"Blurred a region of step {step.index + 1}", "Not blurred")

    def review_privacy(self, **kwargs):
        """Open the privacy review of this episode (scanning starts in the background)."""
        if self.episode is None or not self.confirm_leave():
            return None
        dialog = PrivacyReviewDialog(self.store, self.episode.id, self.window_, self, **kwargs)
        dialog.approved.connect(lambda eid: self._reload(max(0, self._row)))
        dialog.show()
        return dialog

    def _change_store(self, change, done: str, failed: str) -> bool:
        """Run a review change on the store, then show the episode as stored (or why not)."""
        try:
            change()
        except (StoreError, RecorderError, ValueError) as e:
            self._show_error(f"{failed}: {e}")
            return False
        self._reload(self._row)
        self._notify(done)
        return True

    def mark_outcome(self, success: bool | None) -> None:
        if self.episode is None:
            return
        outcome = Outcome(success=success, source="annotator" if success is not None else None)
        try:
            self.store.update_episode_fields(self.episode.id, outcome=outcome)
        except (StoreError, ValueError) as e:
            self._notify(f"Outcome not saved: {e}")
            return
        self.episode.outcome = outcome
        self.outcome.setCurrentIndex([v for _, v in OUTCOMES].index(success))
        self._notify(f"Marked {outcome_name(success)}")
        self.episodeChanged.emit(self.episode.id)

    def _reload(self, row: int) -> None:
        eid = self.episode.id
        self._row = -1  # the shown step is already saved or gone: nothing to confirm
        self.load_episode(eid, row)
        self.episodeChanged.emit(eid)

    def _show_error(self, text: str) -> None:
        self.error.setText(text)
        self.error.show()

    def _notify(self, text: str) -> None:
        if self.window_ is not None and hasattr(self.window_, "notify"):
            self.window_.notify(text)


def _html(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\n", "<br>")
