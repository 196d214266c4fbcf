"""Remote supervision through a real backend on loopback: the agent runs a sandbox task in one
thread and publishes its proposals (RunPublisher); two supervisors watch it in real Supervise
pages; one claims the run and decides, the other sees every step read-only and cannot claim."""
from __future__ import annotations

import threading
import time

import pytest
from PySide6.QtCore import Qt

from agent import coords
from agent.grammar import format_normalized
from agent.policies import ReplayPolicy
from agent.run.gate import Gate
from agent.run.loop import AgentLoop, LoopConfig
from agent.schema import Action
from agent.storage.store import Store
from agent.sync.live_link import RunPublisher
from app.sandbox_executor import SandboxProcessExecutor
from app.supervise_view import SupervisePage
from trainer.backend.server_thread import start_in_thread

EMPTY = (0.03, 0.97)


@pytest.fixture
def backend(tmp_path):
    b = start_in_thread(tmp_path / "backend")
    tokens = {name: b.store.add_user(name, role) for name, role in
              (("robot", "annotator"), ("alice", "supervisor"), ("bob", "supervisor"))}
    yield b, tokens
    b.stop()


def page_for(qtbot, tmp_path, name):
    store = Store(tmp_path / name)
    p = SupervisePage(store, name=name)
    qtbot.addWidget(p)
    p.resize(1300, 850)
    p.show()
    return p, store


def test_remote_supervisors_watch_claim_and_decide(qtbot, backend, tmp_path):
    b, tokens = backend
    ex = SandboxProcessExecutor("click_button", 3)
    instruction = ex.prepare()
    target = ex.expert_action()[1].args["start_box"]
    responses = [format_normalized("Corner.", [Action("click", {"start_box": EMPTY})], coords.SMART_RESIZE, 320, 240),
                 format_normalized("The button.", [Action("click", {"start_box": target})], coords.SMART_RESIZE, 320, 240)]
    agent_store = Store(tmp_path / "agent")
    pub = RunPublisher(b.url, tokens["robot"]).start()
    loop = AgentLoop(ReplayPolicy(responses, platform="sandbox"), ex, store=agent_store, gate=Gate("all", pub.supervisor),
                     config=LoopConfig(max_steps=5))
    pub.supervisor.stop_event = loop.stop_event
    result = {}

    alice, astore = page_for(qtbot, tmp_path, "alice-app")
    bob, bstore = page_for(qtbot, tmp_path, "bob-app")
    alice.watch(b.url, tokens["alice"], pub.run_id)
    bob.watch(b.url, tokens["bob"], pub.run_id)
    alice.claim()
    qtbot.waitUntil(lambda: alice.claimed_by == "alice" and bob.claimed_by == "alice", timeout=5000)
    bob.toggle_claim()  # one decides at a time
    assert "already claimed by alice" in bob.claim_label.text()

    runner = threading.Thread(target=lambda: result.setdefault("r", loop.run(instruction)), daemon=True)
    runner.start()
    try:
        # both see the proposal with its screenshot; only alice may answer
        qtbot.waitUntil(lambda: alice.panel.pending is not None and bob.panel.pending is not None, timeout=15000)
        assert alice.panel.pending.request.observation.size == (320, 240)
        assert not bob.panel.approve_btn.isEnabled() and alice.panel.approve_btn.isEnabled()
        first = alice.panel.pending.proposal_id
        assert bob.panel.pending.proposal_id == first
        qtbot.keyClick(alice.panel, Qt.Key_R)
        qtbot.keyClicks(alice.panel.reason, "nothing is there")
        qtbot.keyClick(alice.panel.reason, Qt.Key_Return)
        # the agent was re-asked; the new proposal reaches both, and alice edits its thought
        qtbot.waitUntil(lambda: alice.panel.pending is not None and alice.panel.pending.proposal_id != first, timeout=15000)
        qtbot.waitUntil(lambda: bob.panel.pending is not None and bob.panel.pending.proposal_id != first, timeout=5000)
        alice.panel.thought.setPlainText("Undo is the middle button.")
        qtbot.keyClick(alice.panel, Qt.Key_Return)
        runner.join(20)
        assert not runner.is_alive()
    finally:
        loop.stop("test over")
        runner.join(10)
        pub.end("test over")
        ex.close()
    res = result["r"]
    assert ex.success
    ep = agent_store.load_episode(res.episode.id)
    assert ep.kind == "supervised"
    s0 = ep.steps[0]
    assert s0.provenance.source == "corrected" and s0.provenance.decided_by == "alice"
    assert s0.thought == "Undo is the middle button." and s0.provenance.proposal_thought == "The button."
    assert s0.info["rejections"][0]["reason"] == "nothing is there" and s0.info["rejections"][0]["by"] == "alice"
    # bob saw alice's decisions as they happened, and the run's end
    qtbot.waitUntil(lambda: "ended" in bob.claim_label.text(), timeout=5000)
    log = [bob.steps.item(i).text() for i in range(bob.steps.count())]
    assert log[:2] == ["alice: reject (nothing is there)", "alice: edit"]
    for p, s in ((alice, astore), (bob, bstore)):
        p.shutdown()
        s.close()
    agent_store.close()


def test_watching_needs_a_valid_token(qtbot, backend, tmp_path):
    b, _ = backend
    p, s = page_for(qtbot, tmp_path, "eve-app")
    p.server.setText(b.url)
    p.token.setText("not-a-token")
    p.run_id.setText("r1")
    p.watch_from_form()
    assert "Cannot watch" in p.claim_label.text() and p.watcher is None
    s.close()


def test_a_squatted_run_id_stops_the_agent_with_the_reason(backend):
    """Another connection published the run id first: the agent's gate hears the server's refusal
    and stops with it, instead of waiting for a decision that can never come."""
    import asyncio

    from agent.policies.base import Proposal
    from agent.run.gate import GateRequest
    from agent.sync.session import Session

    b, tokens = backend

    async def squat():
        s = await Session.open(b.url, tokens["alice"])
        await s.propose("taken-run", "p0", {"x": 1}, None)
        await s.request("list_episodes")  # a round trip: the run is registered
        return s

    loop = asyncio.new_event_loop()
    squatter = loop.run_until_complete(squat())
    pub = RunPublisher(b.url, tokens["robot"], run_id="taken-run", timeout=20).start()
    try:
        proposal = Proposal("go", [Action("click", {"start_box": (0.5, 0.5)})], "raw", image_size=(320, 240))
        t0 = time.monotonic()
        decision = pub.supervisor.decide(GateRequest("do it", 0, proposal, None, "every step is reviewed"))
        assert time.monotonic() - t0 < 10
        assert decision.kind == "stop" and "published by another connection" in decision.reason
    finally:
        pub.end()
        loop.run_until_complete(squatter.close())
        loop.close()
