"""The agent loop with its gate, against the fake phone (real uiautomator2 wire protocol) and a
real store in tmp_path. Only the model is scripted (replay)."""
from __future__ import annotations

import threading
import time

import pytest

from agent import coords
from agent.executors.android import AndroidExecutor
from agent.executors.terminal import TerminalExecutor
from agent.host.killswitch import ControlIndicator, KillSwitch
from agent.policies import ReplayPolicy
from agent.run.gate import Decision, Gate, GateError, HumanStep, Takeover
from agent.run.loop import AgentLoop, LoopConfig
from agent.schema import Action
from tests.fake_android import HEIGHT, WIDGETS, WIDTH, FakePhoneServer, connect_fake

SW, SH = coords.smart_resize(HEIGHT, WIDTH)[1], coords.smart_resize(HEIGHT, WIDTH)[0]


def model_point(name):
    (l, t, r, b), _, _ = WIDGETS[name]
    return round((l + r) / 2 / WIDTH * SW), round((t + b) / 2 / HEIGHT * SH)


def click(name, thought=None):
    x, y = model_point(name)
    return f"Thought: {thought or 'Tap the ' + name + '.'}\nAction: click(start_box='<|box_start|>({x},{y})<|box_end|>')"


class Scripted:
    """A supervisor that answers from a list and remembers what it was asked."""

    def __init__(self, decisions, takeovers=()):
        self.decisions = list(decisions)
        self.takeovers = list(takeovers)
        self.asked = []

    def decide(self, request):
        self.asked.append(request)
        d = self.decisions.pop(0)
        return d(request) if callable(d) else d

    def take_over(self, request):
        self.asked.append(request)
        return self.takeovers.pop(0)


@pytest.fixture
def phone():
    with FakePhoneServer() as server:
        ex = AndroidExecutor(connect_fake(server), settle=0, wait_seconds=0.01)
        yield ex, server.phone
        ex.close()


def run(ex, responses, store, gate=None, **cfg):
    policy = ReplayPolicy(responses, platform="android")
    loop = AgentLoop(policy, ex, store=store, gate=gate, config=LoopConfig(**cfg))
    return loop, loop.run("Fill in the form")


def test_autonomous_run_records_every_step(phone, store):
    ex, ph = phone
    responses = [click("field"), "Thought: Type it.\nAction: type(content='hello\\n')", click("button"),
                 "Thought: Done.\nAction: finished(content='ok')"]
    loop, res = run(ex, responses, store)
    assert res.reason == "finished" and res.steps == 4
    assert ph.text["field"] == "hello" and ph.button_presses == 1
    ep = store.load_episode(res.episode.id)
    assert ep.kind == "autonomous" and ep.platform == "android" and ep.meta["end_reason"] == "finished"
    assert [s.action.name for s in ep.steps] == ["click", "type", "click", "finished"]
    assert ep.steps[-1].terminated and not ep.steps[-1].truncated
    assert all(s.provenance.source == "agent" and store.has_blob(s.observation.screenshot) for s in ep.steps)
    assert ep.steps[0].raw_response == responses[0] and ep.steps[0].info["screen_point"] == [270, 240]
    assert ep.steps[0].observation.width == WIDTH and "hierarchy" in ep.steps[0].observation.extra
    assert store.check() == []


def test_unparseable_output_is_reasked_and_never_executed(phone, store):
    ex, ph = phone
    responses = ["I would tap the button", "Action: click(start_box='(99999,5)')", click("button"),
                 "garbage", "more garbage", "still garbage"]
    loop, res = run(ex, responses, store, max_reasks=2)
    assert ph.button_presses == 1  # only the one that parsed
    ep = store.load_episode(res.episode.id)
    assert len(ep.steps) == 1
    fails = ep.steps[0].info["parse_failures"]
    assert [f["raw"] for f in fails] == responses[:2] and "outside" in fails[1]["reason"]
    # the re-ask told the policy why
    assert res.reason.startswith("unparseable output 3 times") and ep.steps[-1].truncated
    assert [f["raw"] for f in ep.meta["unexecuted"]["parse_failures"]] == responses[3:]
    calls_after = [c for c in ph.calls if c[0] not in ("takeScreenshot", "dumpWindowHierarchy", "deviceInfo")]  # reads
    assert calls_after == [("click", [270, 550])]
    assert loop.reask.max_reasks == 2 and not loop.reask.charge_step  # agent.run.reask's rule, shared with the runner


