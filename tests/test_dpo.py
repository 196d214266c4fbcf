"""DPO on supervisors' corrections: the loss is the textbook one, and a real tiny model trained
on a real correction pair comes to prefer the supervisor's edit over its own proposal."""
from __future__ import annotations

import math

import pytest

from tests.factories import make_episode
from tests.vlm_fixtures import tiny_vlm_dir  # noqa: F401 - fixture


def test_the_dpo_loss():
    import torch

    from trainer.dpo import dpo_loss

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
    from agent.vlm import load_vlm
    from trainer.dpo import DPOConfig, correction_pairs, sequence_logprob, train_dpo
    from trainer.sft import SFTError, encode

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
    pairs = correction_pairs(store, [ep.id, unchanged.id])
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
    with pytest.raises(SFTError, match="no preference pairs"):
        train_dpo(model, proc, [], DPOConfig(), progress=False)
    with pytest.raises(SFTError, match="beta > 0"):
        DPOConfig(beta=0)
