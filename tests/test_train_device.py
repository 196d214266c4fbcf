"""Where training runs: `--device` for train sft|ct|ppo|default. On this CPU-only machine the
CUDA tests skip; they run (and must pass) wherever torch sees a GPU."""
from __future__ import annotations

import math

import pytest

from tests.vlm_fixtures import one_thread, tiny_vlm_dir  # noqa: F401 - fixtures

torch = pytest.importorskip("torch")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_load_for_training_keeps_float32_weights_on_the_asked_device(tiny_vlm_dir):  # noqa: F811
    from trainer.learn.sft import load_for_training

    model, _ = load_for_training(tiny_vlm_dir, "cpu")
    assert model.device.type == "cpu"
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    auto, _ = load_for_training(tiny_vlm_dir, "auto")
    assert auto.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert {p.dtype for p in auto.parameters()} == {torch.float32}  # not the bf16 that inference gets on a GPU


def test_a_device_that_is_not_there_is_refused_by_name(tiny_vlm_dir, tmp_path, capsys):  # noqa: F811
    from agent.vlm.model import VLMError
    from main import main
    from trainer.learn.sft import load_for_training
    from trainer.recipe.default_model import RecipeConfig, RecipeError, run_recipe

    with pytest.raises(VLMError, match="tpu"):
        load_for_training(tiny_vlm_dir, "tpu")
    rc = main(["train", "sft", "--model", str(tiny_vlm_dir), "--out", str(tmp_path / "o"), "--jsonl", str(tmp_path / "x.jsonl"),
               "--device", "tpu"])
    assert rc != 0 and "tpu" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    # the recipe checks before its demonstrations, not after
    with pytest.raises(RecipeError, match="--device"):
        run_recipe(tmp_path / "model", RecipeConfig(families=["radio"]), work_dir=tmp_path / "work", device="tpu")
    assert not (tmp_path / "work" / "metrics.jsonl").exists()
    if not torch.cuda.is_available():
        with pytest.raises(VLMError, match="no CUDA GPU"):
            load_for_training(tiny_vlm_dir, "cuda")
        rc = main(["train", "ppo", "--model", str(tiny_vlm_dir), "--out", str(tmp_path / "p"), "--device", "cuda"])
        assert rc != 0 and "no CUDA GPU" in capsys.readouterr().err


@needs_cuda
def test_sft_steps_on_the_gpu_lower_the_loss_and_save_a_loadable_checkpoint(store, tiny_vlm_dir, tmp_path):  # noqa: F811
    from agent.vlm.model import load_vlm
    from tests.test_train_sft import _samples  # the SFT tests' own episodes, through the store
    from trainer.learn.sft import SFTConfig, load_for_training, train_sft

    model, proc = load_for_training(tiny_vlm_dir, "cuda")
    res = train_sft(model, proc, _samples(store), SFTConfig(lr=2e-3, max_steps=12, batch_size=2), tmp_path / "out",
                    progress=False)
    assert res["last_loss"] < res["first_loss"]
    assert next(model.parameters()).device.type == "cuda"
    back, _ = load_vlm(tmp_path / "out", device="cpu")  # written from the GPU, read anywhere
    assert {p.dtype for p in back.parameters()} == {torch.float32}


@needs_cuda
@pytest.mark.parametrize("train_vision", [False, True])
def test_a_ppo_update_on_the_gpu(tiny_vlm_dir, tmp_path, one_thread, train_vision):  # noqa: F811
    """The learner on the GPU, rollouts in its process (on the GPU too) and in CPU workers."""
    from trainer.learn.ppo import PPOConfig, train_ppo
    from trainer.learn.sft import load_for_training
    from trainer.rollout.specs import EnvSpec

    for workers in (0, 1):
        model, proc = load_for_training(tiny_vlm_dir, "cuda")
        before = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        cfg = PPOConfig(updates=2, batch_episodes=2, epochs=1, minibatch_turns=4, n_workers=workers, value_pretrain_iters=1,
                        value_pretrain_epochs=1, max_new_tokens=12, train_vision=train_vision, kl_coef=0.1,
                        no_effect_penalty=0.1)
        res = train_ppo(model, proc, cfg, model_dir=tiny_vlm_dir, work_dir=tmp_path / f"w{workers}",
                        env=EnvSpec(width=224, height=168, families=["radio"], max_steps=2), progress=False)
        last = res["history"][-1]
        for k in ("entropy", "approx_kl", "value_loss", "policy_loss"):
            assert math.isfinite(last[k]), k
        assert res["critic"].head.weight.device.type == "cuda"
        assert any(not torch.equal(before[k], v.detach().cpu()) for k, v in model.state_dict().items())
