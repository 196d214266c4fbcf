"""Preference training on supervisors' corrections (Direct Preference Optimization, Rafailov et
al. 2023), as UI-TARS trains on its reflective traces: where a supervisor edited the agent's
proposed step, the edited reply is *chosen* and the agent's own proposal *rejected*, both under
the prompt the agent saw. The loss raises the policy's log-ratio (against a frozen reference,
the model as the stage starts) of the chosen reply over the rejected one:

    L = -log sigmoid(beta * [(log pi(c) - log ref(c)) - (log pi(r) - log ref(r))])

SFT on the corrected step alone teaches the right reply; DPO also pushes down the wrong one the
model actually produced. The same pairs are exported as preferences.jsonl for outside trainers.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass

from trainer.sft import Sample, SFTError, encode, next_batch


@dataclass
class PreferencePair:
    chosen: Sample
    rejected: Sample

    @property
    def source(self) -> str:
        return self.chosen.source


@dataclass
class DPOConfig:
    beta: float = 0.1  # how far from the reference the policy may move for a given margin
    lr: float = 2e-4
    batch_size: int = 4  # pairs per optimizer step
    max_steps: int = 20
    grad_clip: float | None = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.beta <= 0 or self.lr <= 0 or self.batch_size < 1 or self.max_steps < 1:
            raise SFTError(f"DPO needs beta > 0, lr > 0, batch_size >= 1 and max_steps >= 1; got {asdict(self)}")


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta: float):
    """(loss, stats) of summed sequence log-probs, each a [B] tensor. stats: the implicit reward
    margin beta * (chosen log-ratio - rejected log-ratio) and the share of pairs where it is > 0."""
    import torch.nn.functional as F

    margin = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))
    loss = -F.logsigmoid(margin).mean()
    return loss, {"margin": float(margin.detach().mean()), "accuracy": float((margin.detach() > 0).float().mean())}


def sequence_logprob(model, inputs: dict):
    """Summed log-probability of the assistant reply's tokens (inputs from trainer.sft.encode)."""
    from agent.vlm import action_logprobs

    return action_logprobs(model, inputs, inputs["assistant_mask"]).sum()


def correction_pairs(store, episode_ids, skipped: dict | None = None) -> list[PreferencePair]:
    """(chosen, rejected) of every corrected step in these episodes, prompted as the agent was:
    the supervisor's edit against the agent's own proposal. An episode that cannot be read is
    left out and named in `skipped` (trainer.flywheel.routing.load_or_skip)."""
    from agent import coords
    from agent.grammar import format_normalized
    from trainer.flywheel.routing import corrected_steps, load_or_skip, samples_or_skip

    out = []
    for eid in episode_ids:
        ep = load_or_skip(store, eid, skipped)
        fixed = {s.index: s for s in corrected_steps(ep)} if ep else {}
        if not fixed or not all(s.observation.screenshot for s in ep.steps):
            continue
        # samples_or_skip: one sample per step, or [] for an episode it skipped
        for step, sample in zip(ep.steps, samples_or_skip(store, ep, skipped), strict=False):
            s = fixed.get(step.index)
            if s is None:
                continue
            rejected = format_normalized(s.provenance.proposal_thought or "", [s.provenance.proposal_action],
                                         coords.SMART_RESIZE, s.observation.width, s.observation.height)
            if rejected != sample.target:  # an "edit" that changed nothing teaches no preference
                out.append(PreferencePair(sample, Sample(sample.messages, rejected, sample.source)))
    return out


def train_dpo(model, processor, pairs: list[PreferencePair], cfg: DPOConfig, *, log=None, phase: str = "dpo",
              progress: bool = True) -> dict:
    """Train on preference pairs; the reference is the model as it is now (its log-probs are taken
    once, before the first step). Returns {"steps", "pairs", "first_loss", "last_loss",
    "first_accuracy", "last_accuracy", "seconds"}."""
    import torch
    from tqdm import tqdm

    if not pairs:
        raise SFTError("no preference pairs")
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    enc = [(encode(processor, p.chosen), encode(processor, p.rejected)) for p in pairs]
    model.eval()
    with torch.no_grad():
        ref = [(float(sequence_logprob(model, c)), float(sequence_logprob(model, r))) for c, r in enc]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    model.train()
    order: list[int] = []
    first = last = None
    t0 = time.perf_counter()
    bar = tqdm(range(cfg.max_steps), desc=phase, unit="step", disable=not progress or None)
    for step in bar:
        batch = next_batch(order, len(enc), cfg.batch_size, rng)
        opt.zero_grad(set_to_none=True)
        stats = {"loss": 0.0, "margin": 0.0, "accuracy": 0.0}
        for i in batch:  # one pair at a time: the loss of a batch is the mean of its pairs'
            c, r = enc[i]
            pc, pr = sequence_logprob(model, c), sequence_logprob(model, r)
            rc, rr = (torch.tensor(v, device=pc.device) for v in ref[i])
            loss, st = dpo_loss(pc.unsqueeze(0), pr.unsqueeze(0), rc.unsqueeze(0), rr.unsqueeze(0), cfg.beta)
            (loss / len(batch)).backward()
            stats["loss"] += float(loss.detach()) / len(batch)
            for k in ("margin", "accuracy"):
                stats[k] += st[k] / len(batch)
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
        opt.step()
        first = first or dict(stats)
        last = stats
        bar.set_postfix(loss=f"{stats['loss']:.3f}", acc=f"{stats['accuracy']:.2f}")
        if log is not None:
            log.log(step, phase, **stats, grad_norm=float(gnorm) if math.isfinite(float(gnorm)) else -1.0)
    bar.close()
    model.eval()
    return {"phase": phase, "steps": cfg.max_steps, "pairs": len(pairs), "first_loss": first["loss"],
            "last_loss": last["loss"], "first_accuracy": first["accuracy"], "last_accuracy": last["accuracy"],
            "seconds": round(time.perf_counter() - t0, 2), "config": asdict(cfg)}
