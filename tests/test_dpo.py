"""DPO on supervisors' judgements: the loss is the textbook one; pairs come from a real agent run
(the model's own raw text rejected, edits and rejections both), in the SFT sample's layout; and a
real tiny model trained on a real correction pair comes to prefer the supervisor's edit."""
from __future__ import annotations

import math

import pytest

from tests.factories import make_episode
from tests.vlm_fixtures import tiny_vlm_dir  # noqa: F401 - fixture


def test_the_dpo_loss():
    import torch

    from trainer.learn.dpo import dpo_loss

    same = torch.tensor([-5.0, -7.0])
    loss, st = dpo_loss(same, same - 1, same, same - 1, beta=0.1)  # the policy is the reference
    assert float(loss) == pytest.approx(math.log(2)) and st["margin"] == 0 and st["accuracy"] == 0
    # chosen up by 2 nats, rejected down by 1, against the reference: margin 0.1 * 3
    loss, st = dpo_loss(torch.tensor([-3.0]), torch.tensor([-9.0]), torch.tensor([-5.0]), torch.tensor([-8.0]), beta=0.1)
    assert float(loss) == pytest.approx(-math.log(1 / (1 + math.exp(-0.3)))) and st["accuracy"] == 1
    pc = torch.tensor([-5.0], requires_grad=True)
    dpo_loss(pc, torch.tensor([-6.0]), torch.tensor([-5.0]), torch.tensor([-6.0]), 0.5)[0].backward()
    assert pc.grad.item() < 0  # raising the chosen reply's log-prob lowers the loss


def test_a_tiny_model_learns_to_prefer_the_supervisors_edit(store, tiny_vlm_dir):  # noqa: F811
    import torch

    from agent.schema import Action, Provenance
    from agent.vlm.model import load_vlm
    from trainer.learn.dpo import DPOConfig, preference_pairs, sequence_logprob, train_dpo
    from trainer.learn.sft import SFTError, encode

    torch.set_num_threads(1)
    ep = make_episode(store, 2, kind="supervised")
    ep.steps[1].provenance = Provenance("corrected", proposal_thought="Click the corner.",
                                        proposal_action=Action("click", {"start_box": (0.95, 0.05)}),
                                        decision="edit", decided_by="sam")
    store.save_episode(ep)
    unchanged = make_episode(store, 1, kind="supervised")  # an "edit" equal to the proposal: no preference
    unchanged.steps[0].provenance = Provenance("corrected", proposal_thought=unchanged.steps[0].thought,
                                               proposal_action=unchanged.steps[0].action, decision="edit")
    store.save_episode(unchanged)
    pairs = preference_pairs(store, [ep.id, unchanged.id])
    assert len(pairs) == 1 and pairs[0].source == f"{ep.id}#1"
    assert pairs[0].rejected.target.startswith("Thought: Click the corner.") and pairs[0].chosen.messages == pairs[0].rejected.messages

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    c, r = encode(proc, pairs[0].chosen), encode(proc, pairs[0].rejected)

    def preference():
        with torch.no_grad():
            return float(sequence_logprob(model, c) - sequence_logprob(model, r))

    before = preference()
    res = train_dpo(model, proc, pairs, DPOConfig(beta=0.5, lr=2e-3, batch_size=1, max_steps=12), progress=False)
    assert res["first_loss"] == pytest.approx(math.log(2), abs=1e-4)  # the first step: policy == reference
    assert res["last_loss"] < 0.5 * res["first_loss"] and res["last_accuracy"] == 1.0
    assert preference() > before + 2  # nats: the edit is now much likelier than the old proposal
    # RPO: the chosen reply's NLL beside the DPO loss keeps it likely; DPO alone lets both sides fall
    import copy

    fresh, _ = load_vlm(tiny_vlm_dir, device="cpu")
    kept = {}
    for nll in (0.0, 1.0):
        m = copy.deepcopy(fresh)
        r = train_dpo(m, proc, pairs, DPOConfig(beta=0.5, lr=2e-3, batch_size=1, max_steps=12, nll=nll), progress=False)
        assert r["last_accuracy"] == 1.0
        with torch.no_grad():
            kept[nll] = float(sequence_logprob(m, c))
    assert kept[1.0] > kept[0.0] + 1.0, kept
    with pytest.raises(SFTError, match="nll >= 0"):
        DPOConfig(nll=-1)
    with pytest.raises(SFTError, match="no preference pairs"):
        train_dpo(model, proc, [], DPOConfig(), progress=False)
    with pytest.raises(SFTError, match="beta > 0"):
        DPOConfig(beta=0)


