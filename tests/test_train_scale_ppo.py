"""Scaling out, the PPO half: LoRA (real peft), bf16 autocast and gradient checkpointing in `train
ppo`, the merged weights rollout workers receive, the flywheel's PPO stage on Ray actors, and a
mid-sized (50-200M parameter) random-weight model taken through every scale flag on this CPU."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tests.vlm_fixtures import one_thread, tiny_vlm_dir  # noqa: F401 - fixtures

PPO_SMALL = ["--envs", "2", "--batch", "2", "--epochs", "1", "--max-new-tokens", "12", "--max-steps", "2",
             "--families", "click_button", "--width", "224", "--height", "168", "--device", "cpu", "--minutes", "10"]


def _ppo(main, model, out, *extra, data=None):
    return main(["--data", str(data or Path(out).parent / "data"), "train", "ppo", "--model", str(model),
                 "--out", str(out), *PPO_SMALL, *extra])


def _rows(log_dir, phase="ppo"):
    from trainer.learn.metrics import read_metrics

    return [r for r in read_metrics(Path(log_dir) / "metrics.jsonl") if r["phase"] == phase]


@pytest.mark.parametrize("bf16", [False, True])
def test_plain_state_dict_is_the_model_with_its_adapters_merged(tiny_vlm_dir, bf16, one_thread):  # noqa: F811
    """What a rollout worker loads: base names, float32, each adapter's delta added; the trained
    model itself is left exactly as it was (no merge/unmerge drift of a bf16 base)."""
    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.lora import apply_lora, plain_state_dict

    model, _ = load_vlm(tiny_vlm_dir, device="cpu", dtype="float32")
    base_keys = set(model.state_dict())
    assert plain_state_dict(model).keys() == base_keys  # no adapters: the state dict itself
    peft = apply_lora(model, 4, base_dtype=torch.bfloat16 if bf16 else None)
    g = torch.Generator().manual_seed(0)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # B starts at zero: give the adapters something to add
            p.data = torch.randn(p.shape, generator=g) * 0.05
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plain = plain_state_dict(model)
    assert plain.keys() == base_keys and all(v.dtype == torch.float32 for v in plain.values() if v.is_floating_point())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    merged = {k: v.detach() for k, v in copy.deepcopy(peft).merge_and_unload().float().state_dict().items()}
    worst = max(float((plain[k] - merged[k]).abs().max()) for k in base_keys)
    # peft merges into the base's dtype: exact for float32, bf16-rounded for a bf16 base
    assert worst < (2e-2 if bf16 else 1e-6)
    q = "model.language_model.layers.0.self_attn.q_proj.weight"
    assert float((plain[q] - before[q.replace(".weight", ".base_layer.weight")].float()).abs().max()) > 1e-3


def test_ppo_with_lora_and_checkpointing_ships_merged_weights_to_its_workers(tiny_vlm_dir, tmp_path, capsys):  # noqa: F811
    """`train ppo --lora 4 --grad-checkpointing` with a rollout worker process: 2 updates, the
    adapter saved and loadable, and the weights the worker was sent last are exactly the saved
    adapter merged into the base."""
    import torch
    from safetensors.torch import load_file

    from agent.vlm.model import load_vlm
    from main import main

    out = tmp_path / "lora"
    assert _ppo(main, tiny_vlm_dir, out, "--workers", "1", "--mode", "sync", "--updates", "2", "--value-pretrain", "0",
                "--lora", "4", "--grad-checkpointing") == 0
    res = json.loads(capsys.readouterr().out)
    assert res["updates"] == 2
    assert (out / "adapter_model.safetensors").is_file() and not (out / "model.safetensors").exists()
    saved = json.loads((out / "tandem_training.json").read_text())["ppo"]
    assert saved["lora_r"] == 4 and saved["grad_checkpointing"] and saved["share_prefix"] is False
    adapters = load_file(str(out / "adapter_model.safetensors"))
    assert any("lora_B" in k and float(v.abs().max()) > 0 for k, v in adapters.items())  # the optimizer stepped them
    assert not any("visual" in k for k in adapters)  # the vision tower stays frozen
    rows = _rows(tmp_path / "lora-logs")
    assert [r["version"] for r in rows] == [1, 2] and all(r["policy_tokens"] > 0 for r in rows)

    trained, _ = load_vlm(out, device="cpu", dtype="float32")  # peft adapter, merged on load
    last = sorted((tmp_path / "lora-logs" / "weights").glob("policy-v*.safetensors"))[-1]
    sent = load_file(str(last))
    mine = trained.state_dict()
    assert sent.keys() <= mine.keys() and len(sent) >= len(mine) - 1  # a tied lm_head may be left out
    assert max(float((sent[k] - mine[k]).abs().max()) for k in sent) < 1e-5
    base, _ = load_vlm(tiny_vlm_dir, device="cpu", dtype="float32")
    q = "model.language_model.layers.0.self_attn.q_proj.weight"
    assert float((mine[q] - base.state_dict()[q]).abs().max()) > 0  # PPO moved the merged weights
    vis = [k for k in mine if ".visual." in k or k.startswith("model.visual")]
    assert vis and all(torch.equal(mine[k], base.state_dict()[k]) for k in vis)

    # the app's local policy (Supervise, Drive) takes the adapter folder as it is
    from app.agent_run import RunSetupError, make_policy

    policy = make_policy("local", model_dir=str(out)).load()
    assert float((policy.model.state_dict()[q] - mine[q]).abs().max()) < 1e-6
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{}")
    with pytest.raises(RunSetupError, match="names no base_model_name_or_path"):
        make_policy("local", model_dir=str(broken))
    with pytest.raises(RunSetupError, match="no LoRA adapter either"):
        make_policy("local", model_dir=str(tmp_path))


def test_ppo_with_a_bf16_lora_base_in_the_learners_process(tiny_vlm_dir, tmp_path, capsys):  # noqa: F811
    """--bf16 with --lora holds the frozen base in bf16 and runs every forward under autocast; the
    in-process rollouts play the same model. The merged save is a float32 transformers folder."""
    import torch

    from agent.vlm.model import load_vlm
    from main import main

    out = tmp_path / "bf16"
    assert _ppo(main, tiny_vlm_dir, out, "--workers", "0", "--updates", "1", "--value-pretrain", "1",
                "--lora", "4", "--bf16", "--lora-save", "merged") == 0
    res = json.loads(capsys.readouterr().out)
    assert res["updates"] == 1
    (row,) = _rows(tmp_path / "bf16-logs")
    assert all(torch.isfinite(torch.tensor(row[k])) for k in ("policy_loss", "value_loss", "entropy"))
    assert _rows(tmp_path / "bf16-logs", "value_pretrain")  # the critic (LoRA too) was fitted first
    assert (out / "model.safetensors").is_file() and (out / "adapter" / "adapter_model.safetensors").is_file()
    merged, _ = load_vlm(out, device="cpu")
    assert all(p.dtype == torch.float32 for p in merged.parameters())


def test_ppo_memory_flags_are_checked_by_name(tmp_path, capsys):
    from main import main

    argv = ["train", "ppo", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]
    assert main(argv + ["--lora", "0"]) == 2
    assert "--lora must be at least 1, got 0" in capsys.readouterr().err
    assert main(argv + ["--lora", "4"]) == 2
    assert "--lora needs --model to be a model directory" in capsys.readouterr().err
    assert main(argv + ["--lora", "4", "--lora-alpha", "-1"]) == 2
    assert "--lora-alpha must be > 0" in capsys.readouterr().err


def test_the_flywheels_ppo_stage_runs_on_ray_actors(tiny_vlm_dir, tmp_path, capsys):  # noqa: F811
    """A real flywheel iteration whose PPO stage uses `--ppo-engine ray` (a local Ray, one actor);
    the engine is kept in the candidate's lineage. Bad engine settings are refused by name."""
    from agent.storage.store import Store
    from main import main
    from trainer.config_flags import ConfigError
    from trainer.flywheel.iteration import FlywheelConfig, run_iteration
    from trainer.flywheel.registry import Registry
    from trainer.learn.ppo_config import PPOConfig
    from trainer.rollout.runner import demonstrate, plan, trajectory_to_episode

    with pytest.raises(ConfigError, match="ppo.n_workers must be at least 1 with engine 'ray'"):
        FlywheelConfig.from_dict({"families": ["click_button"], "ppo_engine": "ray", "ppo_workers": 0})
    with pytest.raises(ConfigError, match="ppo.engine must be one of local, ray, got 'slurm'"):
        FlywheelConfig.from_dict({"families": ["click_button"], "ppo_engine": "slurm"})
    with pytest.raises(ConfigError, match="ppo.ray_address is for engine 'ray'"):
        FlywheelConfig(families=["click_button"], ppo=PPOConfig(ray_address="auto"))
    assert main(["flywheel", "run", "--data", str(tmp_path / "cli"), "--ppo-engine", "ray", "--ppo-workers", "0"]) == 2
    assert "--ppo-workers must be at least 1 with engine 'ray' (Ray actors), got 0" in capsys.readouterr().err

    with Store(tmp_path / "data") as store:
        for traj in demonstrate(plan(2, families=["click_button"]), env_kw={"width": 224, "height": 168}):
            trajectory_to_episode(traj, store, producer="expert")
        reg = Registry(store)
        v0 = reg.register(tiny_vlm_dir)
        reg.make_first(v0.version, "first model: nothing to compare with")
        cfg = FlywheelConfig.from_dict(dict(width=224, height=168, max_steps=2, families=["click_button"], eval_episodes=1,
                                            miniwob_episodes=0, rollouts=0, ct_steps=0, sft_steps=1, batch=2, dpo_steps=0,
                                            ppo_updates=1, ppo_batch=2, ppo_workers=1, ppo_engine="ray",
                                            max_new_tokens=12))
        rep = run_iteration(store, cfg)
        stages = {s["phase"]: s for s in reg.get(rep["candidate"]).lineage["stages"]}
    assert stages["ppo"]["engine"] == "ray" and stages["ppo"]["updates"] == 1
    assert rep["metrics"]["overall"]["episodes"] == 1


