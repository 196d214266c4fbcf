"""The backend's sandbox as an executor the app can drive: a SandboxEnv in its own process.

Qt widgets live on the thread that owns the QApplication, but the agent loop runs in a worker
thread, and the app's QApplication draws on the real screen; so the sandbox runs in a child
process (a fresh interpreter with an offscreen QApplication of its own) and this proxy speaks
to it over pipes (pickled messages). The app starts the trainer's code as a process, never imports its Qt into the window.
Importing this module imports neither Qt nor the sandbox.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path

from agent.executors.base import ExecutionError, Frame
from agent.schema import Action, Outcome
from trainer.sandbox.env import SandboxEnv
from trainer.sandbox.games.env import GameEnv


def _serve(conn, kw: dict) -> None:
    """The child: one SandboxEnv (or, with kw["env"] == "games", a GameEnv: app.game_executor),
    commands in, results out, until 'close' or the pipe ends."""
    kind = kw.pop("env", "sandbox")
    try:
        if kind == "games":
            env = GameEnv(**kw)
        else:
            env = SandboxEnv(**kw)
    except Exception as e:  # reported to the parent as a value
        conn.send(("error", f"the {'game' if kind == 'games' else 'sandbox'} could not start: {type(e).__name__}: {e}"))
        return
    conn.send(("ok", None))
    while True:
        try:
            cmd, args = conn.recv()
        except (EOFError, OSError):
            break
        try:
            if cmd == "close":
                env.close()
                conn.send(("ok", None))
                break
            if cmd == "reset":
                obs, info = env.reset(seed=args.get("seed"), options=args.get("options"))
                conn.send(("ok", (obs["screenshot"], obs["geometry"], info, obs.get("elements"))))
            elif cmd == "step":
                obs, r, term, trunc, info = env.step(args)
                conn.send(("ok", (obs["screenshot"], obs["geometry"], r, term, trunc, info, obs.get("elements"))))
            elif cmd == "observe":
                obs = _observe_game(env) if kind == "games" else env._observe()
                conn.send(("ok", (obs["screenshot"], obs["geometry"], obs.get("elements"))))
            elif cmd == "expert":
                conn.send(("ok", env.expert_action()))
            elif cmd == "browser" and kind == "games":  # where its Chromium runs: the reaping tests look there
                b = env.browser
                conn.send(("ok", (b.pgid, b.profile) if b is not None else None))
            else:
                conn.send(("error", f"unknown sandbox command {cmd!r}"))
        except Exception as e:  # one bad command must not end the sandbox
            conn.send(("error", f"{type(e).__name__}: {e}"))


def _observe_game(env):
    """A game's screen now: a fresh screenshot of the paused page (the fake clock keeps it still
    between steps), or the last one when its browser is gone (a step reported why)."""
    if env.browser is not None and env._obs is not None:
        env._observe()
    if env._obs is None:
        raise RuntimeError("the game has not been reset")
    return env._obs


def _child_main() -> None:
    """Entry point of the child process: the protocol runs over fds 0 (in) and a dup of 1 (out);
    fd 1 then points at stderr, so anything Qt or a task prints cannot corrupt the pipe."""
    import json

    out_fd = os.dup(1)
    os.dup2(2, 1)
    conn_in, conn_out = Connection(0, writable=False), Connection(out_fd, readable=False)

    class Duplex:
        send, recv, poll = conn_out.send, conn_in.recv, conn_in.poll

    _serve(Duplex(), json.loads(sys.argv[1]))


class SandboxProcessExecutor:
    """reset/step/observe/release/close over a SandboxEnv in a child process.

    family/seed pick the task (the same task on every reset, so a run can be prepared first to
    read its instruction). An action the sandbox could not perform raises ExecutionError, as the
    desktop executor does, so the loop records it and tells the policy."""

    platform = "sandbox"

    def __init__(self, family: str | None = None, seed: int = 0, *, width: int = 320, height: int = 240,
                 max_steps: int | None = 50, timeout: float = 60.0, stop_event=None):
        self.family, self.seed, self.timeout = family, int(seed), timeout
        self.kw = {"width": width, "height": height, "max_steps": max_steps}
        self.stop_event = stop_event or threading.Event()
        self._conn = self._send = None
        self._proc = None
        self._lock = threading.Lock()
        self.info: dict = {}
        self.last_reward = 0.0
        self.success = False
        self.done = False  # the task ended (solved, failed for good, or cut by its step limit)

    # ------------------------------------------------------------ process
    def start(self) -> SandboxProcessExecutor:
        """Start the child: a fresh interpreter (not a fork of this Qt process), offscreen."""
        if self._proc is not None:
            return self
        import json

        root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "QT_QPA_PLATFORM": "offscreen",  # never on the user's screen
               "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from app.sandbox_executor import _child_main; _child_main()", json.dumps(self.kw)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=root, env=env)
        self._send = Connection(os.dup(self._proc.stdin.fileno()), readable=False)
        self._conn = Connection(os.dup(self._proc.stdout.fileno()), writable=False)
        self._proc.stdin.close()
        self._proc.stdout.close()
        self._reply()
        return self

    def _reply(self):
        if not self._conn.poll(self.timeout):
            raise ExecutionError(f"the sandbox did not answer within {self.timeout:g} s")
        try:
            status, value = self._conn.recv()
        except (EOFError, OSError):
            raise ExecutionError("the sandbox process ended unexpectedly") from None
        if status != "ok":
            raise ExecutionError(value)
        return value

    def _call(self, cmd: str, args=None):
        self.start()
        with self._lock:
            if self._send is None:
                raise ExecutionError("the sandbox was closed")
            try:
                self._send.send((cmd, args))
            except (BrokenPipeError, OSError):
                raise ExecutionError("the sandbox process is gone") from None
            return self._reply()

    # ------------------------------------------------------------ executor shape
    def _frame(self, pixels, geometry, elements=None) -> Frame:
        """A frame with the sandbox's element list (agent.elements), as the default model reads it."""
        return Frame(geometry=geometry, pixels=pixels, elements=elements,
                     elements_source="sandbox" if elements is not None else None)

    def prepare(self) -> str:
        """Start the sandbox and reset it; returns the task's instruction."""
        self.reset()
        return self.info["instruction"]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        opts = dict(options or {})
        if self.family:
            opts.setdefault("family", self.family)
        pixels, geometry, info, elements = self._call("reset", {"seed": self.seed if seed is None else seed,
                                                                "options": opts})
        self.info, self.success, self.done = info, bool(info.get("success")), False
        return self._frame(pixels, geometry, elements), info

    def step(self, action: Action):
        if self.done and action.name in ("finished", "call_user"):
            # the task already ended (e.g. a human's step solved it): saying so is not an error
            return self.observe(), 0.0, True, False, dict(self.info)
        pixels, geometry, reward, term, trunc, info, elements = self._call("step", action)
        self.info, self.last_reward = info, reward
        self.success = self.success or bool(info.get("success"))
        self.done = self.done or bool(term or trunc)
        error = info.get("action_error") or info.get("error")
        if error:
            raise ExecutionError(f"the sandbox could not do {action.name}: {error}")
        return self._frame(pixels, geometry, elements), reward, term, trunc, info

    def observe(self) -> Frame:
        return self._frame(*self._call("observe"))

    def outcome(self):
        """The sandbox verifier's verdict on the task so far (the agent loop stores it in the
        episode and says it when the run ends)."""
        return Outcome(success=bool(self.success), reward=1.0 if self.success else 0.0, source="verifier")

    def expert_action(self):
        """The sandbox's scripted expert's (thought, Action) for the current state."""
        return self._call("expert")

    def release(self) -> None:
        """Nothing to let go of: the sandbox's input is synthetic and never held."""

    def close(self) -> None:
        """Idempotent and thread-safe: the run's worker and its owner may both close it."""
        with self._lock:
            proc, send, conn = self._proc, self._send, self._conn
            self._proc = self._conn = self._send = None
            if proc is None:
                return
            try:
                send.send(("close", None))
                conn.poll(5) and conn.recv()
            except (OSError, EOFError):
                pass
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.terminate()
                proc.wait(5)
            send.close()
            conn.close()
