"""Preference training on supervisors' judgements (Direct Preference Optimization, Rafailov et
al. 2023), as UI-TARS trains on its reflective traces. A pair is built where a supervisor said no
to the agent: an edited step (the edit is *chosen*) and a rejected proposal followed by what was
done instead (that step is *chosen*). The *rejected* side is the model's own reply, the raw text
it wrote (`Step.raw_response`, a rejection's recorded "raw"), not a re-rendering of the parsed
proposal: that text is what the model's probabilities produced and what DPO must push down. Both
sides share one prompt: the step's SFT sample (trainer.learn.sft.runtime_samples, the prompt the agent
saw), so a pair and the SFT sample of its step are one layout, in training and in the export
(`pair_record`, preferences.jsonl). The loss raises the policy's log-ratio (against a frozen
reference, the model as the stage starts) of the chosen reply over the rejected one:

    L = -log sigmoid(beta * [(log pi(c) - log ref(c)) - (log pi(r) - log ref(r))])

SFT on the corrected step alone teaches the right reply; DPO also pushes down the wrong one the
model actually produced.
"""
from __future__ import annotations

import hashlib
import math
import random
import time
from dataclasses import asdict, dataclass

from agent import coords
from agent.grammar import format_normalized
from agent.schema import Action
from agent.vlm import pointer
from agent.vlm.model import action_logprobs
from trainer.learn.sft import Sample, SFTError, encode, next_batch


@dataclass
class PreferencePair:
    chosen: Sample
    rejected: Sample
    episode_id: str = ""
    step: int = 0
    decision: str = "edit"  # edit: the supervisor changed the step; reject: said no, then this step was done
    decided_by: str | None = None
    reason: str | None = None  # a rejection's reason

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
    # the chosen reply's mean token NLL added to the loss, times this (RPO, Pang et al. 2024): DPO alone
    # on pairs it can tell apart by their thoughts pushed the margin to 55-65 nats in 20 steps and took
    # 14 points off the default model's held-out success (measured: flywheel, 104 episodes a model)
    nll: float = 1.0

    def __post_init__(self):
        if self.beta <= 0 or self.lr <= 0 or self.batch_size < 1 or self.max_steps < 1 or self.nll < 0:
            raise SFTError(f"DPO needs beta > 0, lr > 0, batch_size >= 1, max_steps >= 1 and nll >= 0; "
                           f"got {asdict(self)}")


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta: float):
    """(loss, stats) of summed sequence log-probs, each a [B] tensor. stats: the implicit reward
    margin beta * (chosen log-ratio - rejected log-ratio) and the share of pairs where it is > 0."""
    import torch.nn.functional as F

    margin = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))
    loss = -F.logsigmoid(margin).mean()
    return loss, {"margin": float(margin.detach().mean()), "accuracy": float((margin.detach() > 0).float().mean())}


def sequence_logprob(model, inputs: dict):
    """Summed log-probability of the assistant reply (inputs from trainer.learn.sft.encode). With an
    element list in the prompt and a pointer head on the model, each click is scored as the model
    makes it, as PPO scores it (agent.vlm.pointer.adjust_logprobs): the pointer's log-softmax of
    the clicked entry in place of the digits it writes. Without that, an edit that moves a click to
    another entry would differ only in digits the pointer overrides, and DPO would not reach the
    choice at all."""
    mask = inputs["assistant_mask"]
    lay = inputs.get("pointer")
    if lay is None or pointer.head_of(model) is None or any(s.choice is None for s in lay.sites):
        return action_logprobs(model, inputs, mask).sum()
    lp, hidden = action_logprobs(model, inputs, mask, return_hidden=True)
    on = mask[0].tolist()
    scored = pointer.adjust_logprobs(model, lay, [s.choice for s in lay.sites], hidden[0], 0,
                                     lambda pos: pos if 0 <= pos < len(on) and on[pos] else None, lp[0])
    return scored.sum()


def preference_pairs(store, episode_ids, skipped: dict | None = None) -> list[PreferencePair]:
    """The preference pairs of these episodes: every corrected step (the edit chosen over the
    model's reply) and every rejected proposal with the step done after it (that step chosen over
    the rejected reply), each under the step's SFT sample's prompt. A judgement that changed
    nothing (an "edit" equal to the proposal, a rejection of what was then approved) teaches no
    preference and is left out. An episode that cannot be read is left out and named in
    `skipped` (trainer.flywheel.routing.load_or_skip)."""
    from trainer.flywheel.routing import load_or_skip, samples_or_skip  # lazy: cycle with trainer.flywheel.routing

    out = []
    for eid in episode_ids:
        ep = load_or_skip(store, eid, skipped)
        if ep is not None and any(_judged(s) for s in ep.steps) and all(s.observation.screenshot for s in ep.steps):
            out += episode_pairs(ep, samples_or_skip(store, ep, skipped))
    return out