def test_reask_feedback_reaches_the_policy(phone, store):
    ex, ph = phone
    policy = ReplayPolicy(["nonsense", click("button"), "Action: finished()"], platform="android")
    seen = []
    orig = policy.generate
    policy.generate = lambda msgs: (seen.append(msgs), orig(msgs))[1]
    loop = AgentLoop(policy, ex, store=store)
    loop.run("press")
    from agent.policies.memory import message_text

    assert "could not be used: no 'Action:' section" in message_text(seen[1])
    assert "could not be used" not in message_text(seen[2])  # feedback is for the next answer only
    assert loop.episode.steps[0].info["parse_failures"][0]["reason"] == "no 'Action:' section in the response"


def test_edit_keeps_proposal_and_correction(phone, store):
    ex, ph = phone
    sup = Scripted([Decision.edit([Action("click", {"start_box": (270 / WIDTH, 550 / HEIGHT)})], thought="The button, not the field.", by="ann"),
                    Decision.approve(by="ann")])
    loop, res = run(ex, [click("field"), "Action: finished()"], store, gate=Gate("all", sup))
    assert ph.button_presses == 1 and ph.focused is None  # the corrected click ran, the proposal did not
    ep = store.load_episode(res.episode.id)
    assert ep.kind == "supervised"
    s0 = ep.steps[0]
    assert s0.provenance.source == "corrected" and s0.provenance.decision == "edit" and s0.provenance.decided_by == "ann"
    assert s0.thought == "The button, not the field." and s0.provenance.proposal_thought == "Tap the field."
    px, py = s0.provenance.proposal_action.args["start_box"]
    assert abs(px * WIDTH - 270) < 2 and abs(py * HEIGHT - 240) < 2
    assert s0.raw_response == click("field")
    assert ep.steps[1].provenance.source == "agent" and ep.steps[1].provenance.decision == "approve"
    assert sup.asked[0].why == "every step is reviewed"


def test_reject_asks_again_with_the_reason(phone, store):
    ex, ph = phone
    sup = Scripted([Decision.reject("Wrong widget: use the button.", by="sv"), Decision.approve(), Decision.approve()])
    policy = ReplayPolicy([click("field"), click("button"), "Action: finished()"], platform="android")
    seen = []
    orig = policy.generate
    policy.generate = lambda msgs: (seen.append(msgs), orig(msgs))[1]
    loop = AgentLoop(policy, ex, store=store, gate=Gate("all", sup))
    res = loop.run("press the button")
    assert ph.button_presses == 1 and ph.focused is None
    from agent.policies.memory import message_text

    assert "Reason: Wrong widget: use the button." in message_text(seen[1])
    rej = store.load_episode(res.episode.id).steps[0].info["rejections"][0]
    assert rej["reason"] == "Wrong widget: use the button." and rej["actions"][0]["name"] == "click"


def test_risky_gate_asks_for_password_typing_only(phone, store):
    ex, ph = phone
    sup = Scripted([Decision.reject("never type passwords", by="me"), Decision.approve()])
    responses = [click("password"), "Action: type(content='hunter2')", "Action: press_back()", "Action: finished()"]
    loop, res = run(ex, responses, store, gate=Gate("risky", sup))
    assert len(sup.asked) == 1 and sup.asked[0].why == "typing into a password field"
    assert ph.text["password"] == "" and ph.keys == ["back"]


