"""The MiniWoB++ adapter. Always: key mapping, where Chromium is found, the flags of `sandbox eval
--suite miniwob`, and that MiniWoB++ can never become training data. Where miniwob and Chromium
are installed (packaging/install.sh --test installs them): real episodes in headless Chromium,
played by the one episode runner, keys that reach the page, MiniWoB's clock, the oracle, the CLI,
and that Chromium is reaped after close, a hang, and the SIGKILL of its parent."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from trainer.rollout.miniwob_eval import tickets
from trainer.sandbox.miniwob_browser import BINARY_ENV, DRIVER_ENV, MiniWoBError, chromium_paths, group_processes
from trainer.sandbox.miniwob_env import available, miniwob_key

MISSING = available()
needs_miniwob = pytest.mark.skipif(MISSING is not None, reason=f"MiniWoB++ not available here: {MISSING}")
SIX = ["click-test", "click-button", "click-link", "focus-text", "enter-text", "click-checkboxes"]


def gone(pgid: int, within: float = 10.0) -> bool:
    """Whether every process of the group has ended within `within` seconds."""
    end = time.monotonic() + within
    while group_processes(pgid):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


# ------------------------------------------------------------ no browser needed
def test_key_mapping_speaks_webdriver():
    assert miniwob_key("ctrl a") == "C-a"
    assert miniwob_key("Control+A") == "C-a"  # the letter's key, whatever its case
    assert miniwob_key("enter") == "<Enter>" and miniwob_key("return") == "<Enter>"
    assert miniwob_key("up") == "<ArrowUp>" and miniwob_key("ArrowDown") == "<ArrowDown>"
    assert [miniwob_key(k) for k in ("space", "esc", "home", "end", "page down")] == \
        ["<Space>", "<Escape>", "<Home>", "<End>", "<PageDown>"]
    assert miniwob_key("shift tab") == "S-<Tab>" and miniwob_key("tab shift") == "S-<Tab>"
    assert miniwob_key("shift a") == "A" and miniwob_key("Z") == "Z" and miniwob_key("z") == "z"  # case kept
    assert miniwob_key("ctrl+shift+tab") == "C-S-<Tab>" and miniwob_key("alt ctrl x") == "A-C-x"
    with pytest.raises(ValueError, match="exactly one non-modifier key"):
        miniwob_key("ctrl")
    with pytest.raises(ValueError, match="no key 'capslock'"):
        miniwob_key("capslock")


def test_chromium_is_configured_by_both_variables_or_neither(tmp_path):
    exe = tmp_path / "chromium"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    with pytest.raises(MiniWoBError, match=f"{BINARY_ENV} is set .* but {DRIVER_ENV} is not"):
        chromium_paths({BINARY_ENV: str(exe)})
    with pytest.raises(MiniWoBError, match=f"{DRIVER_ENV} is set .* but {BINARY_ENV} is not"):
        chromium_paths({DRIVER_ENV: str(exe)})
    with pytest.raises(MiniWoBError, match=f"{DRIVER_ENV}='/nowhere/chromedriver' is not an executable file"):
        chromium_paths({BINARY_ENV: str(exe), DRIVER_ENV: "/nowhere/chromedriver"})
    assert chromium_paths({BINARY_ENV: str(exe), DRIVER_ENV: str(exe)}) == (str(exe), str(exe))


def test_a_half_configured_chromium_is_reported_not_raised(monkeypatch):
    from trainer.flywheel.evaluation import miniwob_missing

    monkeypatch.setenv(BINARY_ENV, "/usr/bin/chromium")
    monkeypatch.delenv(DRIVER_ENV, raising=False)
    missing = miniwob_missing()
    assert missing and (DRIVER_ENV in missing or "miniwob" in missing)


def test_tickets_spread_over_tasks_with_seeds_per_task():
    assert tickets(["a", "b", "c"], 5) == [(0, "miniwob/a"), (1, "miniwob/a"), (0, "miniwob/b"), (1, "miniwob/b"),
                                           (0, "miniwob/c")]
    with pytest.raises(ValueError, match="at least 1, got 0"):
        tickets(["a"], 0)


def test_miniwob_never_becomes_training_data():
    from trainer.config_flags import ConfigError
    from trainer.flywheel.iteration import FlywheelConfig
    from trainer.rollout.runner import plan

    with pytest.raises(ConfigError, match="miniwob/click-test"):
        FlywheelConfig(families=["miniwob/click-test"])
    with pytest.raises(Exception, match="miniwob/click-test"):
        plan(2, families=["miniwob/click-test"])  # what `sandbox generate` and the recipe's demonstrations use


def test_eval_flags_are_checked_per_suite(capsys):
    from main import main

    assert main(["sandbox", "eval", "--policy", "oracle", "--episodes", "2"]) == 2
    assert "--suite miniwob" in capsys.readouterr().err
    assert main(["sandbox", "eval", "--suite", "miniwob", "--policy", "expert", "--episodes", "2"]) == 2
    assert "--policy oracle" in capsys.readouterr().err
    assert main(["sandbox", "eval", "--suite", "miniwob", "--families", "radio", "--policy", "random",
                 "--episodes", "2"]) == 2
    assert "--tasks, not --families" in capsys.readouterr().err
    assert main(["sandbox", "eval", "--tasks", "click-test", "--policy", "random", "--episodes", "2"]) == 2
    assert "for --suite miniwob" in capsys.readouterr().err
    assert main(["sandbox", "eval", "--suite", "miniwob", "--width", "640", "--split", "train", "--policy", "random",
                 "--episodes", "2"]) == 2
    assert "--width, --split are the sandbox's" in capsys.readouterr().err  # refused, not silently ignored


# ------------------------------------------------------------ real Chromium
@pytest.fixture(scope="module")
def env():
    if MISSING:
        pytest.skip(f"MiniWoB++ not available here: {MISSING}")
    from trainer.sandbox.miniwob_env import MiniWoBEnv

    e = MiniWoBEnv(SIX + ["click-dialog"], max_steps=10)
    yield e
    e.close()


def _value(env, id_: str) -> str:
    return next(e["value"] for e in env._raw["dom_elements"] if e["id"] == id_)


@needs_miniwob
def test_every_key_of_the_random_policy_is_pressable_and_reaches_the_page(env):
    from agent.schema import Action
    from trainer.sandbox.env import ActionSpace
    from trainer.sandbox.miniwob_env import allowed_keys, key_index

    keys = allowed_keys()
    assert all(keys[key_index(k)] == miniwob_key(k) for k in ActionSpace.KEYS + ("shift tab", "home", "end", "A"))
    with pytest.raises(ValueError, match="cannot press 'f5'"):
        key_index("f5")

    env.reset(seed=0, options={"family": "enter-text"})
    env.step(env.expert_action()[1])  # the oracle clicks into the field
    for key in ActionSpace.KEYS:  # none raises, none is refused
        obs, _, term, trunc, info = env.step(Action("hotkey", {"key": key}))
        assert "action_error" not in info, (key, info)
        if term or trunc:
            break
    # keys and letters arrive as typed: case kept, backspace, select-all then type over
    env.reset(seed=1, options={"family": "enter-text"})
    env.step(env.expert_action()[1])
    for a in (Action("type", {"content": "ab"}), Action("hotkey", {"key": "shift c"}), Action("hotkey", {"key": "Z"}),
              Action("hotkey", {"key": "backspace"})):
        env.step(a)
    assert _value(env, "tt") == "abC"
    env.step(Action("hotkey", {"key": "ctrl a"}))
    env.step(Action("type", {"content": "x"}))
    assert _value(env, "tt") == "x"
    # a key MiniWoB++ cannot press is the agent's mistake: a value naming the key, the episode goes on
    _, reward, term, trunc, info = env.step(Action("hotkey", {"key": "ctrl shift t"}))
    assert "cannot press 'ctrl shift t'" in info["action_error"] and not (term or trunc)
    _, _, _, _, info = env.step(Action("right_single", {"start_box": (0.5, 0.5)}))
    assert info["action_error"] == "right_single: MiniWoB++ has no right click"


@needs_miniwob
@pytest.mark.filterwarnings("ignore:.*alternative render modes")  # no gymnasium.make spec, as SandboxEnv's check
def test_gymnasium_env_checker(env):
    from gymnasium.utils import env_checker as ec

    # gymnasium's check_env, all but check_step_determinism: MiniWoB++ pages run on the real clock
    # (their episode timer, animations), so under load one step's info (what the screenshot caught)
    # can differ between two runs of the same seed and action; the same seed still gives the same page
    ec.check_action_space(env.action_space)
    ec.check_observation_space(env.observation_space)
    ec.check_seed_deprecation(env)
    ec.check_reset_return_info_deprecation(env)
    ec.check_reset_return_type(env)
    ec.check_reset_seed_determinism(env)
    ec.check_reset_options(env)
    ec.env_reset_passive_checker(env)
    ec.env_step_passive_checker(env, env.action_space.sample())
    obs, info = env.reset(seed=4, options={"family": "miniwob/focus-text"})
    assert obs in env.observation_space and obs["screenshot"].shape == (210, 160, 3)
    assert info["family"] == "miniwob/focus-text" and info["instruction"] == "Focus into the textbox."


@needs_miniwob
def test_the_episode_runner_plays_miniwob_with_the_oracle(env):
    from trainer.rollout.actors import ExpertActor
    from trainer.rollout.runner import run_episode

    traj = run_episode(ExpertActor(env), env, 3, family="miniwob/click-checkboxes", greedy=True)
    assert traj.family == "miniwob/click-checkboxes" and traj.instruction.startswith("Select ")
    assert traj.success and traj.terminated and not traj.truncated and traj.progress == 1.0
    assert all(t.parse_error is None for t in traj.turns) and traj.turns[-1].action == "click"
    assert traj.turns[-1].reward == 1.0 and sum(t.reward for t in traj.turns) == 1.0


@needs_miniwob
def test_a_wrong_answer_fails_and_a_step_limit_truncates(env):
    from agent.schema import Action
    from trainer.sandbox.miniwob_oracle import element_box

    for seed in range(20):  # the first page with a button to get wrong
        env.reset(seed=seed, options={"family": "click-button"})
        target = dict(env._raw["fields"])["target"]
        wrong = [e for e in env._raw["dom_elements"] if e["tag"] == "button" and e["text"] != target]
        if wrong:
            break
    x0, y0, x1, y1 = element_box(wrong[0])
    _, reward, term, trunc, info = env.step(Action("click", {"start_box": ((x0 + x1) / 2, (y0 + y1) / 2)}))
    assert (reward, term, trunc, info["success"], info["status"]) == (0.0, True, False, False, "failed")
    env.reset(seed=0, options={"family": "click-dialog"})
    for _ in range(env.max_steps):
        _, _, term, trunc, info = env.step(Action("wait", {}))
    assert (term, trunc, info["steps"]) == (False, True, env.max_steps)


@needs_miniwob
def test_the_episode_clock_is_configurable():
    from trainer.sandbox.miniwob_env import MiniWoBEnv

    env = MiniWoBEnv("click-test", episode_seconds=1.0)
    try:
        _, info = env.reset(seed=0)
        assert info["episode_seconds"] == 1.0
        time.sleep(1.3)
        _, reward, term, trunc, info = env.step(env.expert_action()[1])
        # MiniWoB's clock ran out before the click: a time limit (truncated), not a verdict
        assert (reward, term, trunc, info["reason"]) == (0.0, False, True, "timed out")
        env.episode_seconds = None
        _, info = env.reset(seed=0)
        assert info["episode_seconds"] == 10.0  # click-test's own
    finally:
        env.close()


@needs_miniwob
def test_oracle_and_random_through_the_cli(capsys):
    from main import main

    assert main(["sandbox", "eval", "--suite", "miniwob", "--tasks", ",".join(SIX), "--policy", "oracle",
                 "--episodes", "12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["overall"] == 1.0 and set(out["families"]) == {f"miniwob/{t}" for t in SIX}
    assert out["intervals"]["overall"]["episodes"] == 12 and out["intervals"]["overall"]["ci95"][0] > 0.7
    assert out["suite"] == "miniwob"
    assert main(["sandbox", "eval", "--suite", "miniwob", "--tasks", ",".join(SIX), "--policy", "random",
                 "--episodes", "6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["intervals"]["overall"]["episodes"] == 6 and 0.0 <= out["overall"] <= 1.0
    assert main(["sandbox", "eval", "--suite", "miniwob", "--tasks", "clik-test", "--policy", "oracle",
                 "--episodes", "1"]) == 2
    assert "unknown MiniWoB++ task 'clik-test'; did you mean click-test" in capsys.readouterr().err
    assert main(["sandbox", "eval", "--suite", "miniwob", "--tasks", "book-flight", "--policy", "oracle",
                 "--episodes", "1"]) == 2
    assert "the oracle does not know book-flight" in capsys.readouterr().err


@needs_miniwob
def test_the_flywheel_reports_miniwob_apart():
    from trainer.flywheel.evaluation import MINIWOB_EPISODE_SECONDS, evaluate_on_miniwob
    from trainer.rollout.actors import Actor, ActorOutput

    class Waits(Actor):  # a model that always waits
        def generate(self, messages, *, greedy=False):
            return ActorOutput("Thought: wait for it\nAction: wait()")

    out = evaluate_on_miniwob(Waits(), 1, max_steps=2)
    assert set(out["families"]) == {f"miniwob/{t}" for t in SIX}
    assert out["overall"]["episodes"] == 6 and out["overall"]["success"] == 0.0
    assert out["episode_seconds"] == MINIWOB_EPISODE_SECONDS and "never trained on" in out["note"]


@needs_miniwob
def test_chromium_is_reaped_after_close_a_hang_and_sigkill():
    from trainer.sandbox.miniwob_env import MiniWoBEnv

    # a reset that hangs in core.endEpisode is cut at reset_timeout, its Chromium killed, a fresh one used
    env = MiniWoBEnv("click-test", reset_timeout=3, step_timeout=2)
    try:
        env.reset(seed=0)
        hung = env.browser.pgid
        assert len(group_processes(hung)) >= 3  # watchdog, chromedriver, Chromium's processes
        busy = "var t = Date.now(); while (Date.now() - t < 60000) {}"  # a minute of JavaScript that never yields
        env.driver.execute_script(f"core.endEpisode = function () {{ {busy} }};")
        t0 = time.monotonic()
        _, info = env.reset(seed=1)
        assert time.monotonic() - t0 < 25 and env.restarts == 1 and info["instruction"] == "Click the button."
        assert gone(hung, 0.5) and env.browser.pgid != hung
        # a step that hangs: cut at step_timeout, reported (truncated, with the error), the browser reaped
        stuck = env.browser.pgid
        env.driver.execute_script(f"document.addEventListener('mousedown', function () {{ {busy} }});")
        _, _, term, trunc, info = env.step(env.expert_action()[1])
        assert (term, trunc) == (False, True) and "did not finish within 2 s; Chromium was killed" in info["error"]
        assert gone(stuck, 0.5)
        env.reset(seed=2)
        last = env.browser.pgid
    finally:
        env.close()
    assert gone(last, 0.5)  # close() leaves nothing running

    # the parent killed with SIGKILL: the watchdog still takes the whole browser down
    code = ("from trainer.sandbox.miniwob_env import MiniWoBEnv\nenv = MiniWoBEnv('click-test')\nenv.reset(seed=0)\n"
            "print(env.browser.pgid, flush=True)\nimport time\ntime.sleep(120)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child = subprocess.Popen([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        pgid = int(child.stdout.readline())
        assert len(group_processes(pgid)) >= 3
    finally:
        child.kill()
        child.wait()
    assert gone(pgid, 10.0)