def episode_pairs(ep, samples: list[Sample]) -> list[PreferencePair]:
    """preference_pairs of one episode, given its SFT samples (runtime_samples, one per step;
    none when they could not be built)."""
    out = []
    if not samples:
        return out
    for step, sample in zip(ep.steps, samples, strict=True):
        prov = step.provenance
        if prov.source == "corrected" and prov.proposal_action is not None:
            proposed = _rendered(step, prov.proposal_thought or "", [prov.proposal_action])
            if proposed != sample.target:  # the model's own text, else the proposal as the loop parsed it
                out.append(_pair(ep.id, step, sample, step.raw_response or proposed, "edit", prov.decided_by))
        for r in step.info.get("rejections") or []:
            proposed = _rendered(step, r.get("thought") or "", [_action(a) for a in r.get("actions") or []])
            if proposed != sample.target and (r.get("raw") or proposed):
                out.append(_pair(ep.id, step, sample, r.get("raw") or proposed, "reject", r.get("by"), r.get("reason")))
    return out


def _judged(step) -> bool:
    return (step.provenance.source == "corrected" and step.provenance.proposal_action is not None) or bool(
        step.info.get("rejections"))


def _action(d):
    return Action.from_dict(d)


def _rendered(step, thought: str, actions) -> str:
    """A proposal in the SFT target's form, to compare with the target (and to stand in for a
    reply recorded without its raw text)."""
    if not actions:
        return ""
    return format_normalized(thought, actions, coords.SMART_RESIZE, step.observation.width, step.observation.height)


def _pair(eid: str, step, sample: Sample, rejected: str, decision: str, by, reason=None) -> PreferencePair:
    return PreferencePair(sample, Sample(sample.messages, rejected, sample.source), eid, step.index, decision, by, reason)


def pair_record(pair: PreferencePair) -> dict:
    """A pair as one JSON line of preferences.jsonl: {"messages" (the prompt), "images", "chosen",
    "rejected", ...}; the prompt is sample_record's of the chosen sample (the same layout)."""
    rec = sample_record(pair.chosen)
    return {"id": f"{pair.episode_id}-{pair.step}-{pair.decision}", "episode_id": pair.episode_id, "step": pair.step,
            "messages": rec["messages"][:-1], "images": rec["images"], "chosen": pair.chosen.target,
            "rejected": pair.rejected.target, "decision": pair.decision, "decided_by": pair.decided_by,
            "reason": pair.reason}


def sample_record(sample: Sample) -> dict:
    """A training sample as JSON in the chat form multimodal trainers read (TRL, ms-swift): the
    messages with each screenshot as an {"type": "image"} part, the screenshots' blob hashes in
    order under "images", the target as the last assistant message."""
    images: list[str] = []

    def part(p):
        if p.get("type") != "image":
            return {"type": "text", "text": p["text"]}
        frame = p["frame"]
        if frame.encoded is None:
            raise SFTError(f"{sample.source}: a screenshot without its encoded bytes cannot be written")
        images.append(hashlib.sha256(frame.encoded).hexdigest())  # the store's blob hash of those bytes
        return {"type": "image"}

    msgs = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else [part(p) for p in m["content"]]}
            for m in sample.messages]
    return {"messages": msgs + [{"role": "assistant", "content": sample.target}], "images": images}


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
        stats = {"loss": 0.0, "margin": 0.0, "accuracy": 0.0, "nll": 0.0}
        for i in batch:  # one pair at a time: the loss of a batch is the mean of its pairs'
            c, r = enc[i]
            pc, pr = sequence_logprob(model, c), sequence_logprob(model, r)
            rc, rr = (torch.tensor(v, device=pc.device) for v in ref[i])
            loss, st = dpo_loss(pc.unsqueeze(0), pr.unsqueeze(0), rc.unsqueeze(0), rr.unsqueeze(0), cfg.beta)
            # keep the chosen reply likely, not only likelier than the rejected one
            nll = -pc / c["assistant_mask"].sum().clamp(min=1).to(pc.device)
            ((loss + cfg.nll * nll) / len(batch)).backward()
            stats["loss"] += float(loss.detach()) / len(batch)
            stats["nll"] += float(nll.detach()) / len(batch)
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
