"""Promotion on evidence with real checkpoints evaluated for real: a candidate becomes current only
when the paired 95% interval of its held-out gain over the current model, on the same fresh seeds,
lies above min_gain. The shipped default model against a broken copy of it: the better one is
promoted, the worse one refused, and a copy of the current model refused. Each iteration draws a
fresh block of held-out seeds; a failed iteration is rejected."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.vlm_fixtures import tiny_vlm_dir  # noqa: F401 - fixture
from trainer.config_flags import ConfigError
from trainer.flywheel import FlywheelError
from trainer.flywheel.registry import Registry, paired_comparison

FAMILY = "click_button"
ENV = {"width": 224, "height": 168, "max_steps": 2}
# the shipped model's best families at its own screen size (about 30-40% each, held-out)
SHIPPED_FAMILIES = ["dropdown", "tabs"]
SHIPPED_ENV = {"width": 320, "height": 240}


@pytest.fixture(scope="module")
def trained_dir(tiny_vlm_dir, tmp_path_factory):  # noqa: F811
    """The tiny model after a short SFT on expert demonstrations: it has learnt the grammar (80 steps:
    with a digit per token, 40 left coordinates like (98,169,16))."""
    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.sft import SFTConfig, train_sft
    from trainer.recipe.default_model import demonstrations

    torch.set_num_threads(1)
    _, samples = demonstrations([FAMILY], 6, width=ENV["width"], height=ENV["height"], progress=False)
    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    out = tmp_path_factory.mktemp("trained") / "model"
    train_sft(model, proc, samples, SFTConfig(lr=3e-3, batch_size=4, max_steps=80, seed=0), out, progress=False)
    return out


def damage(src, dst):
    """Copy a checkpoint with every weight replaced by large noise: a broken model that still loads."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    state = load_file(str(dst / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    bad = {k: (torch.randn(v.shape, generator=g) * 5).to(v.dtype) if v.is_floating_point() else v for k, v in state.items()}
    save_file(bad, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def shipped_pair(tmp_path_factory):
    """The shipped default model, a broken copy and an exact copy, each evaluated for real on one
    block of 50 fresh held-out episodes."""
    from agent.storage.store import Store
    from trainer.flywheel.evaluation import evaluate_model, reserve_eval_seeds
    from trainer.flywheel.iteration import SHIPPED_MODEL

    root = tmp_path_factory.mktemp("shipped")
    good, copy = root / "good", root / "copy"
    shutil.copytree(SHIPPED_MODEL, good)
    shutil.copytree(SHIPPED_MODEL, copy)
    bad = damage(SHIPPED_MODEL, root / "bad")
    with Store(root / "data") as store:
        start = reserve_eval_seeds(store, 25)
    kw = dict(env_kw=SHIPPED_ENV, max_new_tokens=48, seed_start=start)
    return {name: (d, evaluate_model(d, SHIPPED_FAMILIES, 25, **kw)) for name, d in
            (("good", good), ("bad", bad), ("copy", copy))}


def test_promotion_takes_the_clearly_better_model_and_refuses_worse_or_equal(store, shipped_pair):
    (good_dir, good), (bad_dir, bad), (copy_dir, copy) = (shipped_pair[k] for k in ("good", "bad", "copy"))
    assert good["overall"]["episodes"] == 50 and good["overall"]["success"] >= 0.1  # a model that works
    assert bad["overall"]["success"] == 0.0

    # the better one is promoted over the broken one
    reg = Registry(store)
    v0 = reg.register(bad_dir, metrics=bad)
    reg.make_first(v0.version, "first model: nothing to compare with")
    v1 = reg.register(good_dir, parent=v0.version, iteration=1, metrics=good)
    promoted, why = reg.decide(v1.version)
    assert promoted and reg.current().version == v1.version and reg.get(v0.version).status == "retired"
    cmp_ = reg.get(v1.version).metrics["comparison"]
    assert cmp_["against"] == v0.version and cmp_["episodes"] == 50 and cmp_["ci95"][0] > 0
    assert why.startswith(f"promoted over {v0.version}: held-out success ") and "on the same 50 fresh episodes" in why
    assert reg.get(v1.version).decision == why

    # the other way round: the broken candidate is refused, and the reason names the interval
    v2 = reg.register(bad_dir, parent=v1.version, iteration=2, metrics=bad)
    promoted, why = reg.decide(v2.version)
    assert not promoted and reg.current().version == v1.version and reg.get(v2.version).status == "rejected"
    assert why.startswith(f"not promoted, {v1.version} stays") and "95% CI [-" in why
    assert reg.get(v2.version).metrics["comparison"]["ci95"][1] < 0

    # a copy of the current model: no gain the noise cannot explain, so no promotion
    v3 = reg.register(copy_dir, parent=v1.version, iteration=3, metrics=copy)
    promoted, why = reg.decide(v3.version)
    assert not promoted and reg.current().version == v1.version
    # (greedy evaluation repeats on an idle machine; once, on loaded cores, one of 50 outcomes of the
    # same weights differed, so the copy's numbers are allowed to differ by an episode or two)
    same = reg.get(v3.version).metrics["comparison"]
    assert abs(same["diff"]) <= 0.1 and same["ci95"][0] <= 0 <= same["ci95"][1] and "not above +0.0" in why

    # min_gain raises the bar: the good model over the broken one needs its whole interval above it
    lo = cmp_["ci95"][0]
    from agent.storage.store import Store

    with Store(store.root.parent / "strict") as strict:
        reg2 = Registry(strict)
        reg2.make_first(reg2.register(bad_dir, metrics=bad).version, "first")
        c = reg2.register(good_dir, parent="v0000", iteration=1, metrics=good).version
        assert reg2.decide(c, min_gain=lo + 0.01)[0] is False


def test_evaluations_on_different_seeds_are_not_compared(store, shipped_pair):
    from trainer.flywheel.evaluation import evaluate_model

    good_dir, good = shipped_pair["good"]
    other = evaluate_model(good_dir, SHIPPED_FAMILIES, 2, env_kw=SHIPPED_ENV, max_new_tokens=48,
                           seed_start=good["seed_start"] + 25)
    with pytest.raises(FlywheelError, match="evaluated differently"):
        paired_comparison(good, other)
    forged = {**other, "eval_signature": good["eval_signature"]}
    with pytest.raises(FlywheelError, match="not on the same episodes"):
        paired_comparison(good, forged)


def test_eval_seed_blocks_are_fresh_and_never_reused(tmp_path):
    from agent.storage.store import Store
    from trainer.flywheel.evaluation import FLYWHEEL_EVAL_OFFSET, reserve_eval_seeds
    from trainer.flywheel.iteration import FlywheelConfig
    from trainer.sandbox.task import HELDOUT_START

    with Store(tmp_path / "d") as store:
        a, b = reserve_eval_seeds(store, 34), reserve_eval_seeds(store, 10)
    with Store(tmp_path / "d") as store:  # survives a restart
        c = reserve_eval_seeds(store, 1)
    assert (a, b, c) == (HELDOUT_START + FLYWHEEL_EVAL_OFFSET, a + 34, a + 44)
    cfg = FlywheelConfig()
    assert cfg.eval_episodes == 200 and cfg.eval_seeds * len(cfg.families) >= 200
    assert FlywheelConfig(families=["radio", "tabs", "dropdown"], eval_episodes=200).eval_seeds == 67


def test_failed_iteration_and_mismatched_evaluations(store, tmp_path):
    reg = Registry(store)
    v0 = reg.register(tmp_path, metrics={"mean_success": 0.5, "eval_signature": "a", "outcomes": [[FAMILY, 1, True]]})
    reg.make_first(v0.version, "first model: nothing to compare with")
    with pytest.raises(FlywheelError, match="already has a current model"):
        reg.make_first(v0.version, "again")
    v1 = reg.register(tmp_path / "missing", parent=v0.version, iteration=1, note="failed: RuntimeError: boom")
    assert reg.decide(v1.version) == (False, "failed: RuntimeError: boom")
    assert reg.current().version == v0.version and reg.get(v1.version).decision == "failed: RuntimeError: boom"
    v2 = reg.register(tmp_path, parent=v0.version, iteration=2,
                      metrics={"mean_success": 1.0, "eval_signature": "b", "outcomes": [[FAMILY, 1, True]]})
    with pytest.raises(FlywheelError, match="evaluated differently"):
        reg.decide(v2.version)
    assert reg.current().version == v0.version
    with pytest.raises(FlywheelError, match="no model version 'v9999'"):
        reg.get("v9999")
    with pytest.raises(FlywheelError, match="already registered"):
        reg.register(tmp_path, version=v0.version)


def test_an_iteration_that_wrecks_the_model_keeps_the_current_one(store, trained_dir):
    """run_iteration end to end (collect, route, CT/SFT, evaluate, register, decide) with a
    deliberately destructive SFT learning rate."""
    from agent.schema import Action, Provenance
    from tests.factories import make_episode
    from trainer.flywheel.iteration import FlywheelConfig, run_iteration
    from trainer.rollout.runner import demonstrate, plan, trajectory_to_episode

    for traj in demonstrate(plan(2, families=[FAMILY]), env_kw={"width": ENV["width"], "height": ENV["height"]}):
        trajectory_to_episode(traj, store, producer="expert")
    corrected = make_episode(store, 2, kind="supervised")  # a supervisor's edit: one preference pair for DPO
    corrected.steps[0].provenance = Provenance("corrected", proposal_thought="Click the corner.",
                                               proposal_action=Action("click", {"start_box": (0.9, 0.9)}), decision="edit")
    store.save_episode(corrected)
    cfg = FlywheelConfig.from_dict(dict(width=ENV["width"], height=ENV["height"], max_steps=2, families=[FAMILY],
                                        eval_episodes=3, rollouts=1, ct_steps=0, sft_steps=3, sft_lr=5.0, batch=2,
                                        dpo_steps=2, ppo_updates=0, max_new_tokens=48))
    reg = Registry(store)
    v0 = reg.register(trained_dir)
    reg.make_first(v0.version, "first model: nothing to compare with")
    stages = []
    rep = run_iteration(store, cfg, progress=lambda d, n, label, detail="": stages.append((d, label)))
    assert rep["parent"] == v0.version and rep["iteration"] == 1
    assert rep["promoted"] is False and rep["current"] == v0.version
    assert reg.get(rep["candidate"]).status == "rejected"
    # the two expert episodes, and the current model's rollout too where it reached the goal
    assert len(rep["rollouts"]) == 1
    won = store.load_episode(rep["rollouts"][0]).outcome.success
    assert rep["routed"]["sft"] == 2 + bool(won)
    lineage = reg.get(rep["candidate"]).lineage
    assert lineage["parents"] == [v0.version] and len(lineage["pools"]["sft"]) == 2 + bool(won)
    assert [s["phase"] for s in lineage["stages"]] == ["ct", "sft", "dpo", "ppo"]
    assert lineage["stages"][2]["pairs"] == 1 and lineage["stages"][2]["steps"] == cfg.dpo_steps
    assert stages[-1] == (100, "eval") and [d for d, _ in stages] == sorted(d for d, _ in stages)
    # both evaluated for real on one fresh block of held-out seeds; the wrecked one is no better
    from trainer.flywheel.evaluation import FLYWHEEL_EVAL_OFFSET, NEXT_SEEDS_KEY
    from trainer.sandbox.task import HELDOUT_START

    cur = reg.get(v0.version).metrics
    assert cur["measured_at_iteration"] == 1 and cur["overall"]["episodes"] == 3
    assert rep["metrics"]["seed_start"] == cur["seed_start"] == HELDOUT_START + FLYWHEEL_EVAL_OFFSET
    assert [s for _, s, _ in rep["metrics"]["outcomes"]] == [cur["seed_start"] + k for k in range(3)]
    assert store.get_setting(NEXT_SEEDS_KEY) == FLYWHEEL_EVAL_OFFSET + 3  # the next iteration plays new seeds
    cmp_ = rep["metrics"]["comparison"]
    assert cmp_["against"] == v0.version and cmp_["episodes"] == 3 and cmp_["candidate"] <= cmp_["current"]
    assert rep["decision"].startswith(f"not promoted, {v0.version} stays")
    assert reg.get(rep["candidate"]).decision == rep["decision"]


def test_bad_flywheel_settings_are_refused_by_name(store, capsys):
    from main import main
    from trainer.flywheel.iteration import FlywheelConfig

    with pytest.raises(ConfigError, match="flywheel.families has an unknown sandbox family 'nope'"):
        FlywheelConfig(families=["nope"])
    store.set_setting("flywheel.config", {"sft_stepz": 3})
    with pytest.raises(ConfigError, match="unknown setting.*sft_stepz"):
        FlywheelConfig.load(store)
    assert main(["flywheel", "run", "--data", str(store.root)]) == 2  # the saved config is named, not ignored
    assert "sft_stepz" in capsys.readouterr().err
    store.set_setting("flywheel.config", {})
    assert main(["flywheel", "run", "--sft-steps", "-1", "--data", str(store.root)]) == 2
    assert "--sft-steps must be >= 0, got -1" in capsys.readouterr().err


def test_the_first_iteration_starts_from_the_shipped_default_model(store):
    """Before, the flywheel started from random weights (0% held-out) while Supervise and Drive used
    the shipped default model; now v0000 is a copy of the shipped model where it fits the screen
    size (measured later beside the first candidate), and a different size says why it cannot be used."""
    from trainer.flywheel.iteration import SHIPPED_MODEL, FlywheelConfig, bootstrap_model, first_model

    cfg = FlywheelConfig(families=[FAMILY], eval_episodes=2, max_steps=3)  # 336x252, the shipped model's size
    assert first_model(cfg) == "the shipped default model"
    reg = Registry(store)
    v0 = bootstrap_model(store, cfg, reg)
    assert v0.version == "v0000" and v0.status == "current" and v0.note == "the shipped default model"
    assert v0.decision == "first model: nothing to compare with"
    assert (Path(v0.path) / "model.safetensors").read_bytes() == (SHIPPED_MODEL / "model.safetensors").read_bytes()
    assert Path(v0.path) != SHIPPED_MODEL
    small = FlywheelConfig(families=[FAMILY], width=224, height=168)
    assert first_model(small) == ("a new model with random weights "
                                  "(the shipped default model is for 336x252 screens, not 224x168)")
    assert "random weights" in first_model(FlywheelConfig(families=[FAMILY], base="scratch"))
    with pytest.raises(ConfigError, match="flywheel.base must be one of default, scratch, got 'shipped'"):
        FlywheelConfig(base="shipped")


def test_old_configs_counted_in_seeds_still_load(store):
    from trainer.flywheel.iteration import FlywheelConfig

    store.set_setting("flywheel.config", {"families": ["radio", "tabs"], "eval_seeds": 5})
    cfg = FlywheelConfig.load(store)
    assert cfg.eval_episodes == 10 and cfg.eval_seeds == 5


def test_a_flat_config_saved_before_the_stages_nested_still_loads(store, capsys):
    """The store's "flywheel.config" as `flywheel run --save-config` wrote it before CT, SFT and
    PPO held their own configs; loaded, overridden by the new flags, and saved again nested."""
    from dataclasses import asdict

    from trainer.flywheel.iteration import CONFIG_KEY, FlywheelConfig

    old = {"width": 224, "height": 168, "families": ["radio", "tabs"], "eval_episodes": 20, "miniwob_episodes": 0,
           "rollouts": 4, "rollout_temperature": 1.0, "ct_steps": 5, "ct_lr": 1e-4, "sft_steps": 30, "sft_lr": 1e-3,
           "batch": 4, "dpo_steps": 0, "dpo_beta": 0.1, "dpo_lr": 2e-4, "ppo_updates": 2, "ppo_batch": 3,
           "ppo_lr": 5e-5, "ppo_workers": 1, "ppo_engine": "local", "ray_address": None, "max_new_tokens": 32,
           "max_steps": 3, "min_gain": 0.01, "base": "scratch", "threads": 1, "seed": 7, "routing": {}}
    store.set_setting(CONFIG_KEY, old)
    cfg = FlywheelConfig.load(store)
    assert (cfg.ct.max_steps, cfg.ct.lr, cfg.ct.batch_size, cfg.sft.max_steps, cfg.sft.lr, cfg.sft.batch_size) == (
        5, 1e-4, 4, 30, 1e-3, 4)
    assert (cfg.ppo.updates, cfg.ppo.batch_episodes, cfg.ppo.lr, cfg.ppo.n_workers) == (2, 3, 5e-5, 1)
    assert (cfg.ppo.seed, cfg.ppo.max_new_tokens, cfg.ct.seed, cfg.sft.warmup_steps) == (7, 32, 7, 5)  # tied; default
    assert FlywheelConfig.from_dict(asdict(cfg)) == cfg  # what --save-config writes now loads back the same
    over = FlywheelConfig.load(store, **{"ppo.lr": 1e-4, "sft.max_steps": None})  # None: keep
    assert (over.ppo.lr, over.sft.max_steps, over.ppo.batch_episodes) == (1e-4, 30, 3)
    # the flags of `flywheel run` are the fields; --batch still sets both CT's and SFT's
    import argparse

    from trainer.config_flags import add_flags, overrides

    p = argparse.ArgumentParser()
    add_flags(p, FlywheelConfig, keep=True)
    args = p.parse_args(["--ppo-lr", "3e-4", "--sft-steps", "12", "--ray-address", "auto", "--ppo-engine", "ray",
                         "--no-ppo-share-prefix", "--families", "radio"])
    assert overrides(FlywheelConfig, args) == {"families": ["radio"], "sft.max_steps": 12, "ppo.lr": 3e-4,
                                                "ppo.engine": "ray", "ppo.ray_address": "auto",
                                                "ppo.share_prefix": False}


def test_the_decision_is_said_in_words():
    from trainer.flywheel.registry import explain_decision

    c = {"episodes": 204, "current": 0.221, "candidate": 0.343, "diff": 0.122, "ci95": [0.061, 0.184]}
    assert explain_decision("v2", "v1", c, True) == (
        "promoted over v1: held-out success 34.3% vs 22.1% on the same 204 fresh episodes; "
        "difference +12.2 points, 95% CI [+6.1, +18.4], above +0.0")
    c = {**c, "candidate": 0.231, "diff": 0.01, "ci95": [-0.032, 0.051]}
    assert explain_decision("v2", "v1", c, False, 0.02) == (
        "not promoted, v1 stays: held-out success 23.1% vs 22.1% on the same 204 fresh episodes; "
        "difference +1.0 points, 95% CI [-3.2, +5.1], not above +2.0")
