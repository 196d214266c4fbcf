"""A person's first session with Tandem, scripted with real X input: the app as `python main.py`
opens it (embedded backend, its own data folder), driven by xdotool clicks and typing on an X
display (Xvfb), with a screenshot after every stage and a JSON report of what was checked.

    Xvfb :77 -screen 0 1920x1080x24 & DISPLAY=:77 QT_QPA_PLATFORM=xcb python packaging/walkthrough.py OUT_DIR

Stages: the empty Library; Record (a real terminal, typed commands, a note, Stop); review (a
thought edited and saved); export (the file dialog); Supervise two runs in a row of the default
model on a sandbox task (approve with Enter, then Stop); Drive with a risky step answered
Don't allow; Train one small flywheel iteration; the Library at the end against the store.
Each check is recorded, not asserted: the report lists every failure, so one run shows them all.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class Walk:
    def __init__(self, app, window, store, out: Path):
        self.app, self.window, self.store, self.out = app, window, store, out
        self.checks: list[dict] = []
        self.shots: list[str] = []

    # ------------------------------------------------------------ input and output
    def wait(self, ms: int = 300) -> None:
        # a real event loop: QTest.qWait keeps the GIL while it sleeps and starves the app's
        # worker threads (a model loading in the agent's thread took minutes instead of seconds)
        from PySide6.QtCore import QEventLoop, QTimer

        loop = QEventLoop()
        QTimer.singleShot(ms, loop.quit)
        loop.exec()

    def until(self, pred, timeout: float = 20.0, what: str = "") -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if pred():
                return True
            self.wait(100)
        self.check(False, f"timed out waiting for {what}")
        return False

    def centre(self, widget, rect=None):
        from PySide6.QtCore import QPoint

        r = rect if rect is not None else widget.rect()
        c = widget.mapToGlobal(QPoint(r.x() + r.width() // 2, r.y() + r.height() // 2))
        ratio = widget.devicePixelRatioF()
        return round(c.x() * ratio), round(c.y() * ratio)

    def click(self, widget, rect=None, settle: int = 400) -> None:
        x, y = self.centre(widget, rect)
        subprocess.run(["xdotool", "mousemove", str(x), str(y), "click", "1"], check=True)
        self.wait(settle)

    def click_at(self, x: int, y: int, settle: int = 400) -> None:
        subprocess.run(["xdotool", "mousemove", str(x), str(y), "click", "1"], check=True)
        self.wait(settle)

    def type(self, text: str) -> None:
        subprocess.run(["xdotool", "type", "--delay", "25", text], check=True)
        self.wait(200)

    def key(self, *keys: str) -> None:
        subprocess.run(["xdotool", "key", "--delay", "40", *keys], check=True)
        self.wait(300)

    def page(self, name: str):
        sidebar = self.window.sidebar
        row = [n for n, _ in self.window.pages_spec].index(name)
        self.click(sidebar.viewport(), sidebar.visualItemRect(sidebar.item(row)))
        self.check(self.window.stack.currentWidget() is self.window.page(name), f"the sidebar opens {name}")
        return self.window.page(name)

    def choose(self, combo, text: str) -> None:
        """Open a combo box with a click and pick an item by typing its first letters."""
        self.click(combo)
        self.type(text)
        self.key("Return")
        self.check(combo.currentText().startswith(text), f"picked {text!r} in a combo box (got {combo.currentText()!r})")

    def shot(self, name: str) -> None:
        import mss
        import mss.tools

        path = self.out / f"{len(self.shots) + 1:02d}-{name}.png"
        with mss.MSS() as sct:
            g = sct.grab(sct.monitors[1])
            mss.tools.to_png(g.rgb, g.size, output=str(path))
        self.shots.append(path.name)

    def check(self, ok: bool, what: str) -> bool:
        self.checks.append({"ok": bool(ok), "what": what})
        print(("ok    " if ok else "FAIL  ") + what, flush=True)
        return bool(ok)


def replay_file(folder: Path) -> Path:
    """Drive's scripted agent: a risky hotkey first (to be refused), then a click, then done."""
    from agent import coords
    from agent.grammar import format_normalized
    from agent.schema import Action

    lines = [
        format_normalized("Close this window.", [Action("hotkey", {"key": "ctrl w"})], coords.SMART_RESIZE, 1920, 1080),
        format_normalized("Click the middle of the screen instead.", [Action("click", {"start_box": (0.5, 0.5)})],
                          coords.SMART_RESIZE, 1920, 1080),
        format_normalized("Done.", [Action("finished", {"content": "done"})], coords.SMART_RESIZE, 1920, 1080),
    ]
    path = folder / "drive-responses.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in lines))
    return path


