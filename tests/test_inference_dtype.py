"""bf16 inference for rollouts and evaluation (issue 42): a bf16 actor answers like the fp32
learner scores (log-probs within a stated tolerance on the same tokens), its replies parse, the
weights the learner publishes reach a bf16 copy cast while the learner keeps float32, and the
option is a validated setting of PPO, the flywheel and `sandbox eval`."""
from __future__ import annotations

import json

import pytest

from main import main
from tests.vlm_fixtures import one_thread, tiny_vlm_dir  # noqa: F401 - fixtures

ENV = {"width": 224, "height": 168, "families": ["click_button", "radio"]}
# |log p_bf16 - log p_fp32| per generated token, bf16 actor against the fp32 learner on the same tokens. bf16
# keeps 8 bits of mantissa (relative rounding 2^-9 = 0.2%) in every weight and activation. Measured on the
# tiny model (random weights, flat distributions): mean 0.001, max 0.003, bounded here by TINY_MEAN and
# TINY_MAX. On the default model the median is 2e-5 and the mean within 0.002 of the fp32 actor's own (both
# ~0.14 from the pointer's rewritten coordinates: the README's bf16 table); DEFAULT_MEAN bounds the excess.
# exp(0.05) = 1.05 is well inside PPO's clip range (0.8-1.28).
TINY_MEAN, TINY_MAX, DEFAULT_MEAN = 0.02, 0.2, 0.05


def _fp32_scores(trajs, model, processor):
    """The fp32 learner's log-probs of the trajectories' generated tokens, beside the actor's own
    (trainer.learn.ppo_batch: how PPO scores them)."""
    import torch

    from trainer.learn.ppo_batch import build_turns, pack_logprobs, packs

    turns = build_turns(trajs, processor)
    assert turns and all(tb.behaviour_lp is not None for tb in turns)
    with torch.no_grad():
        got = [(pack_logprobs(model, p, 1.0), torch.cat([tb.behaviour_lp for tb in p.turns]))
               for p in packs(turns, model.config, model.device, 0)]
    return torch.cat([g for g, _ in got]), torch.cat([b for _, b in got])


def test_bf16_actor_logprobs_are_within_tolerance_of_the_fp32_learner(tiny_vlm_dir, one_thread):  # noqa: F811
    import torch

    from agent.vlm.model import load_vlm
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.runner import run_episode
    from trainer.sandbox.env import SandboxEnv

    actor = VLMActor.load(tiny_vlm_dir, inference_dtype="bf16", max_new_tokens=12)
    assert actor.model.dtype == torch.bfloat16 and actor.inference_dtype == "bf16"
    env = SandboxEnv(**ENV)
    try:  # sampled at temperature 1, as PPO's rollouts are
        trajs = [run_episode(actor, env, s, family="radio", max_steps=2, greedy=False) for s in (3, 4)]
    finally:
        env.close()
    for t in (t for tr in trajs for t in tr.turns):
        assert 1 <= len(t.response_ids) <= 12 and len(t.logprobs) == len(t.response_ids)
        assert t.text == actor.processor.tokenizer.decode(t.response_ids, skip_special_tokens=True)
    learner, processor = load_vlm(tiny_vlm_dir, device="cpu")
    assert learner.dtype == torch.float32
    fp32, bf16 = _fp32_scores(trajs, learner, processor)
    gap = (fp32 - bf16).abs()
    assert torch.isfinite(gap).all() and (bf16 <= 0).all()
    assert gap.mean() <= TINY_MEAN and gap.max() <= TINY_MAX, (float(gap.mean()), float(gap.max()))
    print(f"tiny model: mean |dlogp| {float(gap.mean()):.4f}, max {float(gap.max()):.4f}")
    assert gap.max() > 0  # it is the bf16 copy that answered, not the fp32 weights again


def test_bf16_default_model_replies_parse_and_score_close_to_fp32(one_thread):  # noqa: F811
    """The shipped element-list model in bf16, greedy on held-out seeds at its own screen: every
    reply parses, and the fp32 learner scores its tokens as closely as it scores the fp32 actor's.
    (The seeds are ones whose fp32 replies all parse too: in check_boxes and type_text the model
    writes some replies that parse in neither dtype. Both actors' gaps include the tokens after a
    coordinate the pointer rewrote, recorded after the model's own digits: see the README's bf16
    table.)"""
    import torch

    from agent.storage.model_files import DEFAULT_MODEL_DIR
    from agent.vlm.model import load_vlm
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.runner import play
    from trainer.rollout.sandbox_cli import model_screen
    from trainer.sandbox.env import SandboxEnv, observation_for
    from trainer.sandbox.task import HELDOUT_START

    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        pytest.skip(f"no default model at {DEFAULT_MODEL_DIR}")
    learner, processor = load_vlm(DEFAULT_MODEL_DIR, device="cpu")
    tickets = [(HELDOUT_START, "click_button"), (HELDOUT_START + 2, "radio"), (HELDOUT_START + 4, "list_pick")]
    gaps = {}
    for dtype in ("fp32", "bf16"):
        actor = VLMActor.load(DEFAULT_MODEL_DIR, inference_dtype=dtype, max_new_tokens=128)
        env = SandboxEnv(**model_screen(DEFAULT_MODEL_DIR), observation=observation_for(DEFAULT_MODEL_DIR))
        try:
            trajs = play(actor, tickets, envs=[env], greedy=True)
        finally:
            env.close()
        turns = [t for tr in trajs for t in tr.turns]
        assert turns and all(t.parse_error is None for t in turns), (dtype, [t.text for t in turns if t.parse_error])
        fp32, recorded = _fp32_scores(trajs, learner, processor)
        gaps[dtype] = (fp32 - recorded).abs()
        assert torch.isfinite(gaps[dtype]).all()
    assert gaps["bf16"].median() <= 1e-3, float(gaps["bf16"].median())
    assert gaps["bf16"].mean() <= gaps["fp32"].mean() + DEFAULT_MEAN, (float(gaps["bf16"].mean()),
                                                                       float(gaps["fp32"].mean()))


