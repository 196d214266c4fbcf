"""The Supervise page, driven like a supervisor would (pytest-qt, offscreen): a replay policy acts
on a real sandbox task (real Qt widgets in a child process, verified by the task's own checker);
the human approves, edits by clicking on the screenshot, rejects with a reason, takes over."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, Qt

from agent import coords
from agent.grammar import format_normalized
from agent.policies import ReplayPolicy
from agent.run.loop import LoopConfig
from agent.schema import Action
from agent.sync.outbox import Outbox
from app.sandbox_executor import SandboxProcessExecutor
from app.supervise_view import SupervisePage

FAMILY, SEED = "click_button", 3
EMPTY = (0.03, 0.97)  # a corner of the task window with no widget: a click there changes nothing


def text(thought: str, action: Action) -> str:
    return format_normalized(thought, [action], coords.SMART_RESIZE, 320, 240)


@pytest.fixture
def sandbox():
    ex = SandboxProcessExecutor(FAMILY, SEED)
    instruction = ex.prepare()
    thought, action = ex.expert_action()
    yield ex, instruction, action.args["start_box"]
    ex.close()


@pytest.fixture
def page(qtbot, store):
    p = SupervisePage(store, name="alice")
    qtbot.addWidget(p)
    p.resize(1400, 900)
    p.show()
    qtbot.waitExposed(p)
    yield p
    p.shutdown()


def start(page, sandbox, responses):
    ex, instruction, _ = sandbox
    policy = ReplayPolicy(responses, platform="sandbox")
    run = page.start_run(policy, ex, instruction, gate="all", config=LoopConfig(max_steps=6, kind="supervised"))
    return run, policy


def wait_for_proposal(qtbot, page, n=1):
    qtbot.waitUntil(lambda: len(page.displays) >= n and page.panel.pending is not None, timeout=15000)
    return page.panel.pending


def wait_end(qtbot, page):
    qtbot.waitUntil(lambda: page.last_result is not None, timeout=20000)
    return page.store.load_episode(page.last_episode_id)


def click_canvas_at(qtbot, page, point):
    x, y = page.panel.canvas.point_to_widget(point)
    qtbot.mouseClick(page.panel.canvas, Qt.LeftButton, pos=QPoint(round(x), round(y)))


def test_approve_with_enter_executes_and_stores_an_agent_step(qtbot, page, sandbox, store):
    ex, instruction, target = sandbox
    start(page, sandbox, [text("Click the button.", Action("click", {"start_box": target}))])
    pending = wait_for_proposal(qtbot, page)
    drawn = page.panel.canvas._action  # the proposal is drawn (through model space: within a pixel)
    assert drawn.name == "click" and all(abs(a - b) * 320 < 1.5 for a, b in zip(drawn.args["start_box"], target, strict=True))
    assert "Click the button." in page.panel.thought.toPlainText()
    qtbot.keyClick(page.panel, Qt.Key_Return)
    ep = wait_end(qtbot, page)
    assert ex.success, "the sandbox's verifier did not see the button clicked"
    assert ep.kind == "supervised" and ep.instruction == instruction
    s0 = ep.steps[0]
    assert s0.provenance.source == "agent" and s0.provenance.decision == "approve"
    assert s0.provenance.decided_by == "alice" and s0.provenance.decision_seconds is not None
    assert ep.meta["decisions"][0]["kind"] == "approve"
    assert Outbox(store).get(ep.id).state == "queued"  # queued for sync like a recording
    assert pending.request.why == "every step is reviewed"


def test_edit_by_clicking_on_the_screenshot_stores_the_screen_point(qtbot, page, sandbox, store):
    ex, _, target = sandbox
    start(page, sandbox, [text("The button is down here.", Action("click", {"start_box": EMPTY}))])
    wait_for_proposal(qtbot, page)
    click_canvas_at(qtbot, page, target)
    assert page.panel.approve_btn.text().startswith("Approve with edits")
    page.panel.thought.setPlainText("The target button is in the middle.")
    qtbot.keyClick(page.panel, Qt.Key_Return)
    ep = wait_end(qtbot, page)
    assert ex.success
    s0 = ep.steps[0]
    assert s0.provenance.source == "corrected" and s0.provenance.decision == "edit"
    geometry = s0.observation.geometry
    want = coords.normalized_to_screen(target, geometry)
    got = coords.normalized_to_screen(s0.action.args["start_box"], geometry)
    assert abs(got[0] - want[0]) <= 1 and abs(got[1] - want[1]) <= 1, (got, want)
    # the proposal is kept beside the correction: a preference pair
    assert coords.normalized_to_screen(s0.provenance.proposal_action.args["start_box"], geometry) == \
        coords.normalized_to_screen(EMPTY, geometry)
    assert s0.thought == "The target button is in the middle."
    assert s0.provenance.proposal_thought == "The button is down here."
    assert ep.meta["decisions"][0]["kind"] == "edit" and ep.meta["decisions"][0]["proposed"] == "click"


def test_reject_with_a_reason_asks_the_policy_again(qtbot, page, sandbox, store):
    ex, _, target = sandbox
    _, policy = start(page, sandbox, [text("Click the corner.", Action("click", {"start_box": EMPTY})),
                                      text("Click the button.", Action("click", {"start_box": target}))])
    wait_for_proposal(qtbot, page)
    qtbot.keyClick(page.panel, Qt.Key_R)
    assert page.panel.reason.hasFocus()
    qtbot.keyClicks(page.panel.reason, "there is nothing in that corner")
    said = []  # what the panel shows the moment the answer leaves: a confirmation and a moving bar
    page.panel.answered.connect(lambda *_: said.append((page.panel.title.text(), page.panel.busy.isVisible())))
    qtbot.keyClick(page.panel.reason, Qt.Key_Return)
    assert said == [("Rejection recorded (“there is nothing in that corner”): the agent is asked again. "
                     "Waiting for the agent…", True)]
    wait_for_proposal(qtbot, page, n=2)
    assert page.panel.busy.isHidden()  # a proposal on screen: nothing to wait for
    # the Decisions tab counts the run while it goes on, and its rate names what it is over
    assert page.decisions.stats.counts == {"reject": 1}
    assert page.decisions.summary.text() == "1 decision over 1 run; 0 of 1 proposal answered approved as proposed (0%)."
    assert policy.position == 2  # asked again
    assert page.panel.thought.toPlainText() == "Click the button."
    qtbot.keyClick(page.panel, Qt.Key_Return)
    ep = wait_end(qtbot, page)
    assert ex.success
    rejected = ep.steps[0].info["rejections"]
    assert rejected[0]["reason"] == "there is nothing in that corner" and rejected[0]["by"] == "alice"
    assert [d["kind"] for d in ep.meta["decisions"]] == ["reject", "approve"]
    assert "rejected" in policy.last_messages[-1]["content"][-1]["text"] or any(
        "there is nothing in that corner" in str(m["content"]) for m in policy.last_messages)


def test_take_over_runs_the_humans_steps_and_hands_back(qtbot, page, sandbox, store):
    ex, _, target = sandbox
    start(page, sandbox, [text("Click the corner.", Action("click", {"start_box": EMPTY})), "Thought: done\nAction: finished()"])
    wait_for_proposal(qtbot, page)
    qtbot.keyClick(page.panel, Qt.Key_T)
    assert page.panel.compose
    click_canvas_at(qtbot, page, target)
    page.panel.thought.setPlainText("I will press it myself.")
    qtbot.keyClick(page.panel, Qt.Key_Return)  # run my steps and hand back
    ep = wait_end(qtbot, page)  # my click solved the task: the environment ends the run, the agent is not asked again
    assert ex.success
    human = ep.steps[0]
    assert human.provenance.source == "human" and human.provenance.decision == "takeover"
    assert human.thought == "I will press it myself."
    got = coords.normalized_to_screen(human.action.args["start_box"], human.observation.geometry)
    want = coords.normalized_to_screen(target, human.observation.geometry)
    assert abs(got[0] - want[0]) <= 1 and abs(got[1] - want[1]) <= 1
    assert len(ep.steps) == 1 and ep.steps[0].terminated and ep.meta["end_reason"] == "click (by the human)"
    assert page.decisions.stats.counts.get("takeover") == 1
    assert page.decisions.summary.text() == ("1 decision over 1 run; 0 of 0 proposals answered approved as proposed "
                                             "(–).")  # a takeover answers no proposal


def test_start_from_the_form_with_a_replay_file(qtbot, page, store, tmp_path):
    ex = SandboxProcessExecutor(FAMILY, SEED)
    try:
        ex.prepare()
        target = ex.expert_action()[1].args["start_box"]
    finally:
        ex.close()
    import json

    path = tmp_path / "responses.jsonl"
    path.write_text(json.dumps(text("Click it.", Action("click", {"start_box": target}))) + "\n")
    f = page.form
    f.set_choice(f.policy, "replay")
    f.replay_path.setText(str(path))
    f.set_choice(f.executor, "sandbox")
    f.family.setCurrentText(FAMILY)
    f.seed.setValue(SEED)
    qtbot.mouseClick(page.start_btn, Qt.LeftButton)
    wait_for_proposal(qtbot, page)
    qtbot.mouseClick(page.panel.approve_btn, Qt.LeftButton)
    ep = wait_end(qtbot, page)
    assert ep.steps[0].provenance.decision == "approve" and "Undo" in ep.instruction
    assert store.get_setting("supervise.policy") == "replay"


def test_bad_choices_are_named_not_raised(qtbot, page):
    f = page.form
    f.set_choice(f.executor, "desktop")
    assert f.seed_label.isHidden() and f.family.isHidden()  # the sandbox's choices show only for the sandbox
    f.set_choice(f.policy, "endpoint")
    f.set_choice(f.executor, "sandbox")
    assert not f.seed_label.isHidden() and not f.seed.isHidden()
    page.start_from_form()
    assert "base URL" in page.run_label.text() and page.run is None


def test_a_second_run_can_start_after_the_first_ends(qtbot, page, store):
    """After a run ends (by itself or with Stop run) Start run is enabled again and Stop is not;
    a second run starts, is stopped with real clicks, and the page is ready for a third."""
    for k in range(2):
        ex = SandboxProcessExecutor(FAMILY, SEED + k)
        instruction = ex.prepare()
        policy = ReplayPolicy([text("Click.", Action("click", {"start_box": (0.5, 0.5)}))] * 3, platform="sandbox")
        page.last_result = None
        page.start_run(policy, ex, instruction, gate="all", config=LoopConfig(max_steps=6, kind="supervised"))
        assert not page.start_btn.isEnabled() and page.stop_btn.isEnabled()
        wait_for_proposal(qtbot, page)
        if k == 0:
            qtbot.keyClick(page.panel, Qt.Key_Return)  # approve: the run goes on, then stop it
        qtbot.mouseClick(page.stop_btn, Qt.LeftButton)
        wait_end(qtbot, page)
        qtbot.waitUntil(lambda: page.start_btn.isEnabled(), timeout=5000)
        assert not page.stop_btn.isEnabled()


def test_the_end_of_a_sandbox_run_says_whether_the_task_succeeded(qtbot, page, sandbox, store):
    """The sandbox verifies the task; the page says so and the episode keeps the verdict (the
    Library showed 'unknown' before)."""
    ex, instruction, target = sandbox
    start(page, sandbox, [text("Click the button.", Action("click", {"start_box": target}))])
    wait_for_proposal(qtbot, page)
    qtbot.keyClick(page.panel, Qt.Key_Return)
    ep = wait_end(qtbot, page)
    assert ep.outcome.success is True and ep.outcome.source == "verifier"
    assert "verifier says the task succeeded" in page.panel.title.text()


def test_an_installation_without_torch_offers_the_endpoint_and_says_why(qtbot, store, monkeypatch):
    """The annotators' bundle has no torch: the form starts on the endpoint policy, the model
    choices are greyed out with the reason, and a saved "default" choice does not come back."""
    import app.agent_run as ar
    import app.run_form as rf
    from app.agent_run import RunSetupError, make_policy

    why = "This installation of Tandem has no torch, so it cannot run a model here"
    for module in (ar, rf):  # make_policy asks agent_run, the form asks run_form
        monkeypatch.setattr(module, "models_missing", lambda: why + ": use an endpoint.")
    store.set_setting("supervise.policy", "default")
    form = rf.RunForm(store, "supervise")
    qtbot.addWidget(form)
    assert form.policy.currentData() == "endpoint"
    i = form.policy.findData("default")
    assert not form.policy.model().item(i).isEnabled() and "needs the training extras" in form.policy.itemText(i)
    assert form.policy.itemData(i, Qt.ToolTipRole).startswith(why)
    with pytest.raises(RunSetupError, match="has no torch"):
        make_policy("default")
    for module in (ar, rf):  # make_policy asks agent_run, the form asks run_form
        monkeypatch.setattr(module, "models_missing", lambda: None)  # a full installation: nothing greyed out
    full = rf.RunForm(store, "supervise")
    qtbot.addWidget(full)
    assert full.policy.currentData() == "default" and full.policy.model().item(i).isEnabled()
    # the default small model starts where it learned to act, not on this desktop it would mostly miss
    assert full.executor.currentData() == "sandbox" and full.warning.isHidden()
    store.set_setting("supervise.executor", "desktop")  # a place chosen before is kept
    again = rf.RunForm(store, "supervise")
    qtbot.addWidget(again)
    assert again.executor.currentData() == "desktop" and not again.warning.isHidden()


def test_the_page_signs_as_the_backend_user_its_store_syncs_as(qtbot, store):
    """The backend stores a supervisor's corrections only in its own name: once the store has
    synced as a backend user (agent.sync.client records it), the page signs with that name rather
    than its configured one."""
    from agent.sync.client import SYNCED_USER

    store.set_setting("supervise.name", "Sam")
    pages = [SupervisePage(store)]
    store.set_setting(SYNCED_USER, "sup")
    pages.append(SupervisePage(store))
    for p in pages:
        qtbot.addWidget(p)
    assert [(p.name, p.panel.name) for p in pages] == [("Sam", "Sam"), ("sup", "sup")]
    for p in pages:
        p.shutdown()
