"""The agent CLI and the terminal supervisor: real argument parsing, real stdin/stdout text,
the fake phone for the steps; plus the rule that importing the agent runtime loads no back end."""
from __future__ import annotations

import io
import subprocess
import sys

from agent import coords
from agent.executors.android import AndroidExecutor
from agent.policies import ReplayPolicy
from agent.run.gate import Gate
from agent.run.loop import AgentLoop
from agent.run.terminal_supervisor import TerminalSupervisor
from tests.conftest import ROOT
from tests.fake_android import HEIGHT, WIDTH, FakePhoneServer, connect_fake


def test_importing_the_runtime_loads_no_backend():
    code = ("import sys, agent.run.loop, agent.run.gate, agent.policies, agent.executors, agent.host.killswitch, agent.run.cli, "
            "agent.executors.desktop, agent.executors.android, agent.executors.terminal; "
            "bad = [m for m in ('pyautogui', 'pynput', 'mss', 'uiautomator2', 'torch', 'transformers', 'PySide6') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout + r.stderr


def test_cli_errors_name_the_missing_option(tmp_path):
    r = subprocess.run([sys.executable, "main.py", "agent", "--data", str(tmp_path), "--instruction", "x", "--policy", "endpoint"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "--base-url and --model" in r.stderr
    r = subprocess.run([sys.executable, "main.py", "agent", "--data", str(tmp_path), "--instruction", "x", "--policy", "replay",
                        "--responses", str(tmp_path / "nope.jsonl")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "nope.jsonl" in r.stderr


def test_terminal_supervisor_edit_reject_and_takeover(store):
    sw, sh = coords.smart_resize(HEIGHT, WIDTH)[::-1]
    # the field's centre (270, 240) in model space; the human moves it onto the button at (270, 550)
    fx, fy = round(270 / WIDTH * sw), round(240 / HEIGHT * sh)
    answers = "\n".join([
        "x",                                    # unknown answer: asked again
        "e", "click(start_box='(270,550)')", "Press the button instead.",  # edit, in screen pixels
        "r the field is not needed",           # reject the second proposal
        "t", "press_back()", "going back", "", "y",  # take over: one action, then resume
        "a",                                     # approve finished
    ]) + "\n"
    out = io.StringIO()
    sup = TerminalSupervisor(io.StringIO(answers), out, name="ann")
    with FakePhoneServer() as server:
        ex = AndroidExecutor(connect_fake(server), settle=0)
        click = f"Thought: Tap the field.\nAction: click(start_box='({fx},{fy})')"
        policy = ReplayPolicy([click, click, click, "Action: finished()"], platform="android")
        res = AgentLoop(policy, ex, store=store, gate=Gate("all", sup)).run("press the button")
        ex.close()
        ph = server.phone
    text = out.getvalue()
    assert "action:  click(start_box='(270,240)')   [screen pixels]" in text and "unknown answer 'x'" in text
    ep = store.load_episode(res.episode.id)
    assert [(s.action.name, s.provenance.source) for s in ep.steps] == [
        ("click", "corrected"), ("press_back", "human"), ("finished", "agent")]
    assert ep.steps[0].thought == "Press the button instead." and ep.steps[0].provenance.decided_by == "ann"
    assert ep.steps[2].info["rejections"][0]["reason"] == "the field is not needed"
    assert ph.button_presses == 1 and ph.focused is None and ph.keys == ["back"]


def test_end_of_input_stops_instead_of_approving(store):
    out = io.StringIO()
    sup = TerminalSupervisor(io.StringIO(""), out)
    with FakePhoneServer() as server:
        ex = AndroidExecutor(connect_fake(server), settle=0)
        res = AgentLoop(ReplayPolicy(["Action: press_home()"], platform="android"), ex, store=store,
                        gate=Gate("all", sup)).run("home")
        ex.close()
        assert server.phone.keys == []
    assert res.reason.startswith("stopped by the supervisor") and res.steps == 0
