"""Run a blocking call off the Qt main thread and get its outcome back on the main thread.

    run_in_background(export_jsonl, store, path, ids,
                      on_result=..., on_error=..., on_progress=...)

The callable runs in a QThreadPool. If it has a parameter named `progress`, it is given a
thread-safe `progress(done, total)` function. Callbacks are invoked on the main thread only:
the signals object lives there and its slots call them, so a signal emitted in the worker thread
reaches them through a queued connection (widgets are never touched from a worker).
"""
from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal, Slot

# Signals objects of running workers; without a Python reference they could be collected
# before their queued signals are delivered.
_live: set[WorkerSignals] = set()


class WorkerSignals(QObject):
    """Typed signals of one background call. Create it on the main thread."""

    result = Signal(object)  # the callable's return value
    error = Signal(object)  # the exception it raised (with __traceback_text__ set)
    progress = Signal(int, int, str)  # done, total, what is being done ("" when the callable does not say)
    finished = Signal()  # after result or error, always

    def __init__(self, on_result=None, on_error=None, on_progress=None, on_finished=None):
        super().__init__()
        self._on_result, self._on_error = on_result, on_error
        self._on_progress, self._on_finished = on_progress, on_finished
        self._progress_text = on_progress is not None and _positional(on_progress) >= 3
        # Connected to this object's own slots: the receiver lives on the main thread, so Qt
        # queues emissions from the worker thread onto it.
        self.result.connect(self._deliver_result)
        self.error.connect(self._deliver_error)
        self.progress.connect(self._deliver_progress)
        self.finished.connect(self._deliver_finished)

    @Slot(object)
    def _deliver_result(self, value):
        if self._on_result:
            self._on_result(value)

    @Slot(object)
    def _deliver_error(self, exc):
        if self._on_error:
            self._on_error(exc)

    @Slot(int, int, str)
    def _deliver_progress(self, done, total, text):
        if self._on_progress:
            if self._progress_text:  # the text travels with its numbers: never a later stage's words
                self._on_progress(done, total, text)
            else:
                self._on_progress(done, total)

    @Slot()
    def _deliver_finished(self):
        try:
            if self._on_finished:
                self._on_finished()
        finally:
            _live.discard(self)


def _positional(fn: Callable) -> int:
    try:
        return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return 2


def _wants_progress(fn: Callable) -> bool:
    try:
        return "progress" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False


class Worker(QRunnable):
    def __init__(self, fn: Callable, args: tuple, kwargs: dict, signals: WorkerSignals):
        super().__init__()
        self.fn, self.args, self.kwargs, self.signals = fn, args, kwargs, signals
        self.setAutoDelete(True)

    def run(self) -> None:
        kwargs = dict(self.kwargs)
        if _wants_progress(self.fn) and "progress" not in kwargs:
            kwargs["progress"] = lambda done, total, text="": self.signals.progress.emit(int(done), int(total), str(text))
        try:
            value = self.fn(*self.args, **kwargs)
        except Exception as e:  # reported to the caller, never lost in the pool
            e.__traceback_text__ = traceback.format_exc()
            self.signals.error.emit(e)
        else:
            self.signals.result.emit(value)
        finally:
            self.signals.finished.emit()


def run_in_background(
    fn: Callable[..., Any],
    *args,
    on_result: Callable[[Any], None] | None = None,
    on_error: Callable[[BaseException], None] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    on_finished: Callable[[], None] | None = None,
    pool: QThreadPool | None = None,
    **kwargs,
) -> WorkerSignals:
    """Start fn(*args, **kwargs) in a worker thread; returns its signals (already connected
    to the callbacks). Call from the main thread. Use the callbacks to learn the outcome: a
    fast call may emit before anything connected to the returned signals afterwards."""
    signals = WorkerSignals(on_result, on_error, on_progress, on_finished)
    _live.add(signals)
    (pool or QThreadPool.globalInstance()).start(Worker(fn, args, kwargs, signals))
    return signals


def wait_for_workers(timeout_ms: int = 30000, pool: QThreadPool | None = None) -> bool:
    """Block until running workers finish (used when the window closes, so an export is not
    cut off half-written). True when all finished in time."""
    return (pool or QThreadPool.globalInstance()).waitForDone(timeout_ms)