def test_pairs_are_the_models_own_text_against_what_was_done_in_the_sft_layout(store, tmp_path):
    """A real AgentLoop on the fake phone, gated by a scripted supervisor: a rejected proposal
    followed by an approved one, an edited proposal, and a rejection of what was then approved
    anyway. The pairs hold the model's raw replies as recorded, and their prompt is the SFT
    sample's, in training and in the exported files."""
    import json

    from agent.executors.android import AndroidExecutor
    from agent.policies import ReplayPolicy
    from agent.run.gate import Decision, Gate
    from agent.run.loop import AgentLoop
    from agent.schema import Action
    from tests.fake_android import FakePhoneServer, connect_fake
    from tests.test_agent_loop import Scripted, click
    from trainer.flywheel.routing import export_corrections
    from trainer.learn.dpo import pair_record, preference_pairs, sample_record
    from trainer.learn.sft import runtime_samples

    responses = [click("field"), click("button"), click("field", "Tap the field again."), "Action: finished()",
                 "Action: finished()"]
    sup = Scripted([Decision.reject("Wrong widget: use the button.", by="sv"), Decision.approve(by="sv"),
                    Decision.edit([Action("press_back")], thought="Go back instead.", by="sv"),
                    Decision.reject("Not done yet.", by="sv"), Decision.approve(by="sv")])
    with FakePhoneServer() as server:
        ex = AndroidExecutor(connect_fake(server), settle=0, wait_seconds=0.01)
        try:
            res = AgentLoop(ReplayPolicy(responses, platform="android"), ex, store=store, gate=Gate("all", sup)).run("press it")
        finally:
            ex.close()
    ep = store.load_episode(res.episode.id)
    assert [s.action.name for s in ep.steps] == ["click", "press_back", "finished"]

    pairs = preference_pairs(store, [ep.id])
    # the rejection of "finished" that was then approved as it was teaches nothing: two pairs
    assert [(p.decision, p.step) for p in pairs] == [("reject", 0), ("edit", 1)]
    reject, edit = pairs
    # the rejected side is the reply the model wrote, token markers and all, not a re-rendering
    assert reject.rejected.target == click("field") and "<|box_start|>" in reject.rejected.target
    assert edit.rejected.target == click("field", "Tap the field again.") == ep.steps[1].raw_response
    assert (reject.reason, reject.decided_by, edit.decided_by) == ("Wrong widget: use the button.", "sv", "sv")
    # the chosen side is what was done, in the SFT target's form, under the SFT sample's prompt
    sft = runtime_samples(ep, store.get_blob)
    for p in pairs:
        assert p.chosen.target == sft[p.step].target and p.rejected.messages is p.chosen.messages
        assert sample_record(p.chosen) == sample_record(sft[p.step])
    assert edit.chosen.target.startswith("Thought: Go back instead.") and "press_back" in edit.chosen.target

    res = export_corrections(store, tmp_path / "out", [ep.id])
    assert (res["sft_samples"], res["preference_pairs"]) == (1, 2)
    written = [json.loads(line) for line in (tmp_path / "out" / "preferences.jsonl").read_text().splitlines()]
    assert written == [json.loads(json.dumps(pair_record(p))) for p in pairs]
    sample = json.loads((tmp_path / "out" / "corrections.jsonl").read_text())
    # one layout: the exported pair's prompt is the exported SFT sample's, images included
    assert written[1]["messages"] == sample["messages"][:-1] and written[1]["images"] == sample["images"]
    assert written[1]["chosen"] == sample["messages"][-1]["content"] and written[1]["rejected"] == edit.rejected.target
    assert sample["images"][-1] == ep.steps[1].observation.screenshot  # the store's blob hash of the step's frame
