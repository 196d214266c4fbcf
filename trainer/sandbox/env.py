"""The sandbox as a Gymnasium environment of the executor shape.

    env = SandboxEnv()                       # or gymnasium.make("Tandem/Sandbox-v0")
    obs, info = env.reset(seed=7, options={"family": "dropdown"})
    obs, reward, terminated, truncated, info = env.step(Action("click", {"start_box": (0.5, 0.4)}))

An action is an Action or a list of them, with normalized points: a model's reply is parsed where
it arrives (agent.grammar.parse_reply, as the episode runner does), never by the env.

obs = {"screenshot": HxWx3 uint8 RGB, "geometry": ScreenGeometry} and, with observation="elements"
(the default), "elements": the screen's element list (agent.elements.Element, screenshot pixels). Reward is 1 on the step the
verifier first reports success, else 0; `info["progress"]` carries partial progress.
`terminated` means a real end (success, an irreversible mistake, or the agent said finished /
call_user); `truncated` means the step limit cut the episode. They are never merged.
A seed passed to reset is the task's seed (seeds >= HELDOUT_START are the held-out split);
reset() without one draws a task seed of the env's split from the env's RNG.

With `tools=True` (the report's GUI-SDK: terminal and file tools beside the GUI) each episode has a
workspace folder of its own, made fresh by reset() and removed by the next reset and by close(): the
task prepares its files there, the app's widgets read and write it, and run_command / read_file /
write_file actions run in it (agent.executors.terminal.TerminalExecutor rooted there: commands start
in it, with a short timeout and an output cap). obs["tool_output"] is then what the previous step's
tool action gave back (agent.schema.Observation.tool_output's dict: tool, target, exit_code, output,
truncated), None after a step without one. With tools off (the default) a tool action is the agent's
mistake (info["action_error"]); a hybrid family (trainer.sandbox.families_hybrid) still gets its
workspace for the app's own files, and one with no GUI-only route cannot be played.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import gymnasium as gym
import numpy as np

from agent import coords
from agent.actions import SCROLL_DIRECTIONS, validate
from agent.elements import Element
from agent.executors.base import ExecutionError
from agent.executors.terminal import TOOL_ACTIONS, TerminalExecutor, tool_output
from agent.grammar import format_normalized
from agent.schema import Action, ScreenGeometry
from agent.vlm.pointer import HEAD_FILE
from trainer.sandbox.families import FAMILIES, family_class, family_for_seed
from trainer.sandbox.families_hybrid import HybridTask
from trainer.sandbox.screen import SandboxError, Screen
from trainer.sandbox.task import HELDOUT_START, RUNNING, SEED_LIMIT, SUCCESS, split_of

ENV_ID = "Tandem/Sandbox-v0"
SPLITS = ("train", "heldout")
# "elements": the screenshot and the screen's element list (agent.elements, the sandbox's widget tree);
# "pixels": the screenshot alone
OBSERVATIONS = ("elements", "pixels")
TOOL_TIMEOUT = 5.0  # seconds a command may run in the sandbox's workspace
TOOL_OUTPUT_LIMIT = 4000  # characters of a tool's output handed back (head and tail kept)


def observation_for(model_dir) -> str:
    """What a checkpoint should observe: "elements" when it has the element-list pointer
    (agent.vlm.pointer's side file), else "pixels" (the earlier default model, UI-TARS checkpoints)."""
    from pathlib import Path

    return "elements" if model_dir and (Path(model_dir) / HEAD_FILE).is_file() else "pixels"


def env_kw_for(env_kw: dict, model_dir) -> dict:
    """env_kw with the observation `model_dir` was trained for, unless env_kw names one."""
    return env_kw if "observation" in env_kw else {**env_kw, "observation": observation_for(model_dir)}


class GeometrySpace(gym.Space):
    """The screen geometry beside each screenshot: a fixed ScreenGeometry value."""

    def __init__(self, width: int, height: int):
        super().__init__(None, None)
        self.value = ScreenGeometry.simple(width, height)

    def sample(self, mask=None, probability=None):
        return ScreenGeometry.simple(self.value.physical_width, self.value.physical_height)

    def contains(self, x) -> bool:
        return isinstance(x, ScreenGeometry) and x == self.value

    def __eq__(self, other):
        return isinstance(other, GeometrySpace) and other.value == self.value


class ElementsSpace(gym.Space):
    """An element list beside each screenshot (agent.elements.Element, boxes in screenshot pixels
    within width x height), or None where the platform could not read one."""

    def __init__(self, width: int, height: int):
        super().__init__(None, None)
        self.width, self.height = int(width), int(height)

    def sample(self, mask=None, probability=None):
        return []

    def contains(self, x) -> bool:
        if x is None:
            return True
        return isinstance(x, list) and all(
            isinstance(e, Element) and 0 <= e.box[0] <= e.box[2] <= self.width and 0 <= e.box[1] <= e.box[3] <= self.height
            for e in x)

    def __eq__(self, other):
        return isinstance(other, ElementsSpace) and (other.width, other.height) == (self.width, self.height)


class NoteSpace(gym.Space):
    """A short line of text beside an observation (where its element list came from, or why there is none)."""

    def __init__(self, max_length: int = 1000):
        super().__init__(None, None)
        self.max_length = int(max_length)

    def sample(self, mask=None, probability=None):
        return ""

    def contains(self, x) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __eq__(self, other):
        return isinstance(other, NoteSpace) and other.max_length == self.max_length


class ToolOutputSpace(gym.Space):
    """What the previous tool action gave back (agent.schema.Observation.tool_output's dict), or None."""

    KEYS = frozenset(("tool", "target", "exit_code", "output", "truncated"))

    def __init__(self):
        super().__init__(None, None)

    def sample(self, mask=None, probability=None):
        return None

    def contains(self, x) -> bool:
        return x is None or (isinstance(x, dict) and set(x) == self.KEYS and x["tool"] in TOOL_ACTIONS
                             and isinstance(x["output"], str))

    def __eq__(self, other):
        return isinstance(other, ToolOutputSpace)


class ActionSpace(gym.Space):
    """Schema Actions with normalized points (one, or a list of them). sample() is the random
    policy: mostly clicks, some double/right clicks, drags, scrolls, typing, keys and waits; with
    `tools`, now and then a command that only looks (ls, cat, wc: it changes no file)."""

    KINDS = ("click",) * 10 + ("left_double", "right_single", "drag", "drag", "scroll", "scroll", "type", "hotkey", "wait")
    KEYS = ("enter", "esc", "tab", "down", "up", "space", "ctrl a", "backspace")
    TEXTS = ("hello", "Alice", "7", "Paris", "ok\n", "test")
    COMMANDS = ("ls", "ls -l", "cat *", "wc -l *", "head -n 3 *", "pwd")

    def __init__(self, seed=None, tools: bool = False):
        super().__init__(None, None, seed)
        self.tools = bool(tools)

    def contains(self, x) -> bool:
        if isinstance(x, (list, tuple)):
            return bool(x) and all(isinstance(a, Action) and self.contains(a) for a in x)
        return isinstance(x, Action) and validate(x) is None

    def sample(self, mask=None, probability=None) -> Action:
        r = self.np_random

        def pt():
            return (float(r.uniform(0.02, 0.98)), float(r.uniform(0.02, 0.98)))

        kinds = self.KINDS + (("run_command",) * 2 if self.tools else ())
        kind = kinds[int(r.integers(len(kinds)))]
        if kind == "run_command":
            return Action("run_command", {"command": self.COMMANDS[int(r.integers(len(self.COMMANDS)))]})
        if kind in ("click", "left_double", "right_single"):
            return Action(kind, {"start_box": pt()})
        if kind == "drag":
            return Action("drag", {"start_box": pt(), "end_box": pt()})
        if kind == "scroll":
            return Action("scroll", {"start_box": pt(), "direction": SCROLL_DIRECTIONS[int(r.integers(2))]})
        if kind == "type":
            return Action("type", {"content": self.TEXTS[int(r.integers(len(self.TEXTS)))]})
        if kind == "hotkey":
            return Action("hotkey", {"key": self.KEYS[int(r.integers(len(self.KEYS)))]})
        return Action("wait", {})

    def __eq__(self, other):
        return isinstance(other, ActionSpace) and other.tools == self.tools


class StepLater:
    """`send_step(action)` / `recv_step()` for an env that steps in its own process only in name:
    the step runs at send, its result waits for recv (trainer.rollout.runner.TaskEnv; EnvProcess
    overlaps real steps)."""

    _sent = None

    def send_step(self, action) -> None:
        self._sent = self.step(action)

    def recv_step(self):
        if self._sent is None:
            raise RuntimeError("recv_step() without a send_step() before it")
        result, self._sent = self._sent, None
        return result


class SandboxEnv(StepLater, gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}
    platform = "sandbox"  # the action platform it performs (agent.actions)

    def __init__(self, width: int = 320, height: int = 240, families: list[str] | None = None, split: str = "train",
                 max_steps: int | None = None, coords_space: str = coords.SMART_RESIZE, render_mode: str | None = None,
                 observation: str = "elements", tools: bool = False):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if observation not in OBSERVATIONS:
            raise ValueError(f"observation must be one of {OBSERVATIONS}, got {observation!r}")
        self.observation = observation
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        coords.model_extent(coords_space, width, height)  # raises on an unknown space
        self.families = list(families) if families else list(FAMILIES)
        for f in self.families:
            family_class(f)
        self.width, self.height, self.split = int(width), int(height), split
        self.max_steps, self.coords_space, self.render_mode = max_steps, coords_space, render_mode
        if not isinstance(tools, bool):
            raise ValueError(f"tools must be True or False, got {tools!r}")
        self.tools = tools
        blocked = [f for f in self.families if not tools and getattr(family_class(f), "gui_route", True) is False]
        if blocked:
            raise ValueError(f"families {', '.join(blocked)} cannot be played without the tools: pass tools=True")
        # the platforms a reply's actions may come from: the GUI's, and the terminal's with the tools
        self.platforms = (self.platform, "terminal") if tools else (self.platform,)
        self.observation_space = gym.spaces.Dict({
            "screenshot": gym.spaces.Box(0, 255, (self.height, self.width, 3), np.uint8),
            "geometry": GeometrySpace(self.width, self.height),
            **({"elements": ElementsSpace(self.width, self.height)} if observation == "elements" else {}),
            **({"tool_output": ToolOutputSpace()} if tools else {}),
        })
        self.action_space = ActionSpace(tools=tools)
        self.screen = None
        self.task = None
        self.workspace: Path | None = None  # this episode's folder (tools on, or a hybrid family)
        self.terminal: TerminalExecutor | None = None  # the tools, rooted in the workspace (tools on)
        self._tool_output: dict | None = None
        self._steps = 0
        self._done = False
        self._last = None
        self._shown = None  # the last screenshot handed out, to tell whether a step changed the screen

    # ------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = dict(options or {})
        task_seed = options.get("task_seed", seed)
        if task_seed is None:
            lo, hi = (0, HELDOUT_START) if self.split == "train" else (HELDOUT_START, SEED_LIMIT)
            task_seed = int(self.np_random.integers(lo, hi))
        family = options.get("family") or family_for_seed(int(task_seed), self.families)
        cls = family_class(family)
        hybrid = issubclass(cls, HybridTask)
        if hybrid and not self.tools and not cls.gui_route:
            raise SandboxError(f"family {family!r} cannot be played without the tools: {cls.needs_tools}")
        self._teardown()
        if self.tools or hybrid:
            self.workspace = Path(tempfile.mkdtemp(prefix="tandem-workspace-"))
        if self.tools:
            self.terminal = TerminalExecutor(self.workspace, timeout=TOOL_TIMEOUT, output_limit=TOOL_OUTPUT_LIMIT)
        self.screen = Screen(self.width, self.height)
        if hybrid:
            self.task = cls(int(task_seed), self.screen, workspace=self.workspace, tools=self.tools)
        else:
            self.task = cls(int(task_seed), self.screen)
        self.screen.show()
        self.task.after_show()
        self.screen.settle()
        self._steps, self._done, self._tool_output = 0, False, None
        self._limit = self.max_steps or self.task.max_steps  # a task may size its own budget
        obs = self._observe()
        self._shown = obs["screenshot"]
        return obs, self._info(self.task.verdict())

    def step(self, action):
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        extra: dict = {}
        actions = to_actions(action, extra)
        ended_by_agent = False
        self._tool_output = None
        if self._done:
            extra["error"] = "the episode is over; call reset()"
            actions = []
        for a in actions:
            problem = validate(a)
            if problem:
                extra["action_error"] = problem
                break
            if a.name in ("finished", "call_user"):
                ended_by_agent = True
                break
            if a.name in TOOL_ACTIONS:
                if self.terminal is None:
                    extra["action_error"] = f"{a.name}: this sandbox has no terminal or file tools (GUI actions only)"
                    break
                problem = self._run_tool(a)
                if problem:
                    extra["action_error"] = problem
                    break
                if self.task.verdict().status != RUNNING:
                    break
                continue
            try:
                self.screen.perform(a)
            except SandboxError as e:  # what cannot be done is the agent's mistake; any other error is a bug
                extra["action_error"] = f"{a.name}: {e}"
                break
            if self.task.verdict().status != RUNNING:
                break
        self._steps += 1
        verdict = self.task.verdict()
        reward = 1.0 if verdict.status == SUCCESS and not self._done else 0.0
        terminated = verdict.status != RUNNING or ended_by_agent
        truncated = not terminated and self._steps >= self._limit
        self._done = self._done or terminated or truncated
        info = self._info(verdict)
        info.update(extra)
        obs = self._observe()
        # did the action change the screen? None where nothing ran to be judged: no action (a reply
        # that did not parse), an action error, or the step that ended the episode
        ran = bool(actions) and "action_error" not in extra and not terminated
        info["screen_changed"] = bool(not np.array_equal(self._shown, obs["screenshot"])) if ran else None
        self._shown = obs["screenshot"]
        return obs, reward, bool(terminated), bool(truncated), info

    def render(self):
        if self.render_mode == "rgb_array":
            return self.screen.render() if self.screen else np.zeros((self.height, self.width, 3), np.uint8)
        return None

    def close(self):
        self._teardown()

    def _run_tool(self, action: Action) -> str | None:
        """Run one tool action in the workspace; its result becomes the next observation's
        tool_output. Returns the error when the tool could not do it (no such file, a path outside
        the workspace): the agent's mistake, whose message it also sees as the tool's output."""
        error = None
        try:
            frame, *_ = self.terminal.step(action)
            out = frame.tool_output  # agent.executors.terminal.tool_output: one shape for the loop and the env
        except ExecutionError as e:
            error = f"{action.name}: {e}"
            out = tool_output(action, error=str(e))
        self._tool_output = out
        self.task.after_tool(action, self._tool_output, error)  # the app notices what changed in its folder
        self.screen.settle()
        return error

    # ------------------------------------------------------------ helpers
    def expert_action(self) -> tuple[str, Action]:
        """The scripted expert's next (thought, action) for the current state."""
        if self.task is None:
            raise RuntimeError("call reset() before expert_action()")
        return self.task.expert()

    def expert_click(self) -> tuple[float, float] | None:
        """Where the expert would click now (normalized), or None when its next move is no click or
        it has none; leaves the task as it was (its random choices included), so asking is free."""
        if self.task is None:
            raise RuntimeError("call reset() before expert_click()")
        state = self.task.rng.getstate()
        try:
            _, action = self.task.expert()
        except Exception:  # a task with no expert move in this state (done, failed) has no target
            return None
        finally:
            self.task.rng.setstate(state)
        box = action.args.get("start_box") if isinstance(action, Action) and action.name == "click" else None
        return (float(box[0]), float(box[1])) if box else None

    def labelled_targets(self) -> list[tuple[str, Action, tuple[float, float, float, float]]]:
        """(text, click, box) for each clickable labelled element on the screen now (Task.labelled_targets)."""
        if self.task is None:
            raise RuntimeError("call reset() before labelled_targets()")
        return self.task.labelled_targets()

    def expert_response(self) -> str:
        """The expert's next step as UI-TARS text in this env's coordinate space."""
        thought, action = self.expert_action()
        return format_normalized(thought, [action], self.coords_space, self.width, self.height)

    def _observe(self) -> dict:
        obs = {"screenshot": self.screen.render(), "geometry": ScreenGeometry.simple(self.width, self.height)}
        if self.observation == "elements":
            obs["elements"] = self.screen.elements()
        if self.tools:
            obs["tool_output"] = self._tool_output
        return obs

    def _info(self, verdict) -> dict:
        t = self.task
        info = {
            "instruction": t.instruction, "family": t.family, "level": t.level, "task_seed": t.seed,
            "split": split_of(t.seed), "progress": float(verdict.progress), "status": verdict.status,
            "success": verdict.status == SUCCESS, "steps": self._steps, "max_steps": self._limit,
        }
        if verdict.reason:
            info["reason"] = verdict.reason
        return info

    def _teardown(self):
        if self.terminal is not None:
            self.terminal.close()  # a command still running ends with its process group
        if self.screen is not None:
            self.screen.close()
        if self.workspace is not None:
            shutil.rmtree(self.workspace, ignore_errors=True)
        self.screen, self.task, self.workspace, self.terminal = None, None, None, None


def to_actions(action, extra: dict) -> list[Action]:
    """What a step was given (an Action or a non-empty list of them) as a list of Actions; anything
    else (UI-TARS text included: parse it where it arrives, agent.grammar.parse_reply) gives none
    and says why in extra["action_error"]."""
    if isinstance(action, Action):
        return [action]
    if isinstance(action, (list, tuple)) and action and all(isinstance(a, Action) for a in action):
        return list(action)
    what = "text (parse the reply first: agent.grammar.parse_reply)" if isinstance(action, str) else type(action).__name__
    extra["action_error"] = f"an action must be an Action or a list of Actions, got {what}"
    return []


def register() -> None:
    """Register Tandem/Sandbox-v0 with Gymnasium (idempotent)."""
    if ENV_ID not in gym.registry:
        gym.register(ENV_ID, entry_point="trainer.sandbox.env:SandboxEnv", disable_env_checker=True)


def make_vector_env(num_envs: int, **kwargs):
    """`num_envs` SandboxEnvs, one per process (spawned: a fresh Qt each), as a Gymnasium
    AsyncVectorEnv. Observations hold a ScreenGeometry, so shared memory is off."""
    from functools import partial

    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
    return gym.vector.AsyncVectorEnv([partial(SandboxEnv, **kwargs)] * num_envs, shared_memory=False, context="spawn")
