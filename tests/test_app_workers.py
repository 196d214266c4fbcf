"""app.workers: the callable runs off the main thread; callbacks run on it."""
from __future__ import annotations

import threading

from app.workers import run_in_background


def test_result_and_progress_arrive_on_the_main_thread(qtbot):
    main = threading.get_ident()
    seen = {"progress": [], "result_thread": None, "ran_in": None}

    def work(n, progress):
        seen["ran_in"] = threading.get_ident()
        for i in range(n):
            progress(i + 1, n)
        return n * 2

    def on_progress(done, total):
        seen["progress"].append((done, total, threading.get_ident()))

    def on_result(v):
        seen["result"] = v
        seen["result_thread"] = threading.get_ident()

    done = []
    run_in_background(work, 3, on_result=on_result, on_progress=on_progress, on_finished=lambda: done.append(1))
    qtbot.waitUntil(lambda: bool(done), timeout=5000)
    assert seen["result"] == 6
    assert seen["ran_in"] != main
    assert seen["result_thread"] == main
    assert [(d, t) for d, t, _ in seen["progress"]] == [(1, 3), (2, 3), (3, 3)]
    assert {th for _, _, th in seen["progress"]} == {main}


def test_error_is_delivered_with_its_traceback(qtbot):
    got = []

    def boom():
        raise ValueError("bad value 42")

    results = []
    done = []
    run_in_background(boom, on_error=got.append, on_result=results.append, on_finished=lambda: done.append(1))
    qtbot.waitUntil(lambda: bool(done), timeout=5000)
    assert results == []
    assert isinstance(got[0], ValueError) and "bad value 42" in str(got[0])
    assert "boom" in got[0].__traceback_text__


def test_callable_without_progress_parameter_is_called_plainly(qtbot):
    got = []
    done = []
    run_in_background(sorted, [3, 1, 2], on_result=got.append, on_finished=lambda: done.append(1))
    qtbot.waitUntil(lambda: bool(done), timeout=5000)
    assert got == [[1, 2, 3]]