def password_then(more: str) -> str:
    """One reply: tap the password field, then `more` (more actions in the grammar)."""
    x, y = model_point("password")
    return f"Thought: Fill in the password.\nAction: click(start_box='({x},{y})')\n\n{more}"


def test_one_reply_is_judged_action_by_action_on_the_focus_the_last_one_left(phone, store):
    """Issue 38: the gate judged a reply once, on the screen before its first action. A click that
    focuses the password field and a type in the same reply: asked about before the type."""
    ex, ph = phone
    sup = Scripted([Decision.reject("never type passwords", by="me")])
    loop, res = run(ex, [password_then("type(content='hunter2')"), "Action: finished()"], store, gate=Gate("risky", sup))
    assert ph.focused == "password" and ph.text["password"] == ""  # the click ran, the typing did not
    assert len(sup.asked) == 1 and sup.asked[0].why == "typing into a password field"
    assert [a.name for a in sup.asked[0].proposal.actions] == ["type"]  # what is left of the reply
    assert sup.asked[0].observation.extra["password_focused"] is True  # the screen after the click
    ep = store.load_episode(res.episode.id)
    assert [s.action.name for s in ep.steps] == ["click", "finished"]
    assert ep.steps[0].provenance.decision is None  # nobody was asked before the click
    assert ep.steps[1].info["rejections"][0]["actions"] == [Action("type", {"content": "hunter2"}).to_dict()]


def test_an_answer_in_the_middle_of_a_reply_covers_its_rest(phone, store):
    ex, ph = phone
    # approved: the rest of the reply runs, its steps carry the decision; the thought is recorded once
    sup = Scripted([Decision.approve(by="me")])
    bx, by = model_point("button")
    reply = password_then(f"type(content='hunter2')\n\nclick(start_box='({bx},{by})')")
    loop, res = run(ex, [reply, "Action: finished()"], store, gate=Gate("risky", sup))
    assert ph.text["password"] == "hunter2" and ph.button_presses == 1 and len(sup.asked) == 1
    ep = store.load_episode(res.episode.id)
    assert [s.action.name for s in ep.steps] == ["click", "type", "click", "finished"]
    assert [s.provenance.decided_by for s in ep.steps[:3]] == [None, "me", "me"]
    assert ep.steps[1].info["gate"] == "typing into a password field" and "gate" not in ep.steps[2].info
    assert [s.thought for s in ep.steps[:3]] == ["Fill in the password.", "", ""]
    assert ep.steps[0].raw_response == reply and ep.steps[1].raw_response is None
    # edited: the human's actions replace the rest of the reply
    ph.focused = "field"  # the password field lost focus in between
    ex2_sup = Scripted([Decision.edit([Action("click", {"start_box": (270 / WIDTH, 550 / HEIGHT)})], by="me")])
    loop, res = run(ex, [password_then("type(content='hunter3')"), "Action: finished()"], store, gate=Gate("risky", ex2_sup))
    assert ph.text["password"] == "hunter2" and ph.button_presses == 2
    s1 = store.load_episode(res.episode.id).steps[1]
    assert s1.provenance.source == "corrected" and s1.provenance.proposal_action == Action("type", {"content": "hunter3"})


def test_a_reply_of_thousands_of_actions_is_reasked_and_never_executed(phone, store):
    """Issue 38: the parser took 20,000 actions in one reply, and the loop ran them."""
    ex, ph = phone
    x, y = model_point("button")
    flood = "Action: " + "\n\n".join([f"click(start_box='({x},{y})')"] * 20_000)
    loop, res = run(ex, [flood, "Action: finished()"], store)
    assert ph.button_presses == 0 and res.reason == "finished"
    ep = store.load_episode(res.episode.id)
    assert [s.action.name for s in ep.steps] == ["finished"]
    assert ep.steps[0].info["parse_failures"][0]["reason"].startswith("the reply holds more than 16 actions")


