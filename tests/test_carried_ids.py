"""Turns carry their token ids: the learner's batch built from the prompt ids the actor generated
from (and each trajectory's screenshots, kept once) equals the batch built by tokenizing every
turn's chat again, token for token and in log-probs, in both observation modes (the elements
mode with the element-list pointer); a trajectory that has dropped its chats survives a pickle
round trip (what a rollout worker sends) and still builds the same batch.

Run as a script for the time to build a learner batch, re-tokenized against carried:
    python -m tests.test_carried_ids [--model DIR] [--episodes 8] [--steps 4]
"""
from __future__ import annotations

import pickle

import pytest
import torch

from tests.vlm_fixtures import one_thread, tiny_any_dir, tiny_qwen3_dir, tiny_vlm_dir  # noqa: F401 - fixtures
from trainer.rollout.actors import Actor


class _PointingActor(Actor):
    """Clicks through the element-list pointer on every turn (an untrained tiny model never writes
    a click): the prompt tokenized as the batched actor does it (agent.vlm.batch.build_batch_inputs:
    its ids and image keys), a click reply whose site the pointer points at entry 1 (agent.vlm.pointer.rewrite)."""

    def __init__(self, proc):
        from agent.vlm.batch import ImageCache

        self.proc, self.cache = proc, ImageCache()

    def generate_batch(self, chats, *, greedy=False, slots=None):
        from agent.vlm import pointer
        from agent.vlm.batch import build_batch_inputs
        from trainer.rollout.actors import ActorOutput

        tok = self.proc.tokenizer
        rows, keys = build_batch_inputs(self.proc, chats, self.cache)
        rid = tok("Thought: I click it.\nAction: click(start_box='(5,7)')<|im_end|>", add_special_tokens=False)["input_ids"]
        out = []
        for row, ks in zip(rows, keys, strict=True):
            prompt = row["input_ids"][0].tolist()
            lay = pointer.layout(tok, prompt + rid, len(prompt))
            ids, lps = pointer.rewrite(tok, lay, len(prompt), rid, [-1.0] * len(rid), [1], [-0.5])
            out.append(ActorOutput(tok.decode(ids, skip_special_tokens=True), ids, lps, [1], prompt, ks))
        return out


def _play(model, proc, observation: str, n: int = 3, steps: int = 3, families=("click_button", "radio"), actor=None):
    """n episodes over two envs with the batched actor (kept turns on): the path PPO's workers take."""
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.runner import EpisodeRunner
    from trainer.sandbox.env import SandboxEnv

    envs = [SandboxEnv(width=224, height=168, observation=observation) for _ in range(2)]
    try:
        actor = actor or VLMActor(model, proc, max_new_tokens=12)
        runner = EpisodeRunner(actor, envs, max_steps=steps)
        trajs = runner.run_all([(s, families[s % len(families)]) for s in range(n)])
    finally:
        for env in envs:
            env.close()
    for t in trajs:  # a reward, so the batch is like a learner's
        t.turns[-1].reward = 1.0 if t.seed % 2 else -1.0
    return trajs


def _assert_same_batch(model, proc, retokenized, carried):
    from trainer.learn.ppo_batch import Pack, pack_logprobs

    assert len(carried) == len(retokenized) > 0
    for a, b in zip(retokenized, carried, strict=True):
        assert sorted(a.inputs) == sorted(b.inputs)
        for k, v in a.inputs.items():
            assert torch.equal(v, b.inputs[k]), k
        assert torch.equal(a.target, b.target) and (a.traj, a.turn) == (b.traj, b.turn)
        assert (a.pointer is None) == (b.pointer is None)
        if a.pointer is not None:
            assert [(s.query, s.digits, s.choice) for s in a.pointer.sites] == \
                   [(s.query, s.digits, s.choice) for s in b.pointer.sites]
        with torch.no_grad():
            la = pack_logprobs(model, Pack.build([a], 0))
            lb = pack_logprobs(model, Pack.build([b], 0))
        assert torch.allclose(la, lb, atol=1e-5, rtol=0)


