"""Remote supervision's corrections reach the backend from the agent's machine: the backend keeps
every decision it relays (episode, step, who decided, who published, what the step holds), and an
upload may carry a correction in a supervisor's name only where that supervisor's decision was
relayed for exactly that step of exactly that episode to exactly that uploader. The agent loop
runs against a fake phone (uiautomator2's wire protocol) with a scripted model; the backend, the
publisher and the supervisor's watcher are real and talk over loopback."""
from __future__ import annotations

import asyncio
import queue
import shutil
import threading
import time

import pytest

from agent import protocol as P
from agent.executors.android import AndroidExecutor
from agent.policies import ReplayPolicy
from agent.redaction.runs import AUTOMATIC
from agent.run.gate import Decision, Gate
from agent.run.loop import AgentLoop, LoopConfig
from agent.schema import Action
from agent.storage.store import Store
from agent.sync.client import Backoff, SyncClient
from agent.sync.live_link import RunPublisher, RunWatcher
from agent.sync.outbox import Outbox
from tests.fake_android import HEIGHT, WIDTH, FakePhoneServer, connect_fake
from tests.test_agent_loop import click
from trainer.backend.server_thread import start_in_thread

FIELD = Action("click", {"start_box": (270 / WIDTH, 240 / HEIGHT)})
HELLO = Action("type", {"content": "hello"})


def sync(store, url, token):
    client = SyncClient(store, url, token, backoff=Backoff(0.05, 0.2))
    return asyncio.run(client.sync(deadline=time.monotonic() + 20))


def supervise(url, token, run_id, answers, done):
    """alice's side: claim the run, answer each proposal in turn from `answers`."""
    events = queue.Queue()
    w = RunWatcher(url, token, run_id, events.put).start()
    w.claim()
    try:
        for answer in answers:
            ev = events.get(timeout=20)
            while not isinstance(ev, P.ProposalReceived):
                ev = events.get(timeout=20)
            w.decide(ev.proposal_id, answer)
    finally:
        done.set()
        w.close()


@pytest.fixture(scope="module")
def relayed(tmp_path_factory):
    """One supervised run: robot (an annotator's token) publishes, alice (a supervisor) edits the
    first reply into two actions with a thought of her own, then approves the rest. The backend is
    restarted afterwards, so what it relayed must have been kept on disk."""
    root = tmp_path_factory.mktemp("relay")
    b = start_in_thread(root / "backend")
    tokens = {name: b.store.add_user(name, role) for name, role in
              (("robot", "annotator"), ("eve", "annotator"), ("alice", "supervisor"), ("bob", "supervisor"))}
    agent_store = Store(root / "agent")
    with FakePhoneServer() as server:
        ex = AndroidExecutor(connect_fake(server), settle=0, wait_seconds=0.01)
        pub = RunPublisher(b.url, tokens["robot"]).start()
        loop = AgentLoop(ReplayPolicy([click("button"), click("button"), "Action: finished()"], platform="android"), ex,
                         store=agent_store, gate=Gate("all", pub.supervisor), config=LoopConfig(max_steps=6))
        pub.supervisor.stop_event = loop.stop_event
        done = threading.Event()
        answers = [Decision.edit([FIELD, HELLO], "Fill in the field first."), Decision.approve(), Decision.approve()]
        alice = threading.Thread(target=supervise, args=(b.url, tokens["alice"], pub.run_id, answers, done), daemon=True)
        alice.start()  # she subscribes before or after the first proposal: a late subscriber gets it too
        try:
            result = loop.run("Say hello")
        finally:
            pub.end("test over")
            alice.join(20)
            ex.close()
        phone = server.phone
    assert result.reason == "finished" and phone.text["field"] == "hello"
    ep = agent_store.load_episode(result.episode.id)
    agent_store.close()
    rows = b.store.relayed_decisions(pub.run_id)
    b.stop()
    b = start_in_thread(root / "backend")
    yield {"backend": b, "tokens": tokens, "episode": ep, "agent": root / "agent", "rows": rows, "root": root}
    b.stop()


def test_the_run_records_a_correction_per_step_it_makes(relayed):
    ep, rows = relayed["episode"], relayed["rows"]
    assert [(s.action.name, s.provenance.source, s.provenance.decided_by) for s in ep.steps] == [
        ("click", "corrected", "alice"), ("type", "corrected", "alice"), ("click", "agent", "alice"),
        ("finished", "agent", "alice")]
    assert [s.thought for s in ep.steps[:2]] == ["Fill in the field first.", ""]
    # the edit vouches for the two steps it made, with their content; each approval for its own step
    assert [(r["episode_id"], r["step_index"], r["decision"], r["decided_by"], r["publisher"]) for r in rows] == [
        (ep.id, 0, "edit", "alice", "robot"), (ep.id, 1, "edit", "alice", "robot"),
        (ep.id, 2, "approve", "alice", "robot"), (ep.id, 3, "approve", "alice", "robot")]
    assert rows[1]["action"] == '{"args": {"content": "hello"}, "name": "type"}' and rows[2]["action"] is None


def copy_of_agent(relayed, tmp_path) -> Store:
    shutil.copytree(relayed["agent"], tmp_path / "agent")
    return Store(tmp_path / "agent")


