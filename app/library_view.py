"""The Library page: every local episode in a sortable, filterable table, and the step viewer of
the selected one below it. Actions on the selected episodes: mark the outcome, delete, export
(training JSONL or a .zip bundle: what a sync would send, asking first about episodes without an
approved privacy review) and import a bundle; export and import run in the background.
"""
from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QItemSelectionModel, QSortFilterProxyModel, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableView,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from agent.schema import Outcome
from agent.storage.bundle import import_file, write_bundle
from agent.storage.export import export_jsonl, without_review
from agent.storage.flywheel_routes import FlywheelRoutes
from agent.storage.store import StoreError
from agent.sync.outbox import Outbox
from agent.wording import command_name, outcome_name, plural
from app.step_view import OUTCOMES, StepViewer
from app.workers import run_in_background

COLUMNS = ("Instruction", "Kind", "Steps", "Date", "Outcome", "Route", "Sync")
ID_ROLE = Qt.UserRole + 1
SORT_ROLE = Qt.UserRole
OUTCOME_COLORS = {True: "#2b9348", False: "#c92a2a"}
EXPORT_DIR_KEY = "app.export_dir"  # store setting: the folder export and import dialogs open in


def export_episodes(store, path, episode_ids, progress=None, include_originals: bool = False) -> dict:
    """Export to `path`: a .zip is a bundle, anything else training JSONL; the privacy review's
    redacted version of each episode unless include_originals (agent.storage.export.export_view)."""
    path = Path(path)
    if path.suffix.lower() == ".zip":
        return write_bundle(store, path, list(episode_ids), include_originals=include_originals)
    return export_jsonl(store, path, list(episode_ids), progress=progress, include_originals=include_originals)