def test_takeover_records_human_steps_then_resumes(phone, store):
    ex, ph = phone
    human = Takeover([HumanStep("I'll tap the button myself.", Action("click", {"start_box": (270 / WIDTH, 550 / HEIGHT)}))], resume=True, by="h")
    sup = Scripted([Decision("takeover", decided_by="h"), Decision.approve()], takeovers=[human])
    loop, res = run(ex, [click("field"), "Action: finished()"], store, gate=Gate("all", sup))
    ep = store.load_episode(res.episode.id)
    assert [s.provenance.source for s in ep.steps] == ["human", "agent"]
    assert ep.steps[0].provenance.decision == "takeover" and ep.steps[0].provenance.decided_by == "h"
    assert ph.button_presses == 1 and ph.focused is None and res.reason == "finished"


def test_call_user_hands_over_and_gates_everything_after(phone, store):
    ex, ph = phone
    human = Takeover([HumanStep("done by me", Action("press_back", {}), executed=True)], resume=True, by="h")
    sup = Scripted([Decision.approve(), Decision.approve()], takeovers=[human])
    loop, res = run(ex, ["Action: call_user()", click("button"), "Action: finished()"], store, gate=Gate("risky", sup))
    ep = store.load_episode(res.episode.id)
    assert [s.action.name for s in ep.steps] == ["call_user", "press_back", "click", "finished"]
    assert ep.steps[1].provenance.source == "human" and ph.keys == []  # executed=True: the human did it, the loop only recorded
    assert sup.asked[0].why == "the agent asked for help"
    assert sup.asked[1].why == "the agent called the user earlier in this run" and len(sup.asked) == 3


def test_a_failing_supervisor_closes_the_record(phone, store):
    ex, ph = phone
    sup = Scripted([Decision.approve()])  # runs out on the second question
    with pytest.raises(IndexError):
        run(ex, [click("button"), click("button")], store, gate=Gate("all", sup))
    (ep,) = store.list_episodes()
    ep = store.load_episode(ep.id)
    assert len(ep.steps) == 1 and ep.steps[0].truncated
    assert ep.meta["end_reason"].startswith("crashed: IndexError")


def test_limits_and_stop(phone, store):
    ex, ph = phone
    loop, res = run(ex, [click("button")] * 10, store, max_steps=3)
    assert res.reason == "step limit" and res.steps == 3 and res.episode.steps[-1].truncated
    assert not res.episode.steps[-1].terminated

    ex.wait_seconds = 30
    indicator = ControlIndicator()
    policy = ReplayPolicy(["Action: wait()"] * 5, platform="android")
    loop = AgentLoop(policy, ex, store=store, on_control=indicator.set)
    switch = KillSwitch(loop)
    out = {}
    th = threading.Thread(target=lambda: out.update(r=loop.run("wait forever")))
    th.start()
    time.sleep(0.5)
    assert indicator.active
    t0 = time.monotonic()
    switch.trigger()
    th.join(5)
    assert time.monotonic() - t0 < 0.2  # within 200 ms, mid-wait
    assert out["r"].reason == "kill switch" and out["r"].episode.steps[-1].truncated
    assert not indicator.active and [a for _, a in indicator.history] == [True, False]


def test_gate_configuration_errors():
    with pytest.raises(GateError, match="no supervisor"):
        Gate("all")
    with pytest.raises(GateError, match="gate mode must be one of"):
        Gate("sometimes")
    with pytest.raises(GateError, match="needs a reason"):
        Decision.reject("  ")
    with pytest.raises(GateError, match="outside the screenshot"):
        Decision.edit([Action("click", {"start_box": (1.5, 0.2)})])