def test_weights_published_to_a_bf16_worker_arrive_cast_and_the_learner_stays_fp32(tiny_vlm_dir, tmp_path):  # noqa: F811
    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.lora import plain_state_dict
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.pool import publish_weights

    learner, _ = load_vlm(tiny_vlm_dir, device="cpu")
    with torch.no_grad():  # an update's worth of change, so the copy must take the new weights to match
        for p in learner.parameters():
            p.add_(torch.randn_like(p) * 1e-2)
    master = {k: v.clone() for k, v in learner.state_dict().items()}
    worker = VLMActor.load(tiny_vlm_dir, inference_dtype="bf16")

    def check_worker():
        got = worker.model.state_dict()
        for k, v in master.items():
            assert got[k].dtype == torch.bfloat16, k
            assert torch.equal(got[k], v.to(torch.bfloat16)), k

    worker.load_weights(publish_weights(learner, tmp_path / "w", 1))  # worker processes: through a file
    check_worker()
    with torch.no_grad():
        for p in worker.model.parameters():
            p.zero_()
    worker.load_state(plain_state_dict(learner))  # Ray: a state dict through the object store
    check_worker()
    for k, v in learner.state_dict().items():  # the master weights: float32, untouched
        assert v.dtype == torch.float32 and torch.equal(v, master[k]), k

    with pytest.raises(ValueError, match="float32"):  # an fp32 model is not a bf16 actor by saying so
        VLMActor(learner, worker.processor, inference_dtype="bf16")
    with pytest.raises(ValueError, match="inference_dtype"):
        VLMActor.load(tiny_vlm_dir, inference_dtype="fp16")


def test_ppo_with_bf16_rollouts_in_process_trains_fp32_weights(tiny_vlm_dir, tmp_path, one_thread):  # noqa: F811
    """workers 0: the learner plays through a bf16 copy of its own, refreshed every batch; its
    own weights stay float32 and train."""
    import math

    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.ppo import PPOConfig, train_ppo
    from trainer.rollout.specs import EnvSpec

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = PPOConfig(updates=1, batch_episodes=2, epochs=1, minibatch_turns=4, n_workers=0, value_pretrain_iters=0,
                    max_new_tokens=8, inference_dtype="bf16")
    res = train_ppo(model, proc, cfg, model_dir=tiny_vlm_dir, work_dir=tmp_path / "w",
                    env=EnvSpec(width=224, height=168, families=["click_button"], max_steps=2), progress=False)
    row = res["history"][-1]
    assert row["phase"] == "ppo" and math.isfinite(row["policy_loss"]) and math.isfinite(row["imp_weight_mean"])
    # pi_prox / pi_behav between the fp32 learner and the bf16 copy that sampled: near 1
    assert abs(row["imp_weight_mean"] - 1) < 0.05, row["imp_weight_mean"]
    assert all(v.dtype == torch.float32 for v in model.state_dict().values() if v.is_floating_point())
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_option_is_a_checked_setting_everywhere(capsys):
    from trainer.config_flags import ConfigError
    from trainer.flywheel.config import FlywheelConfig
    from trainer.learn.ppo_config import PPOConfig
    from trainer.rollout.specs import ActorSpec, SpecError

    assert PPOConfig().inference_dtype == "fp32" and FlywheelConfig().inference_dtype == "fp32"
    with pytest.raises(ConfigError, match="inference_dtype"):
        PPOConfig(inference_dtype="fp16").validate()
    with pytest.raises(SpecError, match="ActorSpec.inference_dtype"):
        ActorSpec(inference_dtype="half")
    assert FlywheelConfig(inference_dtype="bf16").ppo.inference_dtype == "bf16"  # one flag for all that plays
    with pytest.raises(ConfigError, match="inference_dtype"):
        FlywheelConfig(inference_dtype="int8")
    assert main(["sandbox", "eval", "--policy", "expert", "--episodes", "1", "--inference-dtype", "bf16"]) == 2
    assert "--inference-dtype is for the episodes of a local model" in capsys.readouterr().err


def test_sandbox_eval_runs_the_default_model_in_bf16(capsys, one_thread):  # noqa: F811
    from agent.storage.model_files import DEFAULT_MODEL_DIR

    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        pytest.skip(f"no default model at {DEFAULT_MODEL_DIR}")
    assert main(["sandbox", "eval", "--policy", "default", "--episodes", "2", "--families", "radio", "--envs", "2",
                 "--inference-dtype", "bf16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["intervals"]["overall"]["episodes"] == 2 and 0 <= out["overall"] <= 1
