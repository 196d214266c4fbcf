"""PPO smoke test: value pretraining then two real PPO updates of the tiny VLM against the Qt
sandbox, with the critic; metrics finite and the weights actually move."""
from __future__ import annotations

import math

import pytest

from tests.vlm_fixtures import one_thread, tiny_vlm_dir  # noqa: F401 - fixtures

pytest.importorskip("trainer.rl.gae", reason="trainer/rl (the PPO math) is not written yet")


def test_two_ppo_updates_with_value_pretraining(tiny_vlm_dir, tmp_path, one_thread):  # noqa: F811
    import torch

    from agent.vlm import load_vlm
    from trainer.metrics import MetricsLog, read_metrics
    from trainer.ppo import Critic, PPOConfig, train_ppo

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    critic0 = Critic(model)
    # the critic starts from the policy's weights, with a zero head
    assert torch.equal(critic0.backbone.language_model.embed_tokens.weight, model.model.language_model.embed_tokens.weight)
    cfg = PPOConfig(updates=2, batch_episodes=2, epochs=1, minibatch_turns=4, n_workers=0, value_pretrain_iters=1,
                    value_pretrain_epochs=1, max_new_tokens=12)
    log = MetricsLog(tmp_path / "log", tensorboard=False)
    res = train_ppo(model, proc, cfg, model_dir=tiny_vlm_dir, work_dir=tmp_path / "w",
                    env_kw={"width": 224, "height": 168, "families": ["click_button"], "max_steps": 2}, log=log,
                    progress=False)
    rows = read_metrics(log.path)
    assert [r["phase"] for r in rows] == ["value_pretrain", "ppo", "ppo"]
    for r in rows[1:]:
        for k in ("reward", "success_rate", "entropy", "approx_kl", "clipfrac", "explained_variance", "think_length",
                  "episode_length", "value_loss", "policy_loss"):
            assert isinstance(r[k], float) and math.isfinite(r[k]), k
        assert r["entropy"] > 0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert res["critic"].head.weight.abs().sum() > 0  # value pretraining moved the head off zero