class LibraryPage(QWidget):
    taskFinished = Signal(str, object)  # "export" | "import", the result dict or the exception

    def __init__(self, store, window=None, parent=None):
        super().__init__(parent)
        self.store, self.window_ = store, window
        self.outbox = Outbox(store)  # the Sync column: each episode as the server this app syncs to has it
        self._busy = False
        self._routes: FlywheelRoutes | None = None

        # toolbar
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter by instruction, kind, outcome, route…")
        self.filter.setClearButtonEnabled(True)
        self.filter.textChanged.connect(self._filter_changed)
        self.count = QLabel()
        self.count.setObjectName("muted")
        self.outcome_btn = QToolButton()
        self.outcome_btn.setText("Mark outcome")
        self.outcome_btn.setPopupMode(QToolButton.InstantPopup)
        menu = QMenu(self.outcome_btn)
        for name, value in OUTCOMES:
            menu.addAction(name.capitalize(), lambda v=value: self.mark_outcome(v))
        self.outcome_btn.setMenu(menu)
        self.delete_btn = QPushButton("Delete…")
        self.delete_btn.setObjectName("danger")
        self.delete_btn.clicked.connect(lambda: self.delete_selected())
        self.export_btn = QToolButton()
        self.export_btn.setText("Export")
        self.export_btn.setPopupMode(QToolButton.InstantPopup)
        menu = QMenu(self.export_btn)
        menu.addAction("Training samples (JSONL)…", lambda: self._ask_export("jsonl"))
        menu.addAction("Bundle (.zip)…", lambda: self._ask_export("zip"))
        self.export_btn.setMenu(menu)
        self.import_btn = QPushButton("Import…")
        self.import_btn.clicked.connect(self._ask_import)
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(180)
        self.progress.setTextVisible(False)
        self.progress.hide()
        bar = QHBoxLayout()
        bar.addWidget(self.filter, 1)
        bar.addWidget(self.count)
        bar.addSpacing(12)
        bar.addWidget(self.progress)
        for w in (self.outcome_btn, self.export_btn, self.import_btn, self.delete_btn):
            bar.addWidget(w)

        # table
        self.model = QStandardItemModel(0, len(COLUMNS))
        self.model.setHorizontalHeaderLabels(COLUMNS)
        self.proxy = QSortFilterProxyModel()
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SORT_ROLE)
        self.proxy.setFilterCaseSensitivity(Qt.CaseInsensitive)
        self.proxy.setFilterKeyColumn(-1)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(3, Qt.DescendingOrder)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.ExtendedSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(26)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.Stretch)
        for col in range(1, len(COLUMNS)):
            header.setSectionResizeMode(col, QHeaderView.ResizeToContents)
        self.table.selectionModel().currentRowChanged.connect(self._current_row_changed)
        self.table.selectionModel().selectionChanged.connect(lambda *_: self._update_buttons())

        self.viewer = StepViewer(store, window)
        self.viewer.routed_of = lambda ep: self.flywheel_routes().of([ep])[ep.id]
        self.viewer.episodeChanged.connect(self._episode_changed)

        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addLayout(bar)
        tl.addWidget(self.table, 1)
        self.splitter = QSplitter(Qt.Vertical)
        self.splitter.addWidget(top)
        self.splitter.addWidget(self.viewer)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 3)
        self.splitter.setSizes([300, 600])  # about ten rows of episodes above the viewer
        self.splitter.setCollapsible(1, False)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        lay.addWidget(self.splitter)
        self.refresh()
        # live: whoever writes the store (a run, training, the command line in another process), the
        # table follows within a second; while hidden it only notes that it is stale
        self._seen = self._change_token()
        self._stale = False
        self._watch = QTimer(self)
        self._watch.timeout.connect(self._poll_store)
        self._watch.start(1000)

    def flywheel_routes(self) -> FlywheelRoutes:
        """Where routes are read from: the store the Train page's flywheel trains on, their one
        owner (see agent.storage.flywheel_routes)."""
        pick = getattr(self.window_, "training_data_dir", None)
        where = Path(pick() if callable(pick) else self.store.root)
        if self._routes is None or self._routes.training_dir != where:
            if self._routes is not None:
                self._routes.close()
            self._routes = FlywheelRoutes(self.store, where)
        return self._routes

    def _change_token(self):
        return self.store.change_token(), self.flywheel_routes().change_token()

    def shutdown(self) -> None:
        if self._routes is not None:
            self._routes.close()

    def _poll_store(self) -> None:
        try:
            token = self._change_token()
        except Exception:  # a closing store: nothing to follow any more
            self._watch.stop()
            return
        if token != self._seen:
            self._seen, self._stale = token, True
        if self._stale and self.isVisible():
            self._stale = False
            self.refresh()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self._poll_store()

    # ------------------------------------------------------------ table
    def refresh(self) -> None:
        """Reload the table from the store, keeping the current episode selected."""
        current = self.current_episode_id()
        episodes = self.store.list_episodes()
        sync = {e.episode_id: e.label for e in self.outbox.entries()}
        sm = self.table.selectionModel()
        sm.blockSignals(True)  # rebuilding rows is not the user choosing another episode
        self.table.setSortingEnabled(False)
        self.model.removeRows(0, self.model.rowCount())
        routed = self.flywheel_routes().of(episodes)
        for ep in episodes:
            shown = routed[ep.id]
            success = shown.outcome.success
            cells = [
                (ep.instruction or "(no instruction)", (ep.instruction or "").lower()),
                (ep.kind, ep.kind),
                (str(ep.meta.get("n_steps", len(ep.steps))), int(ep.meta.get("n_steps", len(ep.steps)))),
                (time.strftime("%Y-%m-%d %H:%M", time.localtime(ep.created_at)), ep.created_at),
                (outcome_name(success), {True: 2, None: 1, False: 0}[success]),
                (shown.route, shown.route),
                (sync.get(ep.id, ""), sync.get(ep.id, "")),
            ]
            row = []
            for text, key in cells:
                item = QStandardItem(text)
                item.setData(key, SORT_ROLE)
                row.append(item)
            row[0].setData(ep.id, ID_ROLE)
            row[0].setToolTip(f"{ep.instruction}\n{ep.id}")
            routing = shown.routing
            if routing.get("why"):  # why the flywheel put it there (the first line names the rule)
                row[5].setToolTip(f"Iteration {routing.get('iteration')}: {routing.get('route')}\n"
                                  + "\n".join(routing["why"][:8]))
            row[2].setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
            if success in OUTCOME_COLORS:
                row[4].setForeground(QColor(OUTCOME_COLORS[success]))
            self.model.appendRow(row)
        self.table.setSortingEnabled(True)
        sm.blockSignals(False)
        self._update_count()
        self.viewer.empty.setText(
            "Select an episode to review its steps." if episodes else
            "No episodes yet. Record a demonstration on the Record page, import a bundle (Import…), "
            f"or write sandbox demonstrations with `{command_name()} sandbox generate --episodes 60`.")
        if current and not self.select_episode(current, load=False):
            self.viewer.load_episode(None)
        elif current and self.viewer.episode is not None and self.viewer.episode.id == current:
            # changed elsewhere (the flywheel routed it, a sync replaced it): show the stored one,
            # unless the person is editing a step (their unsaved edit wins; saving will say if it clashes)
            stored = next((e.revision for e in episodes if e.id == current), None)
            if stored is not None and stored != self.viewer.episode.revision and not self.viewer.is_dirty():
                self.viewer.load_episode(current, max(0, self.viewer._row))
            else:  # the flywheel's judgement changes without the episode: its route line, anew
                self.viewer.show_meta()
        self.table.viewport().update()
        self._update_buttons()

    def _row_of(self, episode_id: str) -> int:
        for r in range(self.proxy.rowCount()):
            if self.proxy.index(r, 0).data(ID_ROLE) == episode_id:
                return r
        return -1

    def select_episode(self, episode_id: str, load: bool = True) -> bool:
        r = self._row_of(episode_id)
        if r < 0:
            return False
        sm = self.table.selectionModel()
        if not load:
            sm.blockSignals(True)
        sm.setCurrentIndex(self.proxy.index(r, 0), QItemSelectionModel.ClearAndSelect | QItemSelectionModel.Rows)
        sm.blockSignals(False)
        self.table.scrollTo(self.proxy.index(r, 0))
        return True

    def current_episode_id(self) -> str | None:
        idx = self.table.selectionModel().currentIndex()
        return self.proxy.index(idx.row(), 0).data(ID_ROLE) if idx.isValid() else None

    def selected_episode_ids(self) -> list[str]:
        rows = sorted({i.row() for i in self.table.selectionModel().selectedRows()})
        return [self.proxy.index(r, 0).data(ID_ROLE) for r in rows]

    def _current_row_changed(self, current, previous) -> None:
        eid = self.proxy.index(current.row(), 0).data(ID_ROLE) if current.isValid() else None
        if self.viewer.episode is not None and eid == self.viewer.episode.id:
            return
        if not self.viewer.confirm_leave():
            sm = self.table.selectionModel()
            sm.blockSignals(True)
            sm.setCurrentIndex(previous, QItemSelectionModel.ClearAndSelect | QItemSelectionModel.Rows)
            sm.blockSignals(False)
            return
        self.viewer.load_episode(eid)

    def _filter_changed(self, text: str) -> None:
        self.proxy.setFilterFixedString(text)
        self._update_count()

    def _update_count(self) -> None:
        shown, total = self.proxy.rowCount(), self.model.rowCount()
        self.count.setText(plural(total, "episode") if shown == total else f"{shown} of {plural(total, 'episode')}")

    def _update_buttons(self) -> None:
        has = bool(self.selected_episode_ids())
        self.outcome_btn.setEnabled(has)
        self.delete_btn.setEnabled(has and not self._busy)
        self.export_btn.setEnabled(self.proxy.rowCount() > 0 and not self._busy)
        self.import_btn.setEnabled(not self._busy)

    def _episode_changed(self, episode_id: str) -> None:
        self.refresh()

    # ------------------------------------------------------------ actions
    def mark_outcome(self, success: bool | None, episode_ids=None) -> None:
        ids = list(episode_ids or self.selected_episode_ids())
        outcome = Outcome(success=success, source="annotator" if success is not None else None)
        try:
            for eid in ids:
                self.store.update_episode_fields(eid, outcome=outcome)
        except (StoreError, ValueError) as e:
            self._error("Outcome not saved", str(e))
        if self.viewer.episode is not None and self.viewer.episode.id in ids:
            self.viewer.episode.outcome = outcome
            self.viewer.outcome.setCurrentIndex([v for _, v in OUTCOMES].index(success))
        self.refresh()
        self._notify(f"Marked {plural(len(ids), 'episode')} {outcome_name(success)}")

    def delete_selected(self, confirm: bool = True) -> int:
        ids = self.selected_episode_ids()
        if not ids:
            return 0
        what = "this episode" if len(ids) == 1 else f"these {len(ids)} episodes"
        if confirm and QMessageBox.question(
            self, "Delete episodes", f"Delete {what} and their screenshots? This cannot be undone.",
            QMessageBox.Yes | QMessageBox.No, QMessageBox.No,
        ) != QMessageBox.Yes:
            return 0
        if self.viewer.episode is not None and self.viewer.episode.id in ids:
            self.viewer.load_episode(None)  # its unsaved edits go with it
        for eid in ids:
            try:
                self.store.delete_episode(eid)
            except (StoreError, ValueError) as e:
                self._error("Delete failed", str(e))
                break
        self.table.selectionModel().clear()
        self.refresh()
        self._notify(f"Deleted {plural(len(ids), 'episode')}")
        return len(ids)

    def _ask_export(self, fmt: str) -> None:
        ids = self.selected_episode_ids() or self.visible_episode_ids()
        folder = self.export_folder()
        if fmt == "zip":
            path, _ = QFileDialog.getSaveFileName(self, "Export bundle", str(folder / "tandem-episodes.zip"),
                                                  "Tandem bundle (*.zip)")
        else:
            path, _ = QFileDialog.getSaveFileName(self, "Export training samples", str(folder / "samples.jsonl"),
                                                  "JSON Lines (*.jsonl)")
        if path:
            if fmt == "zip" and not path.lower().endswith(".zip"):
                path += ".zip"
            self.store.set_setting(EXPORT_DIR_KEY, str(Path(path).parent))
            self.export_to(path, ids)

    def export_folder(self) -> Path:
        """Where export and import dialogs open: the last folder used, else <data>/exports (made
        on first use), never the folder the app happened to be started from."""
        last = self.store.get_setting(EXPORT_DIR_KEY)
        if last and Path(last).is_dir():
            return Path(last)
        folder = Path(self.store.root) / "exports"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def visible_episode_ids(self) -> list[str]:
        return [self.proxy.index(r, 0).data(ID_ROLE) for r in range(self.proxy.rowCount())]

    def export_to(self, path, episode_ids=None) -> bool:
        """Export in the background: a .zip path writes a bundle, any other JSONL samples
        (with their images in images/ beside it), each episode as its privacy review redacted it.
        Episodes without an approved review are asked about first (confirm_originals); False
        when the person cancelled. Emits taskFinished("export", ...)."""
        ids = list(episode_ids) if episode_ids else self.visible_episode_ids()
        unreviewed = without_review(self.store, ids)
        include_originals = False
        if unreviewed:
            choice = self.confirm_originals(len(unreviewed), len(ids))
            if choice == "cancel":
                return False
            include_originals = choice == "originals"
            if not include_originals:
                ids = [i for i in ids if i not in set(unreviewed)]
        self._start(f"Exporting {plural(len(ids), 'episode')}…", len(ids))
        run_in_background(
            export_episodes, self.store, path, ids, include_originals=include_originals,
            on_progress=self._progress,
            on_result=lambda r: self._done("export", r, f"Exported {plural(r['samples'], 'sample') if 'samples' in r else plural(r['episodes'], 'episode')}"
                                           f"{', originals included,' if r['originals'] else ''} to {r['path']}"),
            on_error=lambda e: self._failed("export", e, "Export failed"),
        )
        return True

    def confirm_originals(self, n_unreviewed: int, n_total: int) -> str:
        """Ask before an export writes episodes the privacy review has not cleared: 'originals'
        (every episode as stored), 'reviewed' (leave those out) or 'cancel'."""
        rest = n_total - n_unreviewed
        box = QMessageBox(QMessageBox.Warning, "Export original recordings?",
                          f"{n_unreviewed} of {plural(n_total, 'episode')} {'has' if n_unreviewed == 1 else 'have'} "
                          f"no approved privacy review. Exporting {'it' if n_unreviewed == 1 else 'them'} writes the "
                          "original screenshots and text, personal data included.", QMessageBox.NoButton, self)
        box.setInformativeText("Export as recorded: every episode as stored, originals included."
                               + (f"\nLeave them out: the other {plural(rest, 'episode')}, redacted as a sync sends them."
                                  if rest else "") + "\nOr review them first: select one and choose Review privacy… below.")
        originals = box.addButton("Export as recorded", QMessageBox.DestructiveRole)
        reviewed = box.addButton("Leave them out", QMessageBox.AcceptRole) if rest else None
        box.setDefaultButton(box.addButton(QMessageBox.Cancel))
        box.exec()
        return {originals: "originals", reviewed: "reviewed"}.get(box.clickedButton(), "cancel")

    def _ask_import(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Import episodes", str(self.export_folder()), "Tandem bundles (*.zip);;Episode JSON (*.json *.jsonl);;All files (*)"
        )
        if path:
            self.import_from(path)

    def import_from(self, path) -> None:
        """Import a bundle (or episode JSON) in the background; emits taskFinished("import", ...)."""
        self._start(f"Importing {Path(path).name}…", 0)
        run_in_background(
            import_file, self.store, path,
            on_result=lambda r: self._done("import", r, f"Imported {plural(r['episodes'], 'episode')} ({r['replaced']} replaced)"),
            on_error=lambda e: self._failed("import", e, "Import failed"),
        )

    # ------------------------------------------------------------ background task plumbing
    def _start(self, label: str, total: int) -> None:
        self._busy = True
        self.progress.setRange(0, total)  # 0..0: busy without a known end
        self.progress.setValue(0)
        self.progress.setToolTip(label)
        self.progress.show()
        self._update_buttons()
        self._notify(label)

    def _progress(self, done: int, total: int) -> None:
        self.progress.setRange(0, total)
        self.progress.setValue(done)

    def _end(self) -> None:
        self._busy = False
        self.progress.hide()
        self._update_buttons()

    def _done(self, task: str, result, message: str) -> None:
        self._end()
        if task == "import":
            self.refresh()
        self._notify(message)
        self.taskFinished.emit(task, result)

    def _failed(self, task: str, exc: BaseException, title: str) -> None:
        self._end()
        self._error(title, str(exc) or type(exc).__name__)
        self.taskFinished.emit(task, exc)

    def _error(self, title: str, text: str) -> None:
        self._notify(f"{title}: {text}")
        box = QMessageBox(QMessageBox.Warning, title, text, QMessageBox.Ok, self)
        box.setAttribute(Qt.WA_DeleteOnClose)
        box.open()  # not exec(): the app keeps running while it is shown

    def _notify(self, text: str) -> None:
        if self.window_ is not None and hasattr(self.window_, "notify"):
            self.window_.notify(text)