@pytest.mark.parametrize("observation", ["pixels", "elements"])
def test_carried_ids_build_the_batch_tokenizing_would(tiny_any_dir, observation, one_thread):  # noqa: F811
    from agent.vlm import pointer
    from agent.vlm.model import load_vlm
    from trainer.learn.ppo_batch import ImageBank, build_turns

    torch.manual_seed(0)
    model, proc = load_vlm(tiny_any_dir, device="cpu")
    if observation == "elements":
        pointer.attach(model)  # the elements model reads its list with the pointer head
    trajs = _play(model, proc, observation)
    if observation == "elements":  # and turns whose clicks went through the pointer
        trajs += _play(model, proc, observation, n=2, actor=_PointingActor(proc))
    turns = [t for tr in trajs for t in tr.turns]
    assert all(t.prompt_ids is not None and t.image_keys for t in turns)
    assert set(k for t in turns for k in t.image_keys) == set().union(*(tr.images for tr in trajs))
    if observation == "elements":
        assert any("Elements:" in proc.tokenizer.decode(t.prompt_ids) for t in turns)

    retokenized = build_turns(trajs, proc, carried=False)
    _assert_same_batch(model, proc, retokenized, build_turns(trajs, proc))
    if observation == "elements":
        assert any(tb.pointer is not None for tb in retokenized)  # the pointer's inputs were compared too

    # through the frozen vision tower's bank (the learner's default): the same log-probs
    from trainer.learn.ppo_batch import Pack, pack_logprobs

    banks = []
    for carried in (False, True):
        bank = ImageBank()
        tbs = build_turns(trajs, proc, bank, carried=carried)
        bank.encode(model.model)
        bank.attach(tbs)
        banks.append(tbs)
    for a, b in zip(*banks, strict=True):
        assert torch.equal(a.inputs["input_ids"], b.inputs["input_ids"]) and len(a.images) == len(b.images)
        with torch.no_grad():
            assert torch.allclose(pack_logprobs(model, Pack.build([a], 0)), pack_logprobs(model, Pack.build([b], 0)),
                                  atol=1e-5, rtol=0)

    # what a worker sends: the chats dropped, each screenshot once; the same batch after a pickle round trip
    before = len(pickle.dumps(trajs))
    sent = pickle.loads(pickle.dumps([tr.drop_messages() for tr in trajs]))
    assert all(t.messages is None and t.frame is None for tr in sent for t in tr.turns)
    assert len(pickle.dumps(sent)) < before
    rebuilt = build_turns(sent, proc)
    for a, b in zip(banks[0], rebuilt, strict=True):
        assert torch.equal(a.inputs["input_ids"], b.inputs["input_ids"]) and torch.equal(a.target, b.target)


def test_a_turn_without_ids_or_chat_and_mismatched_images_are_named(tiny_vlm_dir, one_thread):  # noqa: F811
    from agent.vlm.model import load_vlm
    from trainer.learn.ppo_batch import build_turns

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    trajs = _play(model, proc, "pixels", n=1, steps=1)
    turn = trajs[0].turns[0]
    turn.image_keys = ["not-a-key"]
    with pytest.raises(ValueError, match="not among its trajectory's images"):
        build_turns(trajs, proc)
    turn.prompt_ids, turn.messages = None, None
    with pytest.raises(ValueError, match="neither its prompt ids nor its chat"):
        build_turns(trajs, proc)


# ---------------------------------------------------------------- the measurement


def main(argv=None) -> int:
    """CPU seconds to build a learner batch (build_turns into an ImageBank, the vision tower not
    included) by tokenizing every chat again and from the carried ids, on one thread; and the
    trajectories' pickled size with their chats and as a worker sends them (drop_messages)."""
    import argparse
    import tempfile
    import time

    from agent.vlm.model import load_vlm
    from trainer.learn.ppo_batch import ImageBank, build_turns

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="a model folder (default: a freshly built tiny model)")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model_dir = args.model
    if model_dir is None:
        from trainer.learn.tiny_model import build_tiny_model

        model_dir = tempfile.mkdtemp(prefix="tiny-vlm-")
        build_tiny_model(model_dir)
    model, proc = load_vlm(model_dir, device="cpu")
    for observation in ("pixels", "elements"):
        trajs = _play(model, proc, observation, n=args.episodes, steps=args.steps)
        n_turns = sum(len(t.turns) for t in trajs)
        best = {}
        for carried in (False, True, False, True):
            times = []
            for _ in range(args.rounds):
                t0 = time.process_time()
                build_turns(trajs, proc, ImageBank(), carried=carried)
                times.append(time.process_time() - t0)
            best[carried] = min(best.get(carried, 1e9), min(times))
        full = len(pickle.dumps(trajs))
        sent = len(pickle.dumps([tr.drop_messages() for tr in trajs]))
        print(f"{observation}: {args.episodes} episodes, {n_turns} turns: re-tokenized {best[False] * 1000:.1f} ms, "
              f"carried {best[True] * 1000:.1f} ms ({best[False] / best[True]:.2f}x); pickled {full / 1e6:.2f} MB "
              f"with the chats, {sent / 1e6:.2f} MB as a worker sends them")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
