"""Open the Tandem window on a sample store (or --data DIR) with a click step selected, grab the
screen and save a PNG: for README images and to check by eye what the app looks like.

    QT_QPA_PLATFORM=xcb DISPLAY=:99 python packaging/screenshot_app.py /tmp/tandem.png

Prints one JSON line: the PNG path, the window's screen rectangle and where the selected click
is drawn on the screen (so a test can look for the marker in the grabbed pixels).
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _sample_screen(title: str, focus: str | None = None, text: str = "", w=1280, h=800) -> bytes:
    """A plausible desktop: a form window with fields and buttons, drawn with PIL."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (w, h), (58, 96, 138))
    d = ImageDraw.Draw(img)
    d.rectangle([0, h - 36, w, h], fill=(30, 32, 36))  # task bar
    d.text((16, h - 26), "Applications   Files   Terminal", fill=(220, 220, 220))
    x0, y0, x1, y1 = 240, 110, 1040, 660
    d.rectangle([x0 + 6, y0 + 6, x1 + 6, y1 + 6], fill=(35, 55, 80))  # shadow
    d.rectangle([x0, y0, x1, y1], fill=(246, 246, 248), outline=(120, 120, 130))
    d.rectangle([x0, y0, x1, y0 + 34], fill=(225, 227, 232))
    d.text((x0 + 14, y0 + 11), title, fill=(30, 30, 30))
    for i, label in enumerate(("Name", "Email", "Team")):
        y = y0 + 80 + i * 70
        d.text((x0 + 40, y + 8), label, fill=(40, 40, 40))
        box = [x0 + 140, y, x1 - 60, y + 34]
        d.rectangle(box, fill="white", outline=(70, 130, 220) if focus == label else (170, 170, 180), width=2 if focus == label else 1)
        if focus == label and text:
            d.text((box[0] + 10, y + 11), text, fill=(20, 20, 20))
    d.rectangle([x0 + 140, y0 + 300, x1 - 60, y0 + 420], outline=(170, 170, 180), fill="white")
    for k in range(5):
        d.text((x0 + 152, y0 + 310 + k * 20), f"Option {k + 1}", fill=(60, 60, 60))
    d.rectangle([x1 - 240, y1 - 70, x1 - 140, y1 - 36], fill=(225, 227, 232), outline=(150, 150, 160))
    d.text((x1 - 212, y1 - 60), "Cancel", fill=(30, 30, 30))
    d.rectangle([x1 - 130, y1 - 70, x1 - 30, y1 - 36], fill=(46, 110, 220))
    d.text((x1 - 102, y1 - 60), "Submit", fill="white")
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def build_sample_store(root) -> tuple[object, str]:
    """A store with a few episodes; returns (store, id of the richest one)."""
    from agent.schema import Action, Episode, Observation, Outcome, Provenance, ScreenGeometry, Step
    from agent.storage.store import Store

    store = Store(root)
    geo = ScreenGeometry.simple(1280, 800)
    W, H = 1280, 800

    def step(i, thought, action, screen, prov=None):
        h = store.put_blob(screen)
        return Step(i, Observation(h, W, H, geo, time=float(i)), thought, action, prov or Provenance("human"), float(i), i + 0.3)

    name = (520 / W, 207 / H)
    main = Episode("Fill in the sign-up form for Ada Lovelace and submit it", kind="supervised", producer="alice", policy_version="tandem-small-3")
    main.steps = [
        step(0, "The form is open. I click the Name field first.", Action("click", {"start_box": name}), _sample_screen("Sign up"),
             Provenance("agent", policy_version="tandem-small-3", decision="approve", decided_by="alice")),
        step(1, "Type the full name.", Action("type", {"content": "Ada Lovelace"}), _sample_screen("Sign up", "Name"),
             Provenance("agent", policy_version="tandem-small-3", decision="approve", decided_by="alice")),
        step(2, "Now the email field, just below.", Action("click", {"start_box": (540 / W, 275 / H)}), _sample_screen("Sign up", "Name", "Ada Lovelace"),
             Provenance("corrected", proposal_thought="Click the Team field.", proposal_action=Action("click", {"start_box": (540 / W, 345 / H)}),
                        policy_version="tandem-small-3", decision="edit", decided_by="alice")),
        step(3, "Scroll the options list to find the right team.", Action("scroll", {"start_box": (640 / W, 470 / H), "direction": "down"}), _sample_screen("Sign up", "Email")),
        step(4, "Drag the form window a little to the left.", Action("drag", {"start_box": (500 / W, 127 / H), "end_box": (380 / W, 127 / H)}), _sample_screen("Sign up")),
        step(5, "Submit the form.", Action("hotkey", {"key": "ctrl enter"}), _sample_screen("Sign up")),
        step(6, "The form was submitted.", Action("finished", {"content": "Signed up Ada Lovelace"}), _sample_screen("Done")),
    ]
    main.outcome = Outcome(True, 1.0, "annotator")
    main.route = "sft"
    store.save_episode(main)
    for k, (instr, kind, success, route) in enumerate([
        ("Rename the file report.txt to report-2024.txt", "recording", None, "unscored"),
        ("Open the settings and turn on dark mode", "autonomous", False, "ct"),
        ("Sort the table by date, newest first", "rollout", True, "sft"),
    ]):
        ep = Episode(instr, kind=kind, outcome=Outcome(success), route=route, created_at=time.time() - 3600 * (k + 1) * 7)
        ep.steps = [step(i, f"Step {i} of the task.", Action("click", {"start_box": (0.3 + 0.1 * i, 0.4)}), _sample_screen(instr[:40])) for i in range(2 + k)]
        store.save_episode(ep)
    return store, main.id


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="/tmp/tandem_main_window.png", help="PNG to write")
    ap.add_argument("--data", help="open this data directory instead of a fresh sample store")
    ap.add_argument("--size", default="1600x1000", help="window size WxH (default 1600x1000)")
    ap.add_argument("--step", type=int, default=2, help="step index to select (default 2, a corrected click)")
    args = ap.parse_args(argv)
    w, h = (int(v) for v in args.size.lower().split("x"))

    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication

    from agent.storage.store import Store
    from app.main_window import MainWindow

    app = QApplication(sys.argv[:1])
    app.setStyle("Fusion")
    tmp = None
    if args.data:
        store = Store(args.data)
        ids = store.episode_ids()
        if not ids:
            print(json.dumps({"error": f"no episodes in {args.data}"}))
            return 2
        episode_id = ids[-1]
    else:
        tmp = tempfile.TemporaryDirectory(prefix="tandem-sample-")
        store, episode_id = build_sample_store(tmp.name)

    win = MainWindow(store)
    win.setGeometry(0, 0, w, h)
    win.show()
    QTest.qWaitForWindowExposed(win, 5000)
    library = win.page("Library")
    library.select_episode(episode_id)
    library.viewer.select_step(args.step)
    for _ in range(20):  # let layouts settle and the screenshot paint
        app.processEvents()
        QTest.qWait(25)

    screen = app.primaryScreen()
    geo = win.frameGeometry()
    shot = screen.grabWindow(0, geo.x(), geo.y(), geo.width(), geo.height())
    if shot.isNull() or not shot.save(args.out, "PNG"):
        print(json.dumps({"error": f"could not grab the screen or write {args.out}"}))
        return 1
    result = {"png": args.out, "window": [geo.x(), geo.y(), geo.width(), geo.height()], "platform": app.platformName()}
    viewer = library.viewer
    step = viewer.current_step()
    if step is not None and "start_box" in step.action.args:
        local = viewer.canvas.point_to_widget(step.action.args["start_box"])
        from PySide6.QtCore import QPoint

        g = viewer.canvas.mapToGlobal(QPoint(round(local[0]), round(local[1])))
        result.update(action=step.action.name, click_screen=[g.x() - geo.x(), g.y() - geo.y()])
    print(json.dumps(result))
    win.close()
    store.close()
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
