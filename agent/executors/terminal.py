"""Terminal and files: the report's GUI-SDK tools (run_command, read_file, write_file).

Files are read and written only inside an allowed root: a path escaping it (.., absolute
elsewhere, a symlink out) is refused with the path named, and a write goes through a fresh
temporary file (created exclusively, never through a planted link) renamed over the target.
Commands start in a working directory inside the root, with a timeout and an output cap, but a
shell command runs with the user's rights and is NOT confined: `cd ..`, an absolute path or any
program can reach outside the root. The gate always asks before these actions (agent.actions
marks them risky): consent, not a sandbox, is what stands between a command and the machine.
"""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from agent.executors.base import ExecutionError, Frame
from agent.grammar import format_tool_output
from agent.schema import Action, ScreenGeometry, monotonic
from agent.storage.files import atomic_write

TOOL_ACTIONS = ("run_command", "read_file", "write_file")
# A text observation has no pixels; this nominal geometry only keeps the schema's
# "every observation has a geometry" invariant.
TEXT_GEOMETRY = ScreenGeometry.simple(1, 1)


class PathOutsideRoot(ExecutionError):
    pass


def tool_output(action: Action, result: dict | None = None, *, error: str | None = None, timeout: float | None = None) -> dict:
    """agent.schema's Observation.tool_output for a tool action: what it gave back (`result`, as
    TerminalExecutor's run_command/read_file/write_file return it), or why it did not run (`error`)."""
    a = action.args
    target = str(a.get("command", "") if action.name == "run_command" else a.get("path", ""))
    out = {"tool": action.name, "target": target, "exit_code": None, "output": "", "truncated": False}
    if error is not None:
        out["output"] = f"error: {error}"
    elif action.name == "run_command":
        late = f"\n[timed out after {timeout:g} s: stopped]" if result["timed_out"] and timeout else (
            "\n[timed out: stopped]" if result["timed_out"] else "")
        out.update(exit_code=result["exit_code"], output=result["output"] + late, truncated=result["truncated_output"])
    elif action.name == "read_file":
        out.update(output=result["content"], truncated=result["truncated_output"])
    else:
        out["output"] = f"wrote {result['bytes']} bytes to {target}"
    return out


def _cap(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    head = text[: limit // 2]
    tail = text[-(limit - len(head)) :]
    return f"{head}\n[... {len(text) - limit} characters cut ...]\n{tail}", True


class TerminalExecutor:
    platform = "terminal"

    def __init__(self, root, *, timeout: float = 30.0, output_limit: int = 20_000, file_limit: int = 1_000_000, env=None):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ExecutionError(f"terminal root {str(root)!r} is not a directory")
        self.timeout = float(timeout)
        self.output_limit = int(output_limit)
        self.file_limit = int(file_limit)
        self.env = env
        self._proc: subprocess.Popen | None = None
        self._last = Frame(geometry=TEXT_GEOMETRY, text="")

    # ---------------------------------------------------------------- paths
    def resolve(self, path: str) -> Path:
        """`path` (relative to the root, or absolute) resolved; refuses anything outside the root."""
        if not isinstance(path, str) or not path.strip():
            raise ExecutionError(f"empty path {path!r}")
        p = Path(path)
        full = (p if p.is_absolute() else self.root / p).resolve()  # resolve() follows symlinks
        if full != self.root and self.root not in full.parents:
            raise PathOutsideRoot(f"path {path!r} resolves to {str(full)!r}, outside the allowed root {str(self.root)!r}")
        return full

    # ---------------------------------------------------------------- tools
    def run_command(self, command: str, cwd: str | None = None) -> dict:
        workdir = self.resolve(cwd) if cwd else self.root
        if not workdir.is_dir():
            raise ExecutionError(f"working directory {cwd!r} does not exist")
        t0 = monotonic()
        # its own process group, so a timeout or the kill switch ends its children too
        self._proc = subprocess.Popen(
            command, shell=True, cwd=workdir, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        timed_out = False
        try:
            out, _ = self._proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            self._kill_group()
            out, _ = self._proc.communicate()
        code = self._proc.returncode
        self._proc = None
        text, cut = _cap(out.decode("utf-8", errors="replace"), self.output_limit)
        return {"command": command, "cwd": str(workdir), "exit_code": code, "output": text, "truncated_output": cut,
                "timed_out": timed_out, "seconds": round(monotonic() - t0, 3)}

    def read_file(self, path: str) -> dict:
        full = self.resolve(path)
        if not full.is_file():
            raise ExecutionError(f"no file at {path!r}")
        size = full.stat().st_size
        if size > self.file_limit:
            raise ExecutionError(f"file {path!r} is {size} bytes, more than the limit of {self.file_limit}")
        text, cut = _cap(full.read_text(encoding="utf-8", errors="replace"), self.output_limit)
        return {"path": str(full), "content": text, "truncated_output": cut}

    def write_file(self, path: str, content: str) -> dict:
        full = self.resolve(path)
        data = content.encode("utf-8")
        if len(data) > self.file_limit:
            raise ExecutionError(f"content for {path!r} is {len(data)} bytes, more than the limit of {self.file_limit}")
        full.parent.mkdir(parents=True, exist_ok=True)
        self.resolve(str(full.parent))  # the folder made must still be inside the root
        atomic_write(full, data)  # an exclusive random temporary name: a planted link is never followed
        return {"path": str(full), "bytes": len(data)}

    def _kill_group(self):
        p = self._proc
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # ---------------------------------------------------------------- executor shape
    def reset(self, *, seed=None, options=None):
        self._last = Frame(geometry=TEXT_GEOMETRY, text=f"working directory: {self.root}")
        return self._last, {}

    def observe(self) -> Frame:
        return self._last

    def step(self, action: Action):
        if action.name not in TOOL_ACTIONS + ("finished", "call_user"):
            raise ExecutionError(f"the terminal cannot execute {action.name!r}")
        a = action.args
        out = None
        if action.name == "run_command":
            result = self.run_command(a["command"], a.get("cwd"))
        elif action.name == "read_file":
            result = self.read_file(a["path"])
        elif action.name == "write_file":
            result = self.write_file(a["path"], a["content"])
        else:
            result = {}
        if result:
            out = tool_output(action, result, timeout=self.timeout)
            # the output is the observation's (tool_output); the info keeps how it ran
            result = {k: v for k, v in result.items() if k not in ("output", "content")}
        self._last = Frame(geometry=TEXT_GEOMETRY, text=format_tool_output(out, self.output_limit) if out else "",
                           tool_output=out)
        terminated = action.name in ("finished", "call_user")
        return self._last, 0.0, terminated, False, {"tool_result": result}

    def release(self) -> None:
        """The kill switch: end a running command (its whole process group)."""
        self._kill_group()

    def close(self) -> None:
        self._kill_group()