def walk(w: Walk, data: Path, tmp: Path) -> None:
    from PySide6.QtWidgets import QApplication, QFileDialog, QLineEdit, QMessageBox

    win, store = w.window, w.store
    library = w.page("Library")
    w.check("No episodes yet" in library.viewer.empty.text(), "the empty Library says what to do")
    w.shot("library-empty")

    # -- Record: a terminal as the task, the app on the side
    term = subprocess.Popen(["xterm", "-geometry", f"70x12+{win.frameGeometry().right() - 520}+420",
                             "-title", "walkthrough terminal"])
    w.wait(1500)
    record = w.page("Record")
    w.click(record.instruction)
    w.type("Say hello in the terminal")
    w.click(record.start_btn)
    w.until(lambda: record.state == "recording", what="the recording to start")
    term_xy = (win.frameGeometry().right() - 300, 500)
    w.click_at(*term_xy)
    # without a window manager a click does not move the keyboard focus: do what a WM would
    subprocess.run(["xdotool", "search", "--name", "walkthrough terminal", "windowfocus"], check=False)
    w.type("echo hello")
    w.key("Return")
    w.wait(800)
    w.click(record.note_btn)
    subprocess.run(["xdotool", "search", "--name", "^Note$", "windowfocus"], check=False)
    w.until(lambda: record.note_box is not None and record.note_box.isVisible(), what="the note box")
    w.click(record.note_box.edit)
    w.type("the greeting is printed, so I stop")
    w.key("Return")
    w.wait(400)
    w.shot("record-busy")
    w.click(record.stop_btn)
    w.until(lambda: record.state == "idle" and record.last_episode_id, timeout=30, what="the recording to stop")
    ep = store.load_episode(record.last_episode_id)
    names = [s.action.name for s in ep.steps]
    w.check(names[:2] == ["click", "type"] and "echo hello" in str(ep.steps[1].action.args),
            f"the recording holds the terminal's click and typing, and nothing of Tandem's own window: {names}")
    w.check(any("greeting is printed" in s.thought for s in ep.steps), "the typed note is a thought, not a type action")
    term.terminate()

    # -- review: opened in the Library, a thought edited and saved
    w.check(win.stack.currentWidget() is library and library.current_episode_id() == ep.id, "the recording opens for review")
    viewer = library.viewer
    w.click(viewer.thought)
    w.key("ctrl+a")
    w.type("Click into the terminal first")
    w.click(viewer.save_btn)
    w.check(store.load_episode(ep.id).steps[viewer.current_step().index].thought == "Click into the terminal first",
            "an edited thought is saved")
    w.shot("review")

    # -- export: the dialog opens in the data folder (it is modal: answered from a timer)
    target = tmp / "export" / "episodes.zip"
    target.parent.mkdir(parents=True, exist_ok=True)
    seen = {}

    def answer_dialog():
        from PySide6.QtCore import QTimer

        dialog = next((d for d in QApplication.topLevelWidgets() if isinstance(d, QFileDialog) and d.isVisible()), None)
        if dialog is None:
            QTimer.singleShot(300, answer_dialog)
            return
        seen["folder"] = dialog.directory().absolutePath()
        w.shot("export-dialog")
        w.click(dialog.findChild(QLineEdit))
        w.key("ctrl+a")
        w.type(str(target))
        w.key("Return")
        QTimer.singleShot(300, answer_originals)

    def answer_originals():
        # the recording has no privacy review: the export asks before writing its originals
        from PySide6.QtCore import QTimer

        box = next((d for d in QApplication.topLevelWidgets() if isinstance(d, QMessageBox) and d.isVisible()), None)
        if box is None:
            QTimer.singleShot(300, answer_originals)
            return
        seen["asked"] = box.text()
        w.shot("export-originals")
        w.click(next(b for b in box.buttons() if b.text() == "Export as recorded"))

    from PySide6.QtCore import QTimer

    QTimer.singleShot(800, answer_dialog)
    w.click(library.export_btn)
    w.key("Down")  # the first entry: a bundle (.zip) of the listed episodes
    w.key("Return")
    w.until(lambda: target.exists() and not library._busy, timeout=30, what="the export")
    w.check(str(data / "exports") == seen.get("folder"), f"the export dialog opened in <data>/exports ({seen.get('folder')})")
    w.check("no approved privacy review" in seen.get("asked", ""), f"the export asked before writing an unreviewed recording ({seen.get('asked', 'not asked')[:80]})")
    w.check(target.exists() and target.stat().st_size > 1000, "the bundle was written")
    w.shot("export-done")

    # -- Supervise: two runs in a row of the default model on a sandbox task
    sup = w.page("Supervise")
    f = sup.form
    w.choose(f.policy, "Default")
    w.choose(f.executor, "A sandbox")
    w.shot("supervise-form")
    for run_no in (1, 2):
        w.check(sup.start_btn.isEnabled(), f"Start run is enabled before run {run_no}")
        w.click(sup.start_btn)
        approved = 0
        while w.until(lambda: sup.panel.pending is not None or (sup.run is not None and not sup.run.running),
                      timeout=60, what="a proposal"):
            if sup.panel.pending is None:
                break
            if approved == 1 and run_no == 1:
                w.shot("supervise-proposal")
            if run_no == 2 and approved == 1:
                w.click(sup.stop_btn)  # the second run is stopped by the supervisor
                break
            w.click(sup.panel.approve_btn)
            approved += 1
            if approved >= 6:
                w.click(sup.stop_btn)
                break
        w.until(lambda: sup.run is None or not sup.run.running, timeout=30, what=f"run {run_no} to end")
        w.wait(800)
        w.check(sup.start_btn.isEnabled() and not sup.stop_btn.isEnabled(),
                f"after run {run_no}: Start run back, Stop greyed")
        w.shot(f"supervise-run{run_no}-ended")

    # -- Drive: a risky step answered Don't allow
    drive = w.page("Drive")
    f = drive.form
    w.choose(f.policy, "Replay")
    f.replay_path.setText(str(replay_file(tmp)))  # a path typed into a field: not what this walk checks
    w.choose(f.gate, "Ask before risky")
    w.click(f.instruction)
    w.type("Tidy the desktop")
    w.click(drive.start_btn)
    w.until(lambda: drive.dialog is not None and drive.dialog.isVisible(), timeout=30, what="the risky-step question")
    w.shot("drive-risky-question")
    if drive.dialog is not None:
        w.click(drive.dialog.buttons["Don't allow"])
    w.until(lambda: drive.last_result is not None, timeout=30, what="the Drive run to end")
    w.check(win.isVisible(), "the app is still open after the risky-step answer")
    res = drive.last_result
    if res is not None:
        dep = store.load_episode(res.episode.id)
        w.check(res.reason == "finished" and dep.steps[0].info.get("rejections"), f"Drive ended '{res.reason}' with the refusal kept")
    w.shot("drive-ended")

    # -- Train: one small iteration
    train = w.page("Train")
    from agent.storage.store import Store

    w.check(train.data_dir == data / "backend" and "synced to this app's backend" in train.where.text(),
            f"the Train page says it trains on what was synced: {train.where.text()!r}")
    with Store(train.data_dir) as trained:  # a small iteration: the settings live in the store it trains on
        trained.set_setting("flywheel.config", {"families": ["click_button"], "eval_episodes": 2, "rollouts": 2,
                                                "ct_steps": 2, "sft_steps": 4, "batch": 4, "ppo_updates": 1,
                                                "ppo_batch": 4, "max_steps": 3})
    w.until(lambda: train.status is not None, timeout=60, what="the Train page's state")
    w.check("shipped default model" in train.summary.text(), f"before a run it says what it starts from: {train.summary.text()!r}")
    w.shot("train-before")
    w.click(train.run_btn)
    said = set()  # every line the page showed while the iteration ran

    def watch(stop):
        said.add(train.message.text())
        return stop()

    w.until(lambda: watch(lambda: train.message.text().startswith("Stage") or train.running is None), timeout=120,
            what="the first stage")
    w.shot("train-busy")
    w.until(lambda: watch(lambda: train.running is None), timeout=900, what="the iteration to finish")
    stages = sorted(t for t in said if t.startswith("Stage"))
    w.check(len({t.split(":")[0] for t in stages}) >= 3 and all("elapsed" in t for t in stages),
            f"a running iteration names its stages: {stages}")
    w.wait(1500)
    w.check(train.message.text().startswith("Iteration 1 finished"), f"the result line: {train.message.text()!r}")
    w.shot("train-done")

    # -- the Library at the end: everything in the store is listed
    library = w.page("Library")
    w.wait(1500)
    w.check(library.proxy.rowCount() == len(store.episode_ids()),
            f"the Library lists every episode ({library.proxy.rowCount()} of {len(store.episode_ids())})")
    w.shot("library-end")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder for the screenshots and report.json")
    ap.add_argument("--size", default=None, help="window size WxH (default: maximized to the screen)")
    args = ap.parse_args(argv)
    if not shutil.which("xdotool") or not os.environ.get("DISPLAY"):
        print("needs xdotool and an X display (DISPLAY)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from agent.storage.store import Store
    from app.main_window import MainWindow

    app = QApplication(sys.argv[:1])
    app.setApplicationName("Tandem-walkthrough")
    app.setStyle("Fusion")
    app.setQuitOnLastWindowClosed(False)
    tmp = Path(tempfile.mkdtemp(prefix="tandem-walk-"))
    data = tmp / "data"
    store = Store(data)
    window = MainWindow(store, settings=QSettings(str(tmp / "settings.ini"), QSettings.IniFormat))
    window.start_sync()
    if args.size:
        wd, ht = (int(v) for v in args.size.lower().split("x"))
        window.setGeometry(0, 0, wd, ht)
        window.show()
    else:  # maximized (by hand: without a window manager showMaximized does nothing)
        window.setGeometry(app.primaryScreen().availableGeometry())
        window.show()
    w = Walk(app, window, store, out)
    w.wait(1500)
    try:
        walk(w, data, tmp)
    except Exception as e:  # the report says where the walk broke
        import traceback

        w.check(False, f"the walk broke: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        w.shot("broken")
    (out / "report.json").write_text(json.dumps({"checks": w.checks, "shots": w.shots,
                                                  "failed": sum(not c["ok"] for c in w.checks)}, indent=1))
    for p in window.pages.values():
        if hasattr(p, "shutdown"):
            p.shutdown()
    window.stop_sync()
    store.close()
    print(f"{sum(c['ok'] for c in w.checks)} of {len(w.checks)} checks passed; screenshots in {out}")
    return 0 if all(c["ok"] for c in w.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
