"""The Qt-free core of supervision: the wire form of requests and answers, the RemoteSupervisor
(waits on the loop's thread, answered from another thread), and the decision statistics."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from agent.executors.base import Frame
from agent.policies import ReplayPolicy
from agent.policies.base import Proposal
from agent.run.decision_stats import DecisionLog, decision_stats
from agent.run.gate import Decision, Gate, GateRequest, HumanStep, Takeover
from agent.run.loop import AgentLoop
from agent.run.supervision import (
    RemoteSupervisor,
    SupervisionError,
    answer_from_wire,
    answer_to_wire,
    request_from_wire,
    request_to_wire,
)
from agent.schema import Action, Episode, ScreenGeometry

GEO = ScreenGeometry(1280, 800, 2560, 1600, 2.0, origin_x=1920, origin_y=0)


def request(actions=None, thought="Open the menu."):
    px = np.zeros((1600, 2560, 3), np.uint8)
    px[100:200, 300:400] = (255, 0, 0)
    frame = Frame(geometry=GEO, pixels=px)
    p = Proposal(thought, actions or [Action("click", {"start_box": (0.25, 0.5)})], "raw", image_size=(2560, 1600),
                 policy_version="v3")
    return GateRequest("Do it", 4, p, frame, "every step is reviewed", episode_id="e1", platform="desktop")


def test_request_round_trips_through_the_wire():
    step, shot = request_to_wire(request())
    assert shot[:3] == b"\xff\xd8\xff"  # a JPEG travels, not raw pixels
    req, mode = request_from_wire(step, shot)
    assert mode == "decide" and req.step_index == 4 and req.why == "every step is reviewed"
    assert req.proposal.actions == [Action("click", {"start_box": (0.25, 0.5)})]
    assert req.observation.geometry == GEO and req.observation.size == (2560, 1600)
    assert req.proposal.policy_version == "v3" and req.episode_id == "e1"


def test_the_last_tool_output_travels_with_a_proposal():
    req = request([Action("run_command", {"command": "wc -l data.csv"})])
    req.observation.tool_output = {"tool": "run_command", "target": "ls", "exit_code": 2, "output": "ls: nope\n",
                                   "truncated": False}
    step, shot = request_to_wire(req)
    back, _ = request_from_wire(step, shot)
    assert back.observation.tool_output == req.observation.tool_output
    assert back.proposal.actions == [Action("run_command", {"command": "wc -l data.csv"})]
    with pytest.raises(SupervisionError, match="tool_output: exit_code must be an integer"):
        request_from_wire({**step, "tool_output": {**step["tool_output"], "exit_code": "2"}}, shot)


def test_bad_proposals_are_named():
    with pytest.raises(SupervisionError, match="unknown action 'fly'"):
        request_from_wire({"actions": [{"name": "fly"}]}, None)
    with pytest.raises(SupervisionError, match="mode"):
        request_from_wire({"mode": "dance"}, None)
    with pytest.raises(SupervisionError, match="not an image"):
        request_from_wire({"geometry": GEO.to_dict()}, b"garbage")


@pytest.mark.parametrize("answer", [
    Decision.approve(by="a", seconds=1.5),
    Decision.reject("wrong button", by="a", seconds=2.0),
    Decision.edit([Action("click", {"start_box": (0.1, 0.9)})], "Better.", by="a", seconds=3.0),
    Decision.edit(None, "Only the thought.", by="a"),
    Takeover([HumanStep("mine", Action("hotkey", {"key": "ctrl s"}))], resume=False, by="a"),
])
def test_answers_round_trip(answer):
    kind, step, reason = answer_to_wire(answer)
    back = answer_from_wire(kind, step, reason, "a")
    if isinstance(answer, Takeover):
        assert back.resume is False and back.steps[0].action == answer.steps[0].action and back.steps[0].thought == "mine"
    else:
        assert (back.kind, back.thought, back.actions, back.reason, back.seconds) == \
            (answer.kind, answer.thought, answer.actions, answer.reason, answer.seconds)


def test_unusable_answers_are_errors_with_reasons():
    with pytest.raises(SupervisionError, match="outside the screenshot"):
        answer_from_wire("edit", {"actions": [{"name": "click", "args": {"start_box": [2, 2]}}]}, None, "bob")
    with pytest.raises(SupervisionError, match="needs a reason"):
        answer_from_wire("reject", {}, "", "bob")


class Wire:
    """Answers each published proposal from another thread, like the I/O layer would."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.published = []
        self.sup = None

    def publish(self, pid, step, shot):
        self.published.append(step)
        if self.answers:
            kind, st, reason = self.answers.pop(0)
            threading.Timer(0.01, self.sup.deliver, (pid, kind, st, reason, "remote")).start()


