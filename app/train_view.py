"""The Train page: the data flywheel at a glance and a button that turns it once. It trains on
the store of the backend built into the app (what was synced to it) while that backend runs,
else on the app's own store, and says which.

  - the data pools (SFT, CT, rejected) and how much each iteration added, beside held-out
    success by iteration (a matplotlib canvas);
  - the model versions with their evaluation per family, lineage and status (a table);
  - the training curves (reward, entropy, success rate, SFT loss) from <data>/flywheel/metrics.jsonl;
  - "Run iteration": `python main.py flywheel run --iterations 1 --progress-json` as a child
    process, watched from a background worker; its JSON progress lines drive the progress bar
    and the live numbers (step 3/100 · loss 2.314; PPO's reward, entropy, success), and the
    training curves are redrawn from the metrics file while a training stage runs;
  - before a run, a warning when the SFT data is too small to learn from (the run stays allowed).

The app talks to the trainer only as a process (see DESIGN.md): state comes from
`flywheel status --json`. The one trainer import is the pools chart's drawing function (pure
matplotlib, no model), so this page and the flywheel's PNG draw the same thing.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.workers import run_in_background
from trainer.flywheel.plots import draw_growth

MAIN = Path(__file__).resolve().parents[1] / "main.py"
CURVES = (("ppo", "reward"), ("ppo", "entropy"), ("ppo", "success_rate"), ("sft", "loss"))
TRAINING_STAGES = ("ct", "sft", "dpo", "ppo")  # the stages that write metrics rows as they go


def flywheel_command(data_dir, *args) -> list[str]:
    program = [sys.executable] if getattr(sys, "frozen", False) else [sys.executable, str(MAIN)]  # a bundle: tandem itself
    return [*program, "flywheel", *args, "--data", str(data_dir)]


def read_status(data_dir) -> dict:
    """`flywheel status --json` of the data directory (run as a process)."""
    p = subprocess.run(flywheel_command(data_dir, "status", "--json"), capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"flywheel status failed: {p.stderr.strip()[-500:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def read_curves(data_dir) -> dict:
    """{(phase, key): [(step, value)]} from the flywheel's metrics file; bad lines are skipped."""
    path = Path(data_dir) / "flywheel" / "metrics.jsonl"
    out: dict = {c: [] for c in CURVES}
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        for phase, key in CURVES:
            if r.get("phase") == phase and isinstance(r.get(key), (int, float)):
                out[(phase, key)].append((r["step"], r[key]))
    return out


class IterationRun:
    """One `flywheel run` child process; `run(progress)` blocks until it ends (call it in a worker)."""

    def __init__(self, data_dir, iterations: int = 1, announce_to: tuple[str, str] | None = None):
        self.cmd = flywheel_command(data_dir, "run", "--iterations", str(iterations), "--progress-json")
        self.env = None
        if announce_to is not None:  # the token goes by environment, not argv (ps shows argv)
            import os

            self.env = {**os.environ, "TANDEM_BACKEND_URL": announce_to[0], "TANDEM_BACKEND_TOKEN": announce_to[1]}
        self.proc: subprocess.Popen | None = None
        self.stopped = False
        self.stage_text = "starting the trainer"  # what the iteration is doing now, in words
        self.stage = ""  # its stage's name (STAGES of trainer.flywheel.iteration)

    def run(self, progress=None) -> dict:
        import tempfile

        # stderr to a file: a pipe nobody reads while stdout is followed could fill and stall the child
        with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errf:
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=errf, text=True, env=self.env)
            result = None
            for line in self.proc.stdout:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue  # library chatter on stdout
                if not isinstance(msg, dict):
                    continue
                if "result" in msg:
                    result = msg["result"]
                elif progress and "done" in msg:
                    self.stage_text, self.stage = _stage_line(msg), msg.get("stage") or ""
                    progress((msg["iteration"] - 1) * 100 + msg["done"], 100 * msg["of"], self.stage_text)
            rc = self.proc.wait()
            errf.seek(0)
            err = errf.read()
        if self.stopped:
            raise RuntimeError("stopped")
        if rc != 0 or result is None:
            tail = "\n".join(err.strip().splitlines()[-8:])
            raise RuntimeError(f"the iteration failed (exit status {rc}):\n{tail}")
        return result

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stopped = True
            self.proc.terminate()


