"""Latency from a proposal to its display in the Supervise page, p50/p99 (target: <= 100 ms on
the same machine, <= 200 ms through the backend on loopback).

Same machine: the loop's thread calls QtSupervisor.decide(); the clock stops when the
ProposalPanel has painted the screenshot with the action. Loopback: RemoteSupervisor.decide()
on the agent's thread (JPEG encode, proposal + blob frames to a real backend, fan-out to a
subscribed supervisor's Supervise page, decode, paint). Screenshots: a 1920x1080 UI frame (a
rendered app window) and a 320x240 sandbox frame.

    python tests/bench/bench_supervise.py [--n 200]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def ui_frame(width: int, height: int):
    """A realistic screenshot: the app's own window rendered at that size (BGR, as mss gives)."""
    import numpy as np

    from agent.executors.base import Frame
    from agent.schema import ScreenGeometry
    from agent.storage.store import Store
    from app.main_window import MainWindow

    with tempfile.TemporaryDirectory() as d:
        store = Store(d)
        w = MainWindow(store)
        w.resize(width, height)
        w.show_page_at(0)
        from PySide6.QtGui import QImage

        img = w.grab().toImage().convertToFormat(QImage.Format_RGB888)
        raw = bytes(img.constBits())  # a copy: the QImage is gone after this block
        arr = np.frombuffer(raw, np.uint8).reshape(img.height(), img.bytesPerLine())[:, : img.width() * 3]
        px = np.ascontiguousarray(arr.reshape(img.height(), img.width(), 3)[:, :, ::-1])
        del img
        w.close()
        w.deleteLater()
        store.close()
    return Frame(geometry=ScreenGeometry.simple(width, height), pixels=px, bgr=True)


def request_for(frame, i: int):
    from agent.policies.base import Proposal
    from agent.run.gate import GateRequest
    from agent.schema import Action

    p = Proposal(f"Step {i}: click the button.", [Action("click", {"start_box": (0.3 + 0.001 * (i % 100), 0.4)})], "raw",
                 image_size=frame.size)
    return GateRequest("bench", i, p, frame, "every step is reviewed")


def run_local(app, frame, n: int) -> list[float]:
    from app.proposal_panel import ProposalPanel
    from app.qt_supervisor import QtSupervisor

    panel = ProposalPanel("bench")
    panel.resize(1600, 1000)
    panel.show()
    sup = QtSupervisor("bench")
    sup.asked.connect(panel.show_pending)
    lat = []
    panel.displayed.connect(lambda p, t: lat.append(t - p.asked_at))
    panel.answered.connect(lambda p, v: sup.answer(p, v))
    panel.displayed.connect(lambda p, t: panel.approve())
    done = threading.Event()

    def agent():
        for i in range(n):
            fresh = frame.__class__(geometry=frame.geometry, pixels=frame.pixels, bgr=frame.bgr)  # no cached encodings
            assert sup.decide(request_for(fresh, i)).kind == "approve"
        done.set()

    threading.Thread(target=agent, daemon=True).start()
    while not done.is_set():
        app.processEvents()
        time.sleep(0.0005)
    panel.close()
    return lat


def run_loopback(app, frame, n: int) -> list[float]:
    from agent.storage.store import Store
    from agent.sync.live_link import RunPublisher
    from app.supervise_view import SupervisePage
    from trainer.backend.server_thread import start_in_thread

    d = tempfile.mkdtemp()
    b = start_in_thread(Path(d) / "backend")
    ta, ts = b.store.add_user("robot", "annotator"), b.store.add_user("sup", "supervisor")
    pub = RunPublisher(b.url, ta).start()
    store = Store(Path(d) / "sup")
    page = SupervisePage(store, name="sup")
    page.resize(1600, 1000)
    page.show()
    page.watch(b.url, ts, pub.run_id)
    page.claim()
    started: dict[int, float] = {}
    lat = []

    def shown(p, t):
        lat.append(t - started[p.request.step_index])
        page.panel.approve()

    page.panel.displayed.connect(shown)
    done = threading.Event()

    def agent():
        for i in range(n):
            fresh = frame.__class__(geometry=frame.geometry, pixels=frame.pixels, bgr=frame.bgr)
            started[i] = time.perf_counter()
            assert pub.supervisor.decide(request_for(fresh, i)).kind == "approve"
        done.set()

    while page.claimed_by != "sup":
        app.processEvents()
    threading.Thread(target=agent, daemon=True).start()
    while not done.is_set():
        app.processEvents()
        time.sleep(0.0005)
    page.shutdown()
    pub.end("bench over")
    b.stop()
    store.close()
    return lat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(["bench"])
    frames = {"1920x1080 UI": ui_frame(1920, 1080), "320x240 sandbox": ui_frame(320, 240)}
    print(f"proposal -> display latency, {args.n} proposals each (ms)")
    print(f"{'path':<22}{'screenshot':<18}{'p50':>8}{'p99':>8}{'max':>8}{'mean':>8}")
    for path, fn in (("same machine", run_local), ("backend on loopback", run_loopback)):
        for name, frame in frames.items():
            fn(app, frame, 5)  # warm up: fonts, first paint, connections
            lat = [x * 1000 for x in fn(app, frame, args.n)]
            print(f"{path:<22}{name:<18}{statistics.median(lat):>8.1f}{statistics.quantiles(lat, n=100, method='inclusive')[98]:>8.1f}{max(lat):>8.1f}{statistics.fmean(lat):>8.1f}")


if __name__ == "__main__":
    main()