def test_tools_run_through_the_loop(phone, store, tmp_path):
    ex, ph = phone
    root = tmp_path / "root"
    root.mkdir()
    sup = Scripted([Decision.approve(by="me"), Decision.reject("no writing outside", by="me")])
    policy = ReplayPolicy(["Action: run_command(command='echo hi > a.txt; cat a.txt')",
                           "Action: write_file(path='../x', content='no')", "Action: finished()"], platform="android", tools=True)
    loop = AgentLoop(policy, ex, store=store, gate=Gate("risky", sup), tools=TerminalExecutor(root))
    res = loop.run("write a file")
    s0, s1 = res.episode.steps  # the rejected write is not a step
    assert s0.action.name == "run_command" and s0.info["tool_output"]["output"] == "hi\n"
    assert (root / "a.txt").read_text() == "hi\n" and not (tmp_path / "x").exists()
    # the command's result is part of the next observation, stored (and reloaded) with the next frame
    stored = store.load_episode(res.episode.id).steps
    assert stored[1].observation.tool_output == {"tool": "run_command", "target": "echo hi > a.txt; cat a.txt",
                                                 "exit_code": 0, "output": "hi\n", "truncated": False}
    assert stored[1].observation.screenshot and "text" not in stored[1].observation.extra
    assert stored[0].observation.tool_output is None and s1.action.name == "finished"


def test_a_commands_output_is_in_the_next_prompt_and_in_the_exported_sample(phone, store, tmp_path):
    from agent.policies.memory import message_text
    from agent.storage.export import episode_samples
    from trainer.learn.sft import runtime_samples

    ex, _ = phone
    root = tmp_path / "root"
    root.mkdir()
    (root / "data.csv").write_text("x,1\ny,2\nx,3\n")
    policy = ReplayPolicy(["Thought: Count them.\nAction: run_command(command='grep -c x data.csv; exit 3')",
                           "Action: read_file(path='missing.txt')", click("button"), "Action: finished()"],
                          platform="android", tools=True)
    prompts = []
    generate = policy.generate
    policy.generate = lambda messages: (prompts.append(message_text(messages)), generate(messages))[1]
    loop = AgentLoop(policy, ex, store=store, gate=Gate("auto"), tools=TerminalExecutor(root))
    res = loop.run("count the x rows")
    assert [s.action.name for s in res.episode.steps] == ["run_command", "read_file", "click", "finished"]
    told = "$ grep -c x data.csv; exit 3\n(exit 3)\n2\n"
    assert told not in prompts[0] and told in prompts[1]  # the next turn sees it
    assert told in prompts[2]  # and the turn after, in its history
    # a tool call that could not run tells the model why, the same way
    assert "[read_file missing.txt]\nerror: no file at 'missing.txt'" in prompts[2]
    assert loop.memory.last_report["tokens"] > 0
    ep = store.load_episode(res.episode.id)
    samples = list(episode_samples(ep))
    turns = [m["content"] for m in samples[1]["messages"]]
    assert turns[-3:] == [told.rstrip("\n") + "\n", "<image>", "Action: read_file(path='missing.txt')"]
    assert any(told in t for t in (m["content"] for m in samples[3]["messages"]))
    assert not any(told in m["content"] for m in samples[0]["messages"])
    # the SFT samples rebuilt from the store prompt as the live agent did
    rebuilt = runtime_samples(ep, store.get_blob, platform="android")
    assert told in message_text(rebuilt[1].messages) and told not in message_text(rebuilt[0].messages)


def test_a_stop_pressed_before_the_run_starts_is_not_lost(phone, store):
    """The kill switch is armed right after the loop is made; before, run() cleared the stop flag
    (and the executor's reset did too), so a stop pressed in between was forgotten and the agent acted."""
    ex, ph = phone
    loop = AgentLoop(ReplayPolicy([click("button")] * 3, platform="android"), ex, store=store)
    KillSwitch(loop).trigger()  # pressed while the run is still being set up
    res = loop.run("press the button")
    assert res.reason == "kill switch" and res.steps == 0 and ph.button_presses == 0
    # a new loop on the same executor starts clean
    res = AgentLoop(ReplayPolicy([click("button"), "Action: finished()"], platform="android"), ex, store=store).run("press")
    assert res.reason == "finished" and ph.button_presses == 1