def _stage_line(msg: dict) -> str:
    """'Stage 5 of 8: fine-tuning on the SFT pool (step 40/100 · loss 2.314)' from a progress line."""
    text = msg.get("text") or msg.get("stage") or "working"
    head = f"Stage {msg['stage_index']} of {msg['stages']}: " if msg.get("stage_index") and msg.get("stages") else ""
    detail = msg.get("detail") or ""
    return head + text + (f" ({detail})" if detail and detail != "done" else "")


class TrainPage(QWidget):
    def __init__(self, store, window=None):
        from matplotlib.backends.backend_qtagg import FigureCanvasQTAgg
        from matplotlib.figure import Figure

        super().__init__()
        self.store, self.window = store, window
        self.status: dict | None = None
        self.running: IterationRun | None = None
        self._refreshed_at = 0.0

        title = QLabel("Train")
        title.setObjectName("title")
        self.summary = QLabel("Loading the flywheel's state…")
        self.summary.setObjectName("muted")
        self.summary.setWordWrap(True)
        self.run_btn = QPushButton("Run iteration")
        self.run_btn.setToolTip("Score and route new data, train CT → SFT → PPO, evaluate, promote if better")
        self.run_btn.clicked.connect(self.run_iteration)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setEnabled(False)
        self.stop_btn.clicked.connect(self.stop_iteration)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setValue(0)
        self.message = QLabel("")
        self.message.setWordWrap(True)
        self.where = QLabel()  # which store the flywheel trains on, said on the page
        self.where.setObjectName("muted")
        self.where.setWordWrap(True)
        self.warning = QLabel()  # said before a run, not discovered from a model that memorized
        self.warning.setObjectName("error")
        self.warning.setWordWrap(True)
        self.warning.hide()
        self._started_at = 0.0
        self._curves_at, self._curves_stage = 0.0, ""  # the curves' last redraw during a run
        top = QHBoxLayout()
        top.addWidget(title)
        top.addWidget(self.summary, 1)
        top.addWidget(self.progress)
        top.addWidget(self.run_btn)
        top.addWidget(self.stop_btn)

        self.pool_fig = Figure(figsize=(7, 2.6), tight_layout=True)
        self.pool_canvas = FigureCanvasQTAgg(self.pool_fig)
        self.curve_fig = Figure(figsize=(7, 2.4), tight_layout=True)
        self.curve_canvas = FigureCanvasQTAgg(self.curve_fig)
        self.table = QTableWidget(0, 0)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.setSelectionBehavior(QTableWidget.SelectRows)
        self.table.verticalHeader().setVisible(False)

        split = QSplitter(Qt.Vertical)
        split.addWidget(self.pool_canvas)
        # the last routing: each episode, where it went and the rule that sent it there
        self.routing = QTableWidget(0, 3)
        self.routing.setHorizontalHeaderLabels(["episode", "route", "why"])
        self.routing.setEditTriggers(QTableWidget.NoEditTriggers)
        self.routing.verticalHeader().setVisible(False)
        self.routing.horizontalHeader().setStretchLastSection(True)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.table, "Model versions")
        self.tabs.addTab(self.routing, "Routing")
        split.addWidget(self.tabs)
        split.addWidget(self.curve_canvas)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.where)
        layout.addWidget(self.warning)
        layout.addWidget(self.message)
        layout.addWidget(split, 1)
        self.refresh()

    # ------------------------------------------------------------ state
    def showEvent(self, event) -> None:
        """Opened again: episodes may have been recorded or synced since (the pools changed)."""
        super().showEvent(event)
        if self.running is None and time.monotonic() - self._refreshed_at > 5.0:
            self.refresh()

    @property
    def data_dir(self):
        """The store the flywheel trains on: with the backend built into this app, the episodes
        synced to it (what annotators and supervisors submitted); else this app's own store."""
        pick = getattr(self.window, "training_data_dir", None)
        return pick() if callable(pick) else self.store.root

    def _say_where(self) -> None:
        d = self.data_dir
        if d != self.store.root:
            self.where.setText(f"Trains on the episodes synced to this app's backend ({d}): submit recordings on the "
                               "Sync page to include them.")
        else:
            self.where.setText(f"Trains on this app's own store ({d}).")

    def refresh(self) -> None:
        """Read the state in a worker (a child process), then redraw on the main thread."""
        self._refreshed_at = time.monotonic()
        self._say_where()
        run_in_background(read_status, self.data_dir, on_result=self.show_status,
                          on_error=lambda e: self.summary.setText(f"Could not read the flywheel's state: {e}"))

    def show_status(self, status: dict) -> None:
        self.status = status
        pools, cur = status["pools"], status["current"]
        model = cur or f"none yet; the first iteration starts from {status.get('first_model') or 'a new model'}"
        self.summary.setText(f"SFT {pools['sft']} · CT {pools['ct']} · rejected {pools['rejected']} · "
                             f"unscored {pools['unscored']} episodes — current model: {model}")
        self.summary.setToolTip(f"Trains on the episodes in {status.get('store') or self.data_dir}")
        self.warning.setText(status.get("warning") or "")
        self.warning.setVisible(bool(status.get("warning")))
        self._fill_table(status["versions"], cur)
        self._fill_routing(status.get("routing") or {})
        self._draw_pools(status)
        self._draw_curves(read_curves(self.data_dir))

    def _fill_table(self, versions: list, current) -> None:
        fams = sorted({f for v in versions for f in (v["metrics"].get("families") or {})})
        cols = ["version", "iteration", "status", "parent", "held-out success", "gain vs parent"] + fams + ["decision"]
        self.table.clear()
        self.table.setColumnCount(len(cols))
        self.table.setHorizontalHeaderLabels(cols)
        self.table.setRowCount(len(versions))
        for row, v in enumerate(versions):
            m = v["metrics"]
            ev, cmp_ = v.get("eval"), v.get("comparison")
            cells = [v["version"], str(v["iteration"]), v["status"] + (" ★" if v["version"] == current else ""),
                     v["parent"] or "",
                     f"{_pct(ev['success'])} [{_pct(ev['ci95'][0])}, {_pct(ev['ci95'][1])}] n={ev['episodes']}" if ev else "–",
                     f"{_signed(cmp_['diff'])} [{_signed(cmp_['ci95'][0])}, {_signed(cmp_['ci95'][1])}]" if cmp_ else "–"]
            cells += [_pct((m.get("families") or {}).get(f, {}).get("success")) for f in fams]
            cells.append(v.get("decision") or v.get("note") or "")
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(json.dumps(v["lineage"].get("parents", [])) if col == 3 else text)
                self.table.setItem(row, col, item)
        self.table.resizeColumnsToContents()

    def _fill_routing(self, routing: dict) -> None:
        rows = routing.get("decisions") or []
        self.tabs.setTabText(1, f"Routing (iteration {routing['iteration']})" if routing.get("iteration") else "Routing")
        self.routing.setRowCount(len(rows))
        for r, d in enumerate(rows):
            why = d.get("why") or []
            for c, text in enumerate((d.get("instruction") or d["episode_id"], d["route"], why[0] if why else "")):
                item = QTableWidgetItem(text)
                item.setToolTip("\n".join(why[:12]) if c == 2 else text)
                self.routing.setItem(r, c, item)
        self.routing.resizeColumnToContents(1)
        self.routing.setColumnWidth(0, min(360, max(160, self.routing.sizeHintForColumn(0))))

    def _draw_pools(self, status: dict) -> None:
        self.pool_fig.clear()
        ax1, ax2 = self.pool_fig.subplots(1, 2)
        draw_growth(ax1, status["growth"])
        ev = [v for v in status["versions"] if v["metrics"].get("mean_success") is not None]
        if not ev:
            ax2.text(0.5, 0.5, "no model evaluated yet", transform=ax2.transAxes, ha="center", va="center",
                     fontsize=8, color="#868e96")
        ax2.plot([v["iteration"] for v in ev], [v["metrics"]["mean_success"] for v in ev], "o-", color="black")
        for v in ev:
            if v["status"] == "rejected":
                ax2.plot(v["iteration"], v["metrics"]["mean_success"], "x", color="#c92a2a")
        from matplotlib.ticker import MaxNLocator

        ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
        if not ev:
            ax2.set_xticks([])  # no made-up iteration axis
        ax2.set_ylim(-0.02, 1.02)
        ax2.set_title("held-out success by version (× rejected)", fontsize=9)
        ax2.set_xlabel("iteration", fontsize=8)
        self.pool_canvas.draw_idle()

    def _draw_curves(self, curves: dict) -> None:
        self.curve_fig.clear()
        axes = self.curve_fig.subplots(1, len(CURVES))
        from matplotlib.ticker import MaxNLocator

        for ax, key in zip(axes, CURVES, strict=True):
            pts = curves.get(key) or []
            ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1, marker="." if len(pts) < 20 else None)
            if len(pts) == 1:  # one update: a dot with room around it, not a ±0.04 axis
                ax.set_xlim(pts[0][0] - 1, pts[0][0] + 1)
            ax.set_title(f"{key[0]} {key[1]}", fontsize=8)
            ax.tick_params(labelsize=6)
            if pts:  # few ticks: four charts side by side stay readable at 1024 px
                ax.xaxis.set_major_locator(MaxNLocator(nbins=3, integer=True))
                ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
            else:  # not an empty plot with made-up axes
                ax.set_xticks([])
                ax.set_yticks([])
                ax.text(0.5, 0.5, "no data yet", transform=ax.transAxes, ha="center", va="center", fontsize=8,
                        color="#868e96")
        self.curve_canvas.draw_idle()

    # ------------------------------------------------------------ running
    def run_iteration(self) -> None:
        if self.running is not None:
            return
        target = getattr(self.window, "announce_target", None)
        self._say_where()
        self.running = IterationRun(self.data_dir, 1, announce_to=target() if target else None)
        self.run_btn.setEnabled(False)
        self.stop_btn.setEnabled(True)
        self.progress.setValue(0)
        self._started_at = time.monotonic()
        self.message.setText("Starting the trainer…")
        run_in_background(self.running.run, on_progress=self._on_progress, on_result=self._on_done,
                          on_error=self._on_error, on_finished=self._on_finished)

    def stop_iteration(self) -> None:
        if self.running is not None:
            self.running.stop()

    def _on_progress(self, done: int, total: int, text: str = "") -> None:
        self.progress.setValue(int(100 * done / max(1, total)))
        if self.running is not None:
            m, sec = divmod(int(time.monotonic() - self._started_at), 60)
            self.message.setText(f"{text or self.running.stage_text} · {m}:{sec:02d} elapsed")
            # the curves follow a training stage's rows: redrawn when a stage begins (the last one's
            # rows complete), else at most every 2 s (a redraw costs ~0.1 s)
            stage = self.running.stage
            if stage in TRAINING_STAGES and (stage != self._curves_stage or time.monotonic() - self._curves_at > 2.0):
                self._curves_at, self._curves_stage = time.monotonic(), stage
                self._draw_curves(read_curves(self.data_dir))

    def _on_done(self, result: dict) -> None:
        self.progress.setValue(100)
        verdict = "promoted" if result["promoted"] else "not promoted"
        m, sec = divmod(int(result.get("seconds") or 0), 60)
        decision = result.get("decision") or verdict
        self.message.setText(f"Iteration {result['iteration']} finished in {m}:{sec:02d}: {result['candidate']} {decision}"
                             + ("" if decision.endswith(".") else "."))
        if self.window is not None and hasattr(self.window, "notify"):
            self.window.notify(f"Flywheel iteration {result['iteration']} finished: {verdict}")

    def _on_error(self, exc) -> None:
        self.message.setText(f"The iteration did not finish: {exc}")

    def _on_finished(self) -> None:
        self.running = None
        self.run_btn.setEnabled(True)
        self.stop_btn.setEnabled(False)
        self.refresh()


def _signed(v) -> str:
    """A difference of two rates in percentage points: '+3.5'."""
    return f"{100 * v:+.1f}"


def _pct(v) -> str:
    return "–" if v is None else f"{100 * v:.0f}%"
