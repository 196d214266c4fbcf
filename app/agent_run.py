"""Running the agent from the app: building a policy and an executor from the page's choices,
running AgentLoop on a worker thread, reporting back by signals, and queueing the episode for sync.

`AgentRun(loop_factory)` owns one run. Everything the loop reports (steps, control, events, the
end) arrives on the main thread through queued signals; the loop never touches a widget.
Every human gate decision is logged in the episode (agent.run.decision_stats.DecisionLog).
"""
from __future__ import annotations

import threading
import traceback

from PySide6.QtCore import QObject, Signal

from agent.errors import TandemError
from agent.executors.android import AndroidExecutor
from agent.executors.base import ExecutionError
from agent.executors.desktop import DesktopExecutor
from agent.policies import PolicyError
from agent.policies.choice import FORM
from agent.policies.choice import make_policy as choose
from agent.redaction import RedactionError
from agent.redaction.review import auto_redact, auto_redaction_due
from agent.run.decision_stats import DecisionLog
from agent.sync.outbox import Outbox
from app.game_executor import GameProcessExecutor
from app.sandbox_executor import SandboxProcessExecutor
from app.workers import run_in_background


def models_missing() -> str | None:
    """Why models cannot run in this installation (the annotators' bundle, `pip install .` without
    [train]), or None when they can."""
    import importlib.util

    lacking = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if not lacking:
        return None
    return (f"This installation of Tandem has no {' or '.join(lacking)}, so it cannot run a model here: use an "
            "OpenAI-compatible endpoint, or install Tandem with its training extras (pip install 'tandem[train]').")


class RunSetupError(TandemError, ValueError):
    """The page's choices do not make a runnable agent; the message says which and why."""


def make_policy(choice: str, *, responses=None, base_url: str = "", model: str = "", api_key: str | None = None,
                model_dir: str = "", platform: str = "desktop", space: str | None = None, tools: bool = False):
    """A Policy for the page's choice (agent.policies.choice); the default model is the shipped one.
    Nothing heavy happens here (a local model loads on first use). `tools`: its prompt offers the
    terminal and file tools too."""
    if choice in ("local", "default"):
        if models_missing():
            raise RunSetupError(models_missing())
    try:
        return choose(choice, responses=responses, base_url=base_url, model=model, api_key=api_key,
                      model_dir=model_dir if choice == "local" else None, platform=platform, space=space, tools=tools,
                      spelling=FORM)
    except PolicyError as e:
        raise RunSetupError(str(e)) from None


def make_executor(choice: str, *, family: str | None = None, seed: int = 0, serial: str | None = None,
                  game: str | None = None):
    if choice == "desktop":
        return DesktopExecutor()
    if choice == "android":
        return AndroidExecutor(serial=serial)  # connects (adb + uiautomator2) on the first observation
    if choice == "sandbox":
        return SandboxProcessExecutor(family or None, seed)
    if choice == "game":
        if not game:
            raise RunSetupError("choose a game")
        try:
            return GameProcessExecutor(game, seed)  # its browser starts with the run, in a child process
        except ExecutionError as e:
            raise RunSetupError(str(e)) from None
    raise RunSetupError(f"executor must be 'desktop', 'android', 'sandbox' or 'game', got {choice!r}")


def queue_for_sync(store, window, episode_id: str) -> str:
    """Queue an episode for upload like a recording; returns what happened, for the status bar.
    A run on a real screen is redacted first (agent.redaction.runs), in a worker: the sync would
    do it too, but on its own thread, where reading many frames holds up the connection."""
    try:
        due = auto_redaction_due(store, store.load_episode(episode_id))
    except (RedactionError, ValueError):  # a bad privacy.runs setting: the sync names it for this episode
        due = False
    if not due:
        return _submit(store, window, episode_id)

    # queued whatever the redaction's outcome: if it failed, the sync tries again and says why
    run_in_background(auto_redact, store, episode_id, on_finished=lambda: _submit(store, window, episode_id))
    return "queued for sync once its personal data is blurred"


def _submit(store, window, episode_id: str) -> str:
    bridge = getattr(window, "sync", None)
    try:
        if bridge is not None:
            bridge.submit([episode_id])
            return "queued for sync"

        Outbox(store).submit(episode_id)
        return "queued for sync (sent when sync runs)"
    except Exception as e:  # the episode is safe in the store; say why it is not queued
        return f"not queued for sync: {e}"


class AgentRun(QObject):
    """One run of AgentLoop on a worker thread. Build the loop in `build(run)` (called on the
    worker thread, so slow setup such as starting the sandbox stays off the main thread); it
    returns (loop, instruction). Connect the signals before `start()`."""

    step = Signal(object)  # Step
    control = Signal(bool)
    event = Signal(str, object)
    prepared = Signal(object)  # the AgentLoop, once built
    finished = Signal(object)  # RunResult
    failed = Signal(str)

    def __init__(self, build, *, on_close=None, parent=None):
        super().__init__(parent)
        self.build = build
        self.on_close = on_close  # fn(loop) on the worker thread after the run (close executor etc.)
        self.loop = None
        self.result = None
        self._stop_reason: str | None = None
        self._ended = threading.Event()  # set before `finished`/`failed` go out
        self._thread = threading.Thread(target=self._main, name="tandem-agent", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        """Until the run has reported its end. The thread lives on a moment after (on_close closes
        the executor), and a page that asked the thread kept Start disabled and Stop enabled."""
        return self._thread.is_alive() and not self._ended.is_set()

    def stop(self, reason: str = "stopped by the user") -> None:
        """Thread-safe; a stop before the loop exists takes effect as soon as it does."""
        self._stop_reason = reason
        if self.loop is not None:
            self.loop.stop(reason)

    def wait(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _main(self) -> None:
        loop = None
        try:
            loop, instruction = self.build(self)
            loop.on_step = self.step.emit
            loop.on_control = self.control.emit
            loop.on_event = DecisionLog(loop, then=lambda kind, payload: self.event.emit(kind, payload))
            self.loop = loop
            self.prepared.emit(loop)
            if self._stop_reason is not None:  # run() clears the stop flag: do not start at all
                self._ended.set()
                self.failed.emit(f"stopped before the run began ({self._stop_reason})")
                return
            self.result = loop.run(instruction)
            self._ended.set()
            self.finished.emit(self.result)
        except Exception as e:  # reported to the page; the loop already saved the episode
            self._ended.set()
            self.failed.emit(f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}")
        finally:
            if self.on_close is not None:
                try:
                    self.on_close(loop)
                except Exception:  # closing is best effort
                    pass
