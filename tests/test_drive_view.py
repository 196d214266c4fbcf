"""The Drive page offscreen (pytest-qt) on a real sandbox task: a risky step waits for the
confirmation dialog (on top), a refusal is stored with its reason and the policy is asked
again; Pause holds the agent before its next action; Stop while paused ends the run."""
from __future__ import annotations

import time

import pytest
from PySide6.QtCore import Qt

from agent import coords
from agent.grammar import format_normalized
from agent.policies import ReplayPolicy
from agent.run.loop import LoopConfig
from agent.schema import Action
from agent.sync.outbox import Outbox
from app.drive_view import DrivePage
from app.sandbox_executor import SandboxProcessExecutor


@pytest.fixture
def sandbox():
    ex = SandboxProcessExecutor("click_button", 3)
    instruction = ex.prepare()
    yield ex, instruction, ex.expert_action()[1]
    ex.close()


@pytest.fixture
def page(qtbot, store):
    p = DrivePage(store)
    qtbot.addWidget(p)
    p.show()
    yield p
    p.shutdown()


def click(action):
    return format_normalized("Press it.", [action], coords.SMART_RESIZE, 320, 240)


def test_risky_step_asks_on_top_and_a_refusal_is_kept(qtbot, page, sandbox, store):
    ex, instruction, expert = sandbox
    policy = ReplayPolicy(["Thought: Close this window.\nAction: hotkey(key='ctrl w')", click(expert)], platform="sandbox")
    page.start_run(policy, ex, instruction, gate="risky", config=LoopConfig(max_steps=5))
    assert page.strip.isVisible()
    qtbot.waitUntil(lambda: page.dialog is not None, timeout=15000)
    dlg = page.dialog
    assert dlg.windowFlags() & Qt.WindowStaysOnTopHint and dlg.isVisible()
    assert "risky action: hotkey 'ctrl w'" in dlg.head.text()
    assert dlg.canvas._action == Action("hotkey", {"key": "ctrl w"})
    assert dlg.buttons["Don't allow"].isDefault() and not dlg.buttons["Allow"].isDefault()
    qtbot.keyClick(dlg, Qt.Key_Return)  # Enter is the safe answer, not Allow
    qtbot.waitUntil(lambda: page.last_result is not None, timeout=15000)
    ep = store.load_episode(page.last_result.episode.id)
    assert ex.success and policy.position == 2
    assert ep.steps[0].info["rejections"][0]["reason"] == "the user did not allow this step"
    # the agent drove (risky gate); the person's answer makes it training data, so it is queued
    assert ep.kind == "autonomous" and Outbox(store).get(ep.id).state == "queued"
    log = [page.steps.item(i).text() for i in range(page.steps.count())]
    assert log[0] == "✗ not allowed: hotkey(key='ctrl w') (the user did not allow this step)" and log[1].startswith("1. click(")
    assert "the task ended after the agent's click" in page.status.text()  # not the bare action name
    assert not page.strip.isVisible()


def test_the_strip_says_when_the_model_s_reply_did_not_parse(qtbot, page, sandbox):
    """The strip showed the parser's message ("no 'Action:' line ...") as the agent's action."""
    ex, instruction, expert = sandbox
    shown = []
    real = page.strip.set_step
    page.strip.set_step = lambda thought, action, detail="": (shown.append((action, detail)), real(thought, action, detail))
    page.start_run(ReplayPolicy(["Sure, I will press the button for you.", click(expert)], platform="sandbox"), ex,
                   instruction, gate="auto", config=LoopConfig(max_steps=3))
    qtbot.waitUntil(lambda: page.last_result is not None, timeout=15000)
    (said, why), (then, _) = [s for s in shown if s[0]][:2]
    assert said == "the model's reply did not parse; asking again" and why and why != said
    assert then.startswith("click(")


