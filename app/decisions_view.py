"""A session's decisions at a glance: approval rate, edits and rejections by action type, time
per decision. The numbers come from agent.run.decision_stats (pure, tested without Qt)."""
from __future__ import annotations

from PySide6.QtWidgets import QCheckBox, QHeaderView, QLabel, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from agent.run.decision_stats import decision_stats
from agent.wording import plural


class DecisionsView(QWidget):
    def __init__(self, store, parent=None):
        super().__init__(parent)
        self.store = store
        self.session_ids: list[str] = []  # episodes supervised in this session, in order
        self.live: dict = {}  # id -> the running loop's own episode: its decisions count as they are made
        self.stats = None
        self.all_box = QCheckBox("All supervised episodes in the store")
        self.all_box.toggled.connect(self.refresh)
        self.summary = QLabel("No decisions yet.")
        self.summary.setWordWrap(True)
        self.table = QTableWidget(0, 2)
        self.table.setHorizontalHeaderLabels(["", ""])
        self.table.horizontalHeader().setVisible(False)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        self.table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeToContents)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.summary)
        lay.addWidget(self.table, 1)
        lay.addWidget(self.all_box)

    def add_episode(self, episode_id: str) -> None:
        """A run of this session that ended (finished, failed or stopped): counted as stored."""
        self.live.pop(episode_id, None)
        if episode_id not in self.session_ids:
            self.session_ids.append(episode_id)
        self.refresh()

    def follow(self, episode) -> None:
        """A run still going (the loop's episode, which its decision log appends to): counted now."""
        self.live[episode.id] = episode
        if episode.id not in self.session_ids:
            self.session_ids.append(episode.id)
        self.refresh()

    def episodes(self):
        ids = [e.id for e in self.store.list_episodes(kind="supervised")] if self.all_box.isChecked() else self.session_ids
        out = []
        ids += [eid for eid in self.live if eid not in ids]  # a running one is stored only from its first step
        for eid in ids:
            if eid in self.live:
                out.append(self.live[eid])
            elif self.store.has_episode(eid):
                out.append(self.store.load_episode(eid))
        return out

    def refresh(self, *_) -> None:
        self.stats = s = decision_stats(self.episodes())
        rate = s.approval_rate
        self.summary.setText("No decisions yet." if not s.decisions else
                             f"{plural(s.decisions, 'decision')} over {plural(s.episodes, 'run')}; "
                             f"{s.counts.get('approve', 0)} of {plural(s.judged, 'proposal')} answered approved as "
                             f"proposed ({'–' if rate is None else f'{100 * rate:.0f}%'}).")
        rows = s.rows()
        self.table.setRowCount(len(rows))
        for i, (k, v) in enumerate(rows):
            self.table.setItem(i, 0, QTableWidgetItem(k))
            self.table.setItem(i, 1, QTableWidgetItem(v))