def test_the_agents_machine_uploads_the_supervisors_correction_after_a_restart(relayed, tmp_path):
    """Issue 38's rule refused this: an annotator's token uploading steps corrected by 'alice'. The
    backend relayed alice's edit of these steps to robot (and was restarted since): stored, in
    alice's name."""
    b, ep = relayed["backend"], relayed["episode"]
    store = copy_of_agent(relayed, tmp_path)
    Outbox(store).submit(ep.id)
    report = sync(store, b.url, relayed["tokens"]["robot"])
    assert report.ok and report.sent == [(ep.id, "stored")]
    kept = b.store.store.load_episode(ep.id)
    assert [s.provenance.decided_by for s in kept.steps[:2]] == ["alice", "alice"]
    # a run on a phone leaves redacted (agent.redaction.runs): its frames are the blurred copies, its steps as made
    assert [(s.action, s.thought, s.provenance) for s in kept.steps] == [(s.action, s.thought, s.provenance) for s in ep.steps]
    assert kept.meta["redaction"]["approved_by"] == AUTOMATIC and b.store.owner_of(ep.id) == "robot"
    store.close()


def _forge(ep, what):
    ep.revision += 1
    s = ep.steps
    if what == "unrelayed step":  # an approved step passed off as alice's correction
        s[2].provenance.source, s[2].provenance.decision = "corrected", "edit"
    elif what == "other episode":
        ep.id = "another-episode"
    elif what == "other supervisor":
        s[0].provenance.decided_by = "bob"
    elif what == "other content":  # alice's correction, with words put in her mouth
        s[1].action = Action("type", {"content": "rm -rf ~"})
    elif what == "other thought":
        s[0].thought = "Anything I like."
    elif what == "shifted step":  # alice's second step, claimed one place later
        s[2].action, s[2].thought, s[2].provenance = s[1].action, "", s[1].provenance
    return ep


@pytest.mark.parametrize("user, what, refused", [
    ("robot", "unrelayed step", "step 3 is marked as a supervisor's correction"),
    ("robot", "other episode", "step 1 is marked as a supervisor's correction"),
    ("robot", "other supervisor", "relayed no such correction by 'bob' of step 1 to 'robot'"),
    ("robot", "other content", "relayed no such correction by 'alice' of step 2"),
    ("robot", "other thought", "relayed no such correction by 'alice' of step 1"),
    ("robot", "shifted step", "step 3 is marked as a supervisor's correction"),
    ("eve", "nothing", "relayed no such correction by 'alice' of step 1 to 'eve'"),  # relayed to robot, not eve
    ("bob", "nothing", "'bob' may upload corrections only in its own name or ones this backend relayed to it live"),
])
def test_a_correction_the_backend_did_not_relay_is_still_refused(relayed, tmp_path, user, what, refused):
    b = relayed["backend"]
    store = copy_of_agent(relayed, tmp_path)
    ep = _forge(store.load_episode(relayed["episode"].id), what)
    store.save_episode(ep)

    def stored():  # what the backend holds of it (an earlier test may have stored the real one)
        return b.store.store.load_episode(ep.id).to_dict() if b.store.store.has_episode(ep.id) else None

    before = stored()
    Outbox(store).submit(ep.id)
    report = sync(store, b.url, relayed["tokens"][user])
    (eid, reason), = report.failed
    assert eid == ep.id and reason.startswith(f"forbidden: episode {ep.id}: ") and refused in reason
    assert report.blobs_sent == 0
    assert stored() == before  # the forged version was not stored
    store.close()


@pytest.mark.parametrize("proposed, kind, answer", [
    ("not a step", "edit", {"actions": [FIELD.to_dict()]}),
    ({"episode_id": "e1", "step_index": True, "actions": [FIELD.to_dict()]}, "edit", None),
    ({"episode_id": "e" * 10**6, "step_index": 0, "actions": [FIELD.to_dict()]}, "edit", None),  # not an id
    ({"episode_id": "e1", "step_index": 0, "actions": [{"name": "no_such_action"}]}, "edit", {"thought": 5}),
    ({"episode_id": "e1", "step_index": 0}, "edit", {"actions": "click"}),
    ({"episode_id": "e1", "step_index": 0}, "takeover", {"steps": 7}),
    ({"episode_id": "e1", "step_index": 0, "actions": [FIELD.to_dict()]}, "approve", None),
])
def test_a_relayed_decision_that_cannot_be_read_is_logged_and_vouches_for_nothing(tmp_path, proposed, kind, answer):
    """The proposal step comes from the publisher and the answer from the supervisor, as JSON: a
    malformed one is still logged (one row, without an action) and authorizes no correction."""
    from trainer.backend.store import BackendStore

    b = BackendStore(tmp_path / "backend")
    try:
        assert b.record_decision("r1", "p1", proposed, "robot", "alice", kind, answer) == 1
        (row,) = b.relayed_decisions("r1")
        assert row["action"] is None and len(row["episode_id"] or "") <= 200 and (row["decided_by"], row["publisher"], row["decision"]) == ("alice", "robot", kind)
        assert b.relayed_corrections("e1", "robot") == frozenset()
    finally:
        b.close()