def test_remote_supervisor_re_asks_after_an_unusable_answer():
    wire = Wire([("edit", {"actions": [{"name": "click", "args": {"start_box": [5, 5]}}]}, None), ("approve", {}, None)])
    wire.sup = sup = RemoteSupervisor(wire.publish)
    d = sup.decide(request())
    assert d.kind == "approve" and d.decided_by == "remote"
    assert len(wire.published) == 2 and "could not be used" in wire.published[1]["note"]
    assert sup.deliver("stale-id", "approve", {}, None, "x") is False


def test_remote_takeover_and_stop():
    wire = Wire([("takeover", {"steps": [{"thought": "t", "action": {"name": "wait", "args": {}}}], "resume": True}, None),
                 ("takeover", {"steps": [], "resume": False}, None)])
    wire.sup = sup = RemoteSupervisor(wire.publish)
    assert sup.decide(request()).kind == "takeover"
    tk = sup.take_over(request())
    assert tk.steps[0].action.name == "wait" and tk.resume and len(wire.published) == 1
    assert sup.decide(request()).kind == "stop"  # a takeover that does nothing and keeps control


def test_remote_supervisor_wait_ends_on_the_loops_stop():
    stop = threading.Event()
    sup = RemoteSupervisor(lambda *a: threading.Timer(0.05, stop.set).start(), stop_event=stop)
    assert sup.decide(request()).kind == "stop"


class _Frames:
    """A tiny in-memory executor of the executor shape (screens are numpy frames)."""

    platform = "desktop"

    def __init__(self):
        self.stop_event = threading.Event()
        self.done = []

    def _f(self):
        return Frame(geometry=ScreenGeometry.simple(64, 48), pixels=np.zeros((48, 64, 3), np.uint8))

    def reset(self, **kw):
        return self._f(), {}

    def step(self, action):
        self.done.append(action)
        return self._f(), 0.0, action.name == "finished", False, {}

    def observe(self):
        return self._f()

    def release(self):
        pass

    def close(self):
        pass


class Script:
    def __init__(self, answers):
        self.answers = list(answers)

    def decide(self, request):
        return self.answers.pop(0)

    def take_over(self, request):
        return Takeover([], True)


def test_decision_log_and_stats_over_real_runs():
    responses = ["Thought: a\nAction: click(start_box='(10,10)')", "Thought: b\nAction: type(content='x')",
                 "Thought: c\nAction: click(start_box='(20,20)')", "Thought: d\nAction: finished()"]
    sup = Script([Decision.approve(by="s", seconds=1.0), Decision.reject("no typing", by="s", seconds=3.0),
                  Decision.edit([Action("click", {"start_box": (0.5, 0.5)})], by="s", seconds=5.0),
                  Decision.approve(by="s", seconds=2.0)])
    loop = AgentLoop(ReplayPolicy(responses), _Frames(), gate=Gate("all", sup))
    loop.on_event = DecisionLog(loop)
    res = loop.run("go")
    assert res.reason == "finished"
    st = decision_stats([res.episode])
    assert st.counts == {"approve": 2, "reject": 1, "edit": 1}
    assert st.approval_rate == pytest.approx(0.5)
    assert st.edits_by_action == {"click": 1} and st.rejections_by_action == {"type": 1}
    assert sorted(st.seconds) == [1.0, 2.0, 3.0, 5.0] and st.seconds_quantile(0.5) == pytest.approx(2.5)  # the median, between the middle two
    # without the log, the steps' provenance and the kept rejections say the same (times of rejections aside)
    ep = Episode.from_dict(res.episode.to_dict())
    del ep.meta["decisions"]
    st2 = decision_stats([ep])
    assert st2.counts == st.counts and st2.edits_by_action == st.edits_by_action
    assert ("approval rate", "50%") in st.rows()


def test_stats_of_nothing():
    st = decision_stats([])
    assert st.decisions == 0 and st.approval_rate is None and st.seconds_quantile(0.5) is None


def test_terminal_windows_are_told_apart_from_others():
    from types import SimpleNamespace

    from agent.policies.base import Proposal
    from agent.run.gate import Gate, terminal_window

    def obs(title, app):
        return SimpleNamespace(extra={"focused_window": {"title": title, "app": app}})

    assert terminal_window(obs("bash", "XTerm")) == "XTerm"
    assert terminal_window(obs("me@host: ~/src", "gnome-terminal-server")) == "gnome-terminal-server"
    assert terminal_window(obs("Terminal - me@box", None)) == "Terminal - me@box"
    assert terminal_window(obs("Untitled - Notes", "gedit")) is None
    assert terminal_window(SimpleNamespace(extra={})) is None and terminal_window(None) is None

    class Ask:
        def decide(self, request):
            raise AssertionError("not used")

    typing = Proposal("type it", [Action("type", {"content": "ls\n"})], "", None)
    gate = Gate("risky", Ask())
    assert "terminal window (XTerm)" in gate.why_ask(typing, obs("bash", "XTerm"))
    assert gate.why_ask(typing, obs("Untitled - Notes", "gedit")) is None