def test_pause_holds_the_agent_and_resume_lets_it_go(qtbot, page, sandbox, store):
    ex, instruction, expert = sandbox
    page.strip.pause_btn.setChecked(True)  # paused before the first action
    run = page.start_run(ReplayPolicy([click(expert)], platform="sandbox"), ex, instruction, gate="auto")
    page.strip.pause_btn.setChecked(True)
    time.sleep(0.8)
    qtbot.wait(50)
    assert run.loop is not None and run.loop.episode.steps == [] and not ex.success
    assert page.strip.state.text() == "Paused"
    qtbot.mouseClick(page.strip.pause_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.last_result is not None, timeout=15000)
    assert ex.success and page.last_result.episode.kind == "autonomous"


def test_stop_while_paused_executes_nothing(qtbot, page, sandbox, store):
    ex, instruction, expert = sandbox
    run = page.start_run(ReplayPolicy([click(expert)], platform="sandbox"), ex, instruction, gate="auto")
    page.strip.pause_btn.setChecked(True)
    qtbot.waitUntil(lambda: run.loop is not None, timeout=15000)
    qtbot.mouseClick(page.strip.stop_btn, Qt.LeftButton)
    qtbot.waitUntil(lambda: page.last_result is not None, timeout=15000)
    assert page.last_result.reason == "stopped by the user" and page.last_result.steps == 0 and not ex.success


def test_drive_an_android_phone_chosen_in_the_form(qtbot, page, store, tmp_path, monkeypatch):
    """Acts on: an Android phone, by serial. The phone is the fake that speaks uiautomator2's
    JSON-RPC; everything from the form to the device calls is the real path."""
    import json

    import uiautomator2

    from tests.fake_android import HEIGHT, WIDGETS, WIDTH, FakePhoneServer, connect_fake

    (l, t, r, b), _, _ = WIDGETS["field"]
    field = ((l + r) / 2 / WIDTH, (t + b) / 2 / HEIGHT)
    responses = [format_normalized("Tap the field.", [Action("click", {"start_box": field})], coords.SMART_RESIZE, WIDTH, HEIGHT),
                 format_normalized("Type.", [Action("type", {"content": "hi there"})], coords.SMART_RESIZE, WIDTH, HEIGHT),
                 format_normalized("Done.", [Action("finished", {"content": "typed"})], coords.SMART_RESIZE, WIDTH, HEIGHT)]
    path = tmp_path / "responses.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in responses))
    with FakePhoneServer() as server:
        asked = []
        monkeypatch.setattr(uiautomator2, "connect", lambda serial=None: asked.append(serial) or connect_fake(server))
        f = page.form
        assert f.serial.isHidden()
        f.set_choice(f.executor, "android")
        assert not f.serial.isHidden()
        f.serial.setText("R58M123ABC")
        f.set_choice(f.policy, "replay")
        f.replay_path.setText(str(path))
        f.set_choice(f.gate, "auto")
        f.instruction.setText("Write hi there in the field")
        qtbot.mouseClick(page.start_btn, Qt.LeftButton)
        qtbot.waitUntil(lambda: page.last_result is not None, timeout=20000)
        assert asked == ["R58M123ABC"]
        assert server.phone.text["field"] == "hi there"
    ep = store.load_episode(page.last_result.episode.id)
    assert [s.action.name for s in ep.steps] == ["click", "type", "finished"]
    assert ep.steps[0].observation.geometry.logical_width == WIDTH
    assert store.get_setting("drive.executor") == "android" and store.get_setting("drive.serial") == "R58M123ABC"


def test_the_form_warns_before_the_sandbox_model_drives_a_real_desktop(qtbot, page):
    f = page.form
    # with the default small model, Drive starts on a sandbox task, where that model can act
    assert f.policy.currentData() == "default" and f.executor.currentData() == "sandbox" and f.warning.isHidden()
    f.set_choice(f.policy, "endpoint")
    assert f.executor.currentData() == "desktop"  # a real model: this desktop, until someone chooses
    f.set_choice(f.policy, "default")
    f.set_choice(f.executor, "desktop")
    assert not f.warning.isHidden() and "learned only Tandem's sandbox tasks" in f.warning.text()
    f.set_choice(f.policy, "endpoint")
    assert f.warning.isHidden()
    assert page.steps.isHidden() and not page.steps_empty.isHidden()  # not an empty white box
