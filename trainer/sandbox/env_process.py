"""A SandboxEnv in a process of its own, for running many environments side by side.

Qt keeps popups, the mouse grab and focus per application, and a process has one application:
two sandboxes in one process interfere (a combo box left open in one swallows the next click in
the other, measured: a tab click then "changed nothing"). So each environment of a vectorized
rollout lives in its own process and is driven over a pipe. `EnvProcess` has the env's methods
(reset, step, expert_click, expert_action, expert_response, labelled_targets, close, the action
space and platform) plus `send_step` / `recv_step`, so a runner
steps all its environments at once and collects the results after: the steps run in parallel.

Processes start from a fork server that has imported the sandbox already (Linux, macOS), so a new
environment costs a fork, not a fresh interpreter; elsewhere they are spawned. A child whose
parent has died sees its pipe close and exits.
"""
from __future__ import annotations

import multiprocessing as mp
import sys
import traceback

from trainer.errors import TrainerError
from trainer.sandbox.env import ActionSpace, SandboxEnv
from trainer.sandbox.games.env import GameEnv

_CTX = None


class EnvProcessError(TrainerError, RuntimeError):
    """The environment's process failed or is gone; the message names the call and the cause."""


def _context():
    global _CTX
    if _CTX is None:
        if sys.platform.startswith(("linux", "darwin")):
            _CTX = mp.get_context("forkserver")
            _CTX.set_forkserver_preload(["trainer.sandbox.env"])
        else:
            _CTX = mp.get_context("spawn")
    return _CTX


def _serve(conn, env_kw: dict) -> None:
    import os

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    try:
        env = SandboxEnv(**env_kw)
        conn.send((True, {"width": env.width, "height": env.height, "coords_space": env.coords_space,
                          "families": env.families, "split": env.split, "platform": env.platform,
                          "tools": env.tools, "platforms": env.platforms}))
    except BaseException as e:  # the parent must hear why, then we are done
        conn.send((False, f"{type(e).__name__}: {e}"))
        return
    while True:
        try:
            name, args, kwargs = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        try:
            result = getattr(env, name)(*args, **kwargs)
            conn.send((True, result))
        except BaseException as e:  # an env error goes back to the caller, the env stays
            conn.send((False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"))
        if name == "close":
            break
    env.close()


class EnvProcess:
    """SandboxEnv(**env_kw) in its own process, with the env's methods."""

    def __init__(self, **env_kw):
        ctx = _context()
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, env_kw), name="sandbox-env", daemon=True)
        self.proc.start()
        child.close()
        self._pending = False
        attrs = self._recv("start")
        self.width, self.height = attrs["width"], attrs["height"]
        self.coords_space, self.families, self.split = attrs["coords_space"], attrs["families"], attrs["split"]
        self.platform, self.tools, self.platforms = attrs["platform"], attrs["tools"], tuple(attrs["platforms"])

        self.action_space = ActionSpace(tools=self.tools)  # the env's (a plain sampler): the random policy draws here

    def _recv(self, what: str):
        try:
            ok, value = self._conn.recv()
        except (EOFError, OSError):
            code = self.proc.exitcode
            raise EnvProcessError(f"sandbox env process {self.proc.pid} died during {what} (exit code {code})") from None
        if not ok:
            raise EnvProcessError(f"sandbox env {what} failed: {value}")
        return value

    def _send(self, name: str, args: tuple = (), kwargs: dict | None = None) -> None:
        if self._pending:
            raise EnvProcessError(f"{name}() while a step is in flight: call recv_step() first")
        try:
            self._conn.send((name, args, kwargs or {}))
        except (BrokenPipeError, OSError):
            raise EnvProcessError(f"sandbox env process {self.proc.pid} is gone ({name})") from None

    def _call(self, name: str, *args, **kwargs):
        self._send(name, args, kwargs)
        return self._recv(name)

    def reset(self, *, seed=None, options=None):
        return self._call("reset", seed=seed, options=options)

    def step(self, action):
        return self._call("step", action)

    def send_step(self, action) -> None:
        """Start a step; its result comes from recv_step(). Other envs can step meanwhile."""
        self._send("step", (action,))
        self._pending = True

    def recv_step(self):
        self._pending = False
        return self._recv("step")

    def expert_click(self):
        return self._call("expert_click")

    def expert_action(self):
        return self._call("expert_action")

    def expert_response(self):
        return self._call("expert_response")

    def labelled_targets(self):
        return self._call("labelled_targets")

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                if self._pending:
                    self.recv_step()
                self._call("close")
            except EnvProcessError:
                pass
            self.proc.join(timeout=5)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(timeout=5)
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def make_envs(n: int, **env_kw) -> list:
    """`n` sandbox environments for one runner: one in this process when n is 1 (nothing else
    shares its Qt application), else one process each. With a "games" key (GameEnvSpec.kwargs):
    `n` GameEnvs in this process, each driving a Chromium of its own (no Qt to share; each is
    reaped by close(), and by its watchdog if this process dies)."""
    if n < 1:
        raise ValueError(f"need at least one environment, got {n}")
    if "games" in env_kw:
        made = []
        try:
            for _ in range(n):
                made.append(GameEnv(**env_kw))
        except BaseException:
            for e in made:
                e.close()
            raise
        return made
    if n == 1:
        return [SandboxEnv(**env_kw)]
    envs = []
    try:
        for _ in range(n):
            envs.append(EnvProcess(**env_kw))
    except BaseException:
        for e in envs:
            e.close()
        raise
    return envs