@pytest.mark.parametrize("app,title", [("org.gnome.Console", "user@host: ~"), ("org.gnome.Ptyxis", "user@host: ~"),
                                       ("com.mitchellh.ghostty", "~"), ("Tabby", "bash"), ("Guake", "Guake!"),
                                       ("Tilda", "tilda"), ("kgx", "user@host: ~")])
def test_terminals_missing_from_the_name_list_are_on_it(app, title):
    from types import SimpleNamespace

    from agent.run.gate import terminal_window

    assert terminal_window(SimpleNamespace(extra={"focused_window": {"title": title, "app": app}})) is not None


def test_the_gate_judges_each_action_on_the_focus_it_is_shown():
    from types import SimpleNamespace

    def obs(**extra):
        return SimpleNamespace(extra=extra)

    gate = Gate("risky", object())
    shell = obs(focused_window={"title": "user@host: ~", "app": "Notes", "terminal": "bash runs under it"})
    editor = obs(focused_window={"title": "Untitled", "app": "gedit"})
    # a window no name gives away, whose process has a shell under it (agent.host.terminal_process)
    assert gate.risk(Action("type", {"content": "rm -rf ~\n"}), shell) == (
        "typing into a terminal window (Notes: bash runs under it): the text may run as a command")
    # keys pressed in a terminal run what was typed, or paste: asked too
    assert gate.risk(Action("hotkey", {"key": "enter"}), shell).startswith("pressing keys in a terminal window (Notes")
    assert gate.risk(Action("hotkey", {"key": "ctrl shift v"}), shell) is not None
    assert gate.risk(Action("click", {"start_box": (0.5, 0.5)}), shell) is None
    assert gate.risk(Action("type", {"content": "rm -rf ~\n"}), editor) is None
    assert gate.risk(Action("hotkey", {"key": "enter"}), editor) is None
    # where the focused window cannot be read (Windows, macOS, no DISPLAY), Enter is asked about
    unknown = obs(focus_unknown="the focused window is read on Linux/X11 only, not on darwin")
    assert "focused window is unknown (the focused window is read on Linux/X11 only, not on darwin)" in gate.risk(
        Action("type", {"content": "ls\n"}), unknown)
    assert gate.risk(Action("hotkey", {"key": "Return"}), unknown) is not None
    assert gate.risk(Action("type", {"content": "ls"}), unknown) is None
    # the proposal-level question is the first risky action's answer
    reply = Proposal("t", [Action("click", {"start_box": (0.5, 0.5)}), Action("type", {"content": "ls\n"})], "", None)
    assert gate.why_ask(reply, shell).startswith("typing into a terminal window")
    assert gate.why_ask(reply, editor) is None


def _process(code: str):
    """A real Python process running `code` in its own process group; returns it once one of its
    processes printed 'ready'."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_a_process_is_a_terminal_by_the_shell_under_it_or_the_pty_it_holds():
    """What agent.host.terminal_process reads from /proc, on real processes: a parent of bash (what a
    terminal emulator is), a grandparent of sh, a holder of a pseudo-terminal's master side, and
    none of these."""
    import os
    import signal

    from agent.host.terminal_process import terminal_evidence

    shell_parent = _process("import subprocess; c = subprocess.Popen(['bash', '--norc', '-c', 'sleep 60; true']); "
                            "print('ready', flush=True); c.wait()")
    middle = "import subprocess; c = subprocess.Popen(['sh', '-c', 'sleep 60; true']); print('ready', flush=True); c.wait()"
    grandparent = _process(f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {middle!r}]).wait()")
    pty_holder = _process("import os, time; m, s = os.openpty(); print('ready', flush=True); time.sleep(60)")
    plain = _process("import time; print('ready', flush=True); time.sleep(60)")
    try:
        assert terminal_evidence(shell_parent.pid) == "bash runs under it"
        assert terminal_evidence(grandparent.pid) == "sh runs under it"  # deeper down, as under a terminal's helper
        assert terminal_evidence(pty_holder.pid) == "it holds a pseudo-terminal"
        assert terminal_evidence(plain.pid) is None
        assert terminal_evidence(None) is None and terminal_evidence(2 ** 22 + 1) is None  # no such process
    finally:
        for p in (shell_parent, grandparent, pty_holder, plain):
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