@pytest.mark.slow
def test_a_mid_sized_model_through_every_scale_flag(tmp_path, capsys):
    """A 69M-parameter random-weight Qwen2.5-VL (hidden 768, 8 language layers) on this CPU: one
    SFT step with 2 DDP processes, bf16, checkpointing and LoRA; one with 2 FSDP2 processes, bf16
    and checkpointing; PPO updates with a Ray rollout actor, 2 learner processes, bf16 and
    checkpointing, one with LoRA, one with FSDP2; each result loads, and `train plan` sizes it."""
    from agent.storage.export import export_jsonl
    from agent.storage.store import Store
    from agent.vlm.model import load_vlm
    from main import main
    from tests.factories import make_episode
    from trainer.learn.tiny_model import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "mid", hidden=768, layers=8, vision_depth=2)
    with Store(tmp_path / "store") as store:
        for _ in range(2):
            make_episode(store, 2, width=224, height=168)
        jsonl = export_jsonl(store, tmp_path / "export" / "train.jsonl")["path"]

    assert main(["train", "plan", "--model", str(model_dir), "--lora", "8", "--bf16", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert 50e6 <= plan["params"] <= 200e6 and plan["trainable"] < plan["params"] / 50

    sft = ["train", "sft", "--model", str(model_dir), "--jsonl", str(jsonl), "--max-steps", "1", "--batch", "2",
           "--seed", "0", "--nproc", "2", "--bf16", "--grad-checkpointing"]
    assert main(sft + ["--out", str(tmp_path / "sft-lora"), "--lora", "8"]) == 0
    assert json.loads(capsys.readouterr().out)["processes"] == 2
    assert main(sft + ["--out", str(tmp_path / "sft-fsdp"), "--shard", "fsdp"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["shard"] == "fsdp"

    ppo = ["--data", str(tmp_path / "data"), "train", "ppo", "--model", str(model_dir), "--engine", "ray",
           "--workers", "1", "--envs", "2", "--updates", "1", "--batch", "2", "--mode", "sync", "--value-pretrain", "0",
           "--epochs", "1", "--max-new-tokens", "8", "--max-steps", "1", "--families", "click_button", "--width", "224",
           "--height", "168", "--device", "cpu", "--nproc", "2", "--bf16", "--grad-checkpointing", "--minutes", "10"]
    for name, extra in (("ppo-lora", ["--lora", "8"]), ("ppo-fsdp", ["--shard", "fsdp"])):
        assert main(ppo + ["--out", str(tmp_path / name), *extra]) == 0, name
        res = json.loads(capsys.readouterr().out)
        assert res["updates"] == 1 and res["processes"] == 2
        (row,) = _rows(tmp_path / f"{name}-logs")
        assert row["version"] == 1 and row["policy_tokens"] > 0

    for d in (tmp_path / "sft-lora", tmp_path / "sft-fsdp", tmp_path / "ppo-lora", tmp_path / "ppo-fsdp"):
        m, _ = load_vlm(d, device="cpu")
        assert 50e6 <= sum(p.numel() for p in m.parameters()) <= 200e6, d


def _learner_job(rank, world, model_dir, trajs_path, shard, out_path):
    """Two PPO updates of trainer.learn.ppo.Learner on fixed trajectories (one of the ranks of a
    `shard` run, or the only process); rank 0 saves the policy's and the critic's whole weights."""
    import random

    import torch

    from trainer.learn import distributed as D
    from trainer.learn.ppo import Learner, PPOConfig
    from trainer.learn.sft import load_for_training

    torch.manual_seed(0)
    random.seed(0)  # the minibatch shuffle: the same on every rank
    policy, processor = load_for_training(model_dir, "cpu")
    trajs = torch.load(trajs_path, weights_only=False)
    cfg = PPOConfig(epochs=2, minibatch_turns=3, micro_batch_tokens=256, shard=shard, n_workers=1,
                    share_prefix=shard != "fsdp")
    learner = Learner(policy, processor, cfg)
    rows = [learner.update(trajs) for _ in range(2)]
    states = [D.full_state_dict(m, shard) or m.state_dict() for m in (policy, learner.critic)]
    if rank == 0:
        torch.save({"policy": {k: v.detach().cpu().clone() for k, v in states[0].items()},
                    "critic": {k: v.detach().cpu().clone() for k, v in states[1].items()},
                    "rows": rows}, out_path)


def test_fsdp_ppo_updates_equal_the_one_process_updates(tiny_vlm_dir, tmp_path):  # noqa: F811
    """The same trajectories, two PPO updates: 2 FSDP2 processes (policy, critic and optimizer
    states sharded; uneven micro-batch shares padded) end with the 1-process policy and critic."""
    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.distributed import launch
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.runner import EpisodeRunner
    from trainer.sandbox.env_process import make_envs

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    envs = make_envs(2, width=224, height=168, max_steps=2)
    try:
        torch.manual_seed(0)
        trajs = EpisodeRunner(VLMActor(model, proc, max_new_tokens=12), envs).run_all(
            [(s, "click_button") for s in range(5)])
    finally:
        for env in envs:
            env.close()
    torch.save(trajs, tmp_path / "trajs.pt")
    for name, world, shard in (("one", 1, "ddp"), ("fsdp", 2, "fsdp")):
        launch(_learner_job, world, str(tiny_vlm_dir), str(tmp_path / "trajs.pt"), shard, str(tmp_path / f"{name}.pt"))
    one, fsdp = (torch.load(tmp_path / f"{n}.pt", weights_only=False) for n in ("one", "fsdp"))
    start = load_vlm(tiny_vlm_dir, device="cpu")[0].state_dict()
    assert max(float((one["policy"][k] - start[k]).abs().max()) for k in start) > 1e-4  # the updates moved it
    for part in ("policy", "critic"):
        assert one[part].keys() == fsdp[part].keys()
        assert max(float((one[part][k] - fsdp[part][k]).abs().max()) for k in one[part]) < 1e-4, part
    for a, b in zip(one["rows"], fsdp["rows"], strict=True):
        assert b["value_loss"] == pytest.approx(a["value_loss"], rel=1e-4, abs=1e-6)
        assert b["approx_kl"] == pytest.approx(a["approx_kl"], rel=1e-3, abs=1e-6)


def test_ppo_on_fsdp_from_the_command_line(tiny_vlm_dir, tmp_path, capsys):  # noqa: F811
    """`train ppo --nproc 2 --shard fsdp` with a rollout worker: the worker plays with the gathered
    weights (importance weights exactly 1 in sync mode), the saved model loads; refusals by name."""
    from agent.vlm.model import load_vlm
    from main import main

    out = tmp_path / "fsdp"
    assert _ppo(main, tiny_vlm_dir, out, "--workers", "1", "--mode", "sync", "--updates", "2", "--value-pretrain", "1",
                "--nproc", "2", "--shard", "fsdp") == 0
    res = json.loads(capsys.readouterr().out)
    assert res["updates"] == 2 and res["processes"] == 2
    rows = _rows(tmp_path / "fsdp-logs")
    assert [r["version"] for r in rows] == [1, 2]
    # the second batch was played with version 1, the learner's weights when it scored it
    assert rows[1]["imp_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    model, _ = load_vlm(out, device="cpu")
    base, _ = load_vlm(tiny_vlm_dir, device="cpu")
    mine, theirs = model.state_dict(), base.state_dict()
    assert max(float((mine[k] - theirs[k]).abs().max()) for k in theirs) > 1e-4
    assert (tmp_path / "fsdp-logs" / "critic" / "critic.safetensors").is_file()

    argv = ["train", "ppo", "--model", str(tiny_vlm_dir), "--out", str(tmp_path / "x"), "--nproc", "2", "--shard", "fsdp"]
    assert main(argv + ["--workers", "0"]) == 2
    assert "--shard fsdp needs rollout workers" in capsys.readouterr().err
    assert main(argv + ["--workers", "1", "--train-vision"]) == 2
    assert "--train-vision is not supported" in capsys.readouterr().err


def test_lora_ppo_on_fsdp_sends_the_workers_the_merged_gathered_weights(tiny_vlm_dir, tmp_path, capsys):  # noqa: F811
    """`--nproc 2 --shard fsdp --lora 4`: the float32 base and the adapters sharded; each publish
    gathers them and adds the adapters' deltas for the worker; the saved adapter, merged on load,
    is what the worker was sent last."""
    from safetensors.torch import load_file

    from agent.vlm.model import load_vlm
    from main import main

    out = tmp_path / "fsdp-lora"
    assert _ppo(main, tiny_vlm_dir, out, "--workers", "1", "--mode", "sync", "--updates", "2", "--value-pretrain", "0",
                "--nproc", "2", "--shard", "fsdp", "--lora", "4") == 0
    assert json.loads(capsys.readouterr().out)["processes"] == 2
    rows = _rows(tmp_path / "fsdp-lora-logs")
    assert [r["version"] for r in rows] == [1, 2]
    assert rows[1]["imp_weight_mean"] == pytest.approx(1.0, abs=1e-5)  # played with the learner's weights
    adapters = load_file(str(out / "adapter_model.safetensors"))
    assert any("lora_B" in k and float(v.abs().max()) > 0 for k, v in adapters.items())
    trained, _ = load_vlm(out, device="cpu", dtype="float32")
    sent = load_file(str(sorted((tmp_path / "fsdp-lora-logs" / "weights").glob("policy-v*.safetensors"))[-1]))
    mine = trained.state_dict()
    assert sent.keys() <= mine.keys()
    assert max(float((sent[k] - mine[k]).abs().max()) for k in sent) < 1e-5


def test_ray_rollout_actors_share_one_inference_actor(tiny_vlm_dir, tmp_path, capsys):  # noqa: F811
    """`--engine ray --inference shared`: two rollout actors step sandboxes and one inference actor
    generates for both, batching their requests; each publish loads it before new tickets go out,
    so in sync mode the rollouts' log-probs are the learner's (importance weights 1) after the
    policy has moved."""
    from main import main

    out = tmp_path / "shared"
    assert _ppo(main, tiny_vlm_dir, out, "--engine", "ray", "--inference", "shared", "--workers", "2", "--mode", "sync",
                "--updates", "2", "--value-pretrain", "0", "--epochs", "2", "--batch", "4") == 0
    assert json.loads(capsys.readouterr().out)["updates"] == 2
    rows = _rows(tmp_path / "shared-logs")
    assert [r["version"] for r in rows] == [1, 2] and all(r["mean_lag"] == 0 for r in rows)
    assert rows[0]["approx_kl"] > 1e-4  # the first update's second pass saw a policy that had moved
    assert rows[1]["imp_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    # the two actors' requests were answered together (each generation up to 2 x --envs rows); a
    # mix-up of the rows between them would also have broken the importance weights above
    assert rows[1]["requests_per_generation"] > 1.2 and rows[1]["rows_per_generation"] > 2

    argv = ["train", "ppo", "--model", str(tiny_vlm_dir), "--out", str(tmp_path / "x")]
    assert main(argv + ["--inference", "shared"]) == 2
    assert "--inference 'shared' is for engine 'ray'" in capsys.readouterr().err
    assert main(argv + ["--engine", "ray", "--inference-gpus", "1"]) == 2
    assert "--inference-gpus is for inference 'shared', got 1.0" in capsys.readouterr().err
    assert main(argv + ["--engine", "ray", "--inference", "shared", "--inference-gpus", "-1"]) == 2
    assert "--inference-gpus must be >= 0, got -1.0" in capsys.readouterr().err


@pytest.mark.parametrize("settings", [{}, {"lora_r": 4}, {"kl_coef": 0.1}])
def test_the_ppo_plan_matches_a_measured_update_of_the_tiny_model(tiny_vlm_dir, settings, one_thread):  # noqa: F811
    """`train plan --ppo`: the policy's, critic's and reference's weights, the gradients and the
    AdamW states after one real PPO update of trainer.learn.ppo.Learner, byte for byte."""
    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.lora import apply_lora
    from trainer.learn.memory_plan import plan_ppo
    from trainer.learn.ppo import Learner, PPOConfig
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.runner import EpisodeRunner
    from trainer.sandbox.env_process import make_envs

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    envs = make_envs(2, width=224, height=168, max_steps=2)
    try:
        trajs = EpisodeRunner(VLMActor(model, proc, max_new_tokens=12), envs).run_all([(s, "click_button") for s in range(2)])
    finally:
        for env in envs:
            env.close()
    if settings.get("lora_r"):
        apply_lora(model, settings["lora_r"])
    learner = Learner(model, proc, PPOConfig(epochs=1, **settings))
    learner.update(trajs)

    def nbytes(ts):
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    models = [learner.policy, learner.critic]
    measured = {"policy weights": nbytes(learner.policy.parameters()),
                "critic weights": nbytes(learner.critic.parameters()),
                "gradients": nbytes(p.grad for m in models for p in m.parameters()),
                "optimizer (AdamW)": nbytes(v for opt in (learner.opt_p, learner.opt_c) for st in opt.state.values()
                                            for v in st.values() if torch.is_tensor(v) and v.dim())}
    if learner.ref is not None:
        measured["reference weights"] = nbytes(learner.ref.parameters())
    learner.close()
    plan = plan_ppo(str(tiny_vlm_dir), lora=settings.get("lora_r"), kl=bool(settings.get("kl_coef")))
    for part, value in measured.items():
        assert plan.parts[part] == value, part
    assert ("reference weights" in plan.parts) == bool(settings.get("kl_coef"))


def test_train_plan_for_ppo_of_a_7b_model(capsys):
    from main import main

    def plan(*extra):
        assert main(["train", "plan", "--model", "qwen2.5-vl-7b", "--ppo", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    full = plan()
    sft = json.loads((main(["train", "plan", "--model", "qwen2.5-vl-7b", "--json"]), capsys.readouterr().out)[1])
    assert full["ppo"] and not full["fits"]
    assert full["parts"]["policy weights"] == sft["parts"]["weights"]  # the same float32 model
    assert full["trainable"] < 2 * sft["trainable"]  # two models trained, both without their vision towers
    lora = plan("--lora", "16", "--bf16", "--grad-checkpointing")
    assert lora["fits"] and "reference weights" not in lora["parts"]
    with_ref = plan("--nproc", "8", "--shard", "fsdp", "--bf16", "--grad-checkpointing", "--kl")
    assert with_ref["parts"]["reference weights"] == with_ref["parts"]["policy weights"] and with_ref["fits"]
    assert main(["train", "plan", "--model", "qwen2.5-vl-7b", "--kl"]) == 2
    assert "--kl is for --ppo" in capsys.readouterr().err
    assert main(["train", "plan", "--model", "qwen2.5-vl-7b", "--ppo", "--lora", "16", "--bf16"]) == 0
    assert "PPO learner (policy + critic, vision frozen)" in capsys.readouterr().out
