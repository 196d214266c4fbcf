"""Scaling out: N learner processes (real torch.distributed, gloo, 2 CPU processes), bf16
autocast, gradient checkpointing, LoRA through real peft, and `train plan` checked against a
measured training step of the tiny model."""
from __future__ import annotations

import json
import os

import pytest

from tests.factories import make_episode
from tests.vlm_fixtures import one_thread, tiny_vlm_dir  # noqa: F401 - fixtures


@pytest.fixture(scope="module")
def train_jsonl(tmp_path_factory):
    """An `export` JSONL of 3 episodes x 2 steps (6 samples) with their screenshots."""
    from agent.storage.export import export_jsonl
    from agent.storage.store import Store

    root = tmp_path_factory.mktemp("scale_data")
    with Store(root / "store") as store:
        for _ in range(3):
            make_episode(store, 2, width=224, height=168)
        return export_jsonl(store, root / "export" / "train.jsonl")["path"]


def _weights(d):
    from safetensors.torch import load_file

    return load_file(str(d / "model.safetensors"))


def _max_diff(a, b) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _sft(main, model, jsonl, out, *extra):
    return main(["train", "sft", "--model", str(model), "--jsonl", str(jsonl), "--out", str(out), "--max-steps", "3",
                 "--batch", "3", "--seed", "0", *extra])


def test_two_learner_processes_end_with_the_one_process_weights(tiny_vlm_dir, train_jsonl, tmp_path, capsys):  # noqa: F811
    """Same global batch and seed: DDP and FSDP2 over 2 gloo processes give the 1-process weights
    (a batch of 3 splits 2 + 1, so the padding step is exercised too)."""
    from main import main

    runs = {"one": [], "ddp": ["--nproc", "2"], "fsdp": ["--nproc", "2", "--shard", "fsdp"]}
    results = {}
    for name, extra in runs.items():
        assert _sft(main, tiny_vlm_dir, train_jsonl, tmp_path / name, *extra) == 0
        results[name] = json.loads(capsys.readouterr().out)
    one = _weights(tmp_path / "one")
    assert _max_diff(one, _weights(tiny_vlm_dir)) > 1e-3  # training moved the weights
    for name in ("ddp", "fsdp"):
        assert results[name]["processes"] == 2 and results[name]["config"]["shard"] == name
        assert _max_diff(one, _weights(tmp_path / name)) < 1e-4, name
        assert results[name]["last_loss"] == pytest.approx(results["one"]["last_loss"], rel=1e-4)
    rows = [json.loads(line) for line in (tmp_path / "ddp-logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # rank 0 alone logs


def test_lora_saves_an_adapter_and_merged_weights_that_load(tiny_vlm_dir, train_jsonl, tmp_path, capsys, one_thread):  # noqa: F811
    import torch
    import transformers

    from agent.vlm.model import load_vlm, to_model
    from main import main
    from trainer.learn.memory_plan import plan_memory
    from trainer.learn.sft import encode, jsonl_samples

    assert _sft(main, tiny_vlm_dir, train_jsonl, tmp_path / "adapter", "--lora", "4", "--bf16") == 0
    res = json.loads(capsys.readouterr().out)
    assert res["last_loss"] < res["first_loss"] + 1.0 and res["config"]["lora_r"] == 4
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "adapter" / "model.safetensors").exists()
    assert _sft(main, tiny_vlm_dir, train_jsonl, tmp_path / "merged", "--lora", "4", "--bf16", "--lora-save", "merged") == 0
    capsys.readouterr()
    # the adapter's B matrices left zero: the optimizer really stepped them
    from safetensors.torch import load_file

    adapters = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert any("lora_B" in k and float(v.abs().max()) > 0 for k, v in adapters.items())
    n_adapter = sum(v.numel() for v in adapters.values())
    assert n_adapter == plan_memory(str(tiny_vlm_dir), lora=4).trainable  # the plan counts what peft trains

    base, proc = load_vlm(tiny_vlm_dir, device="cpu", dtype="float32")
    via_adapter, _ = load_vlm(tmp_path / "adapter", device="cpu", dtype="float32")
    merged, _ = load_vlm(tmp_path / "merged", device="cpu", dtype="float32")
    stock = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(str(tmp_path / "adapter"))  # peft integration
    inputs = encode(proc, jsonl_samples(train_jsonl)[0])
    with torch.no_grad():
        logits = [m(**to_model(inputs, m)).logits for m in (base, via_adapter, merged, stock.eval())]
    assert float((logits[1] - logits[0]).abs().max()) > 1e-4  # the adapter changes the model
    assert float((logits[1] - logits[2]).abs().max()) < 1e-3  # adapter (merged on load) == merged weights
    assert float((logits[3] - logits[2]).abs().max()) < 1e-3  # transformers' own adapter loading agrees


def test_bf16_autocast_and_gradient_checkpointing_take_a_real_step(tiny_vlm_dir, train_jsonl, tmp_path, one_thread):  # noqa: F811
    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.sft import SFTConfig, jsonl_samples, load_for_training, train_sft

    model, proc = load_for_training(tiny_vlm_dir, "cpu")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = SFTConfig(max_steps=2, batch_size=2, bf16=True, grad_checkpointing=True, lr=1e-3)
    res = train_sft(model, proc, jsonl_samples(train_jsonl), cfg, tmp_path / "out", progress=False)
    assert torch.isfinite(torch.tensor(res["last_loss"]))
    assert not model.is_activation_checkpointing  # the caller's model is left as it was given
    reloaded, _ = load_vlm(tmp_path / "out", device="cpu")
    assert all(p.dtype == torch.float32 for p in reloaded.parameters())  # float32 master weights were saved
    moved = max(float((reloaded.state_dict()[k] - v).abs().max()) for k, v in before.items())
    assert moved > 1e-4


@pytest.mark.parametrize("settings", [{}, {"bf16": True}, {"grad_checkpointing": True}, {"lora_r": 4},
                                      {"lora_r": 4, "bf16": True}])
def test_the_plan_matches_a_measured_step_of_the_tiny_model(tiny_vlm_dir, train_jsonl, settings, one_thread):  # noqa: F811
    """Weights, gradients and AdamW states exactly; activations (what autograd kept) within 20%."""
    from trainer.learn.memory_plan import measure_step, plan_memory
    from trainer.learn.sft import SFTConfig, jsonl_samples, load_for_training

    model, proc = load_for_training(tiny_vlm_dir, "cpu")
    measured = measure_step(model, proc, jsonl_samples(train_jsonl)[-1], SFTConfig(**settings))
    plan = plan_memory(str(tiny_vlm_dir), bf16=settings.get("bf16", False), lora=settings.get("lora_r"),
                       grad_checkpointing=settings.get("grad_checkpointing", False), seq_len=measured["seq_len"],
                       image_tokens=measured["image_tokens"], target_tokens=measured["target_tokens"])
    for part in ("weights", "gradients", "optimizer (AdamW)"):
        assert plan.parts[part] == measured[part], part
    assert plan.parts["activations"] == pytest.approx(measured["activations"], rel=0.2)
    assert measured["image_tokens"] > 0 and measured["activations"] > 0


def test_train_plan_for_qwen25_vl_7b_without_downloads(capsys):
    from main import main

    assert main(["train", "plan", "--model", "qwen2.5-vl-7b", "--lora", "16", "--bf16"]) == 0
    table = capsys.readouterr().out
    assert "| weights |" in table and "| activations |" in table and "h100 (80 GiB): fits" in table

    def plan(*extra):
        assert main(["train", "plan", "--model", "ui-tars-1.5-7b", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    full = plan()
    assert full["params"] == 8_292_166_656  # Qwen2.5-VL-7B's published size, 8.29B
    assert full["parts"]["optimizer (AdamW)"] == 8 * full["params"] and not full["fits"]
    sharded = plan("--nproc", "8", "--shard", "fsdp")
    assert sharded["parts"]["weights"] == full["parts"]["weights"] // 8
    lora = plan("--lora", "16", "--bf16")
    assert lora["fits"] and lora["trainable"] < full["params"] // 100
    ckpt = plan("--grad-checkpointing")
    assert ckpt["parts"]["activations"] < full["parts"]["activations"] / 10
    # LoRA on FSDP2: the float32 base (not bf16: FSDP2's layer buffers hold one dtype) split 8 ways
    lora_fsdp = plan("--lora", "16", "--bf16", "--nproc", "8", "--shard", "fsdp")
    assert lora_fsdp["parts"]["weights"] == (4 * full["params"] + 4 * lora["trainable"]) // 8
    assert lora_fsdp["parts"]["weights"] < lora["parts"]["weights"] / 3
    assert lora_fsdp["parts"]["bf16 weight copies"] > lora["parts"]["bf16 weight copies"]  # the base is cast too


@pytest.mark.parametrize("argv, message", [
    (["train", "plan", "--model", "no-such-model"], "not a known configuration"),
    (["train", "plan", "--model", "qwen2.5-vl-7b", "--gpu", "big"], "--gpu 'big'"),
    (["train", "plan", "--model", "qwen2.5-vl-7b", "--seq", "10", "--image-tokens", "20"], "image_tokens"),
    (["train", "sft", "--model", "m", "--out", "o", "--nproc", "0"], "--nproc must be at least 1, got 0"),
    (["train", "sft", "--model", "m", "--out", "o", "--lora", "0"], "--lora must be at least 1, got 0"),
])
def test_bad_scale_settings_are_named(argv, message, capsys):
    from main import main

    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_lora_on_fsdp_shards_the_base_and_trains_the_same_adapter(tiny_vlm_dir, train_jsonl, tmp_path, capsys):  # noqa: F811
    """LoRA under FSDP2 (2 processes): the float32 base is sharded with the adapters, and the
    adapter equals the one-process run's; with --bf16 the base stays float32 (FSDP2's per-layer
    buffers hold one dtype) under autocast, and the merged save loads."""
    from safetensors.torch import load_file

    from agent.vlm.model import load_vlm
    from main import main

    assert _sft(main, tiny_vlm_dir, train_jsonl, tmp_path / "one", "--lora", "4") == 0
    capsys.readouterr()
    assert _sft(main, tiny_vlm_dir, train_jsonl, tmp_path / "fsdp", "--lora", "4", "--nproc", "2", "--shard", "fsdp") == 0
    res = json.loads(capsys.readouterr().out)
    assert res["processes"] == 2 and res["config"]["shard"] == "fsdp" and res["config"]["lora_r"] == 4
    one, two = (load_file(str(tmp_path / d / "adapter_model.safetensors")) for d in ("one", "fsdp"))
    assert any("lora_B" in k and float(v.abs().max()) > 0 for k, v in one.items())
    assert _max_diff(one, two) < 1e-4
    assert _sft(main, tiny_vlm_dir, train_jsonl, tmp_path / "bf16", "--lora", "4", "--bf16", "--nproc", "2",
                "--shard", "fsdp", "--lora-save", "merged") == 0
    capsys.readouterr()
    load_vlm(tmp_path / "bf16", device="cpu")
    assert _max_diff(_weights(tmp_path / "bf16"), _weights(tiny_vlm_dir)) > 0


def test_ppo_with_two_learner_processes_ends_with_the_one_process_weights(tiny_vlm_dir, tmp_path, capsys):  # noqa: F811
    """Rank 0 plays the episodes and broadcasts them; the ranks split each minibatch's micro-batches
    and sum gradients: 2 real PPO updates give the 1-process weights and metrics."""
    from main import main
    from trainer.learn.metrics import read_metrics

    def ppo(name, nproc):
        assert main(["--data", str(tmp_path / "data"), "train", "ppo", "--model", str(tiny_vlm_dir),
                     "--out", str(tmp_path / name), "--updates", "2", "--batch", "4", "--workers", "0", "--envs", "4",
                     "--value-pretrain", "1", "--epochs", "2", "--max-new-tokens", "12", "--max-steps", "2",
                     "--families", "click_button", "--width", "224", "--height", "168", "--device", "cpu",
                     "--nproc", str(nproc)]) == 0
        assert json.loads(capsys.readouterr().out)["processes"] == nproc
        return [r for r in read_metrics(tmp_path / f"{name}-logs" / "metrics.jsonl") if r["phase"] == "ppo"]

    one, two = ppo("one", 1), ppo("two", 2)
    assert len(one) == len(two) == 2
    for a, b in zip(one, two, strict=True):
        assert a["reward"] == b["reward"]  # the same episodes
        assert b["value_loss"] == pytest.approx(a["value_loss"], rel=1e-4, abs=1e-6)
        assert b["approx_kl"] == pytest.approx(a["approx_kl"], rel=1e-3, abs=1e-6)
    w1, w2 = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    assert _max_diff(w1, _weights(tiny_vlm_dir)) > 1e-4
    assert _max_diff(w1, w2) < 1e-4


def test_ppo_with_ray_actors_as_rollout_workers(tiny_vlm_dir, tmp_path, capsys):  # noqa: F811
    """A real local Ray: 2 actors, each with its own policy copy and sandboxes, weights through the
    object store; 2 updates logged, the second on episodes played after the first publish."""
    from main import main
    from trainer.learn.metrics import read_metrics

    out = tmp_path / "ray"
    rc = main(["--data", str(tmp_path / "data"), "train", "ppo", "--model", str(tiny_vlm_dir), "--out", str(out),
               "--engine", "ray", "--workers", "2", "--envs", "2", "--updates", "2", "--batch", "4", "--mode", "sync",
               "--value-pretrain", "0", "--epochs", "1", "--max-new-tokens", "12", "--max-steps", "2",
               "--families", "click_button", "--width", "224", "--height", "168", "--device", "cpu", "--minutes", "10"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    assert res["updates"] == 2 and (out / "model.safetensors").is_file()
    rows = [r for r in read_metrics(tmp_path / "ray-logs" / "metrics.jsonl") if r["phase"] == "ppo"]
    assert [r["step"] for r in rows] == [0, 1]
    assert [r["version"] for r in rows] == [1, 2] and all(r["mean_lag"] == 0 for r in rows)  # sync: played by the newest
    assert all(r["episode_length"] > 0 for r in rows)


def test_ray_flags_are_checked_by_name(tiny_vlm_dir, tmp_path, capsys):  # noqa: F811
    from main import main

    argv = ["train", "ppo", "--model", "m", "--out", "o"]
    assert main(argv + ["--engine", "ray", "--workers", "0"]) == 2
    assert "--workers must be at least 1 with engine 'ray' (Ray actors), got 0" in capsys.readouterr().err
    assert main(argv + ["--ray-address", "auto"]) == 2
    assert "--ray-address is for engine 'ray', got 'auto'" in capsys.readouterr().err
    # a cluster address where nothing listens: named at once (Ray itself retries for minutes)
    assert main(["--data", str(tmp_path / "data"), "train", "ppo", "--model", str(tiny_vlm_dir), "--out",
                 str(tmp_path / "o"), "--engine", "ray", "--workers", "1", "--ray-address", "127.0.0.1:1"]) == 2
    assert "nothing answers at --ray-address 127.0.0.1:1" in capsys.readouterr().err


def _grads_job(rank: int, world: int, out: str) -> None:
    import torch

    from trainer.learn.distributed import all_reduce_grads, all_sum_dict, broadcast_object

    params = [torch.nn.Parameter(torch.zeros(n)) for n in (2, 3, 1, 4)]
    for k, p in enumerate(params):
        if not (rank == 0 and k == 2):  # rank 0 never touched the third: its gradient is None
            p.grad = torch.full_like(p, float(rank + 1) * (k + 1))
    all_reduce_grads(params, bucket=3)  # several buckets, one parameter larger than a bucket
    sums = all_sum_dict({"a": 1.0} if rank == 0 else {"b": 2.0})
    if rank == 0:
        torch.save({"grads": [p.grad for p in params], "sums": sums, "obj": broadcast_object("from 0")}, out)
    else:
        assert broadcast_object(None) == "from 0"


def test_gradient_sums_over_two_gloo_processes(tmp_path):
    import torch

    from trainer.learn.distributed import launch

    launch(_grads_job, 2, str(tmp_path / "r.pt"))
    r = torch.load(tmp_path / "r.pt")
    assert [g.tolist() for g in r["grads"]] == [[3.0, 3.0], [6.0, 6.0, 6.0], [6.0], [12.0] * 4]
    assert r["sums"] == {"a": 1.0, "b": 2.0} and r["obj"] == "from 0"


def _listening_job(rank: int, world: int, out: str) -> None:
    """Rank 0 writes where the job's sockets listen: (local address, port) of every LISTEN row of
    /proc/net/tcp and tcp6 whose inode belongs to this process."""
    import torch.distributed as dist

    dist.barrier()  # every rank joined: the store and gloo's pairs are up
    if rank == 0:
        mine = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                if os.path.islink(f"/proc/self/fd/{fd}")}
        rows = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in open(table).read().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A" and f"socket:[{f[9]}]" in mine:  # 0A: LISTEN
                    addr, port = f[1].split(":")
                    rows.append([addr, int(port, 16)])
        with open(out, "w") as fh:
            json.dump({"port": int(os.environ["MASTER_PORT"]), "listening": rows}, fh)
    dist.barrier()


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's socket tables")
def test_the_rendezvous_store_listens_on_loopback_only(tmp_path):
    """--nproc's c10d store has no authentication: it listens on the rendezvous address it was
    given (127.0.0.1), not on every interface as TCPStore's own server does."""
    from trainer.learn.distributed import launch

    launch(_listening_job, 2, str(tmp_path / "r.json"))
    r = json.loads((tmp_path / "r.json").read_text())
    loopback = ("0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000")  # 127.0.0.1, ::1
    assert [r["port"]] == [p for a, p in r["listening"] if p == r["port"]]  # the store, once
    assert r["listening"] and all(a in loopback for a, _ in r["listening"]), r  # it and gloo's: loopback only


def test_train_default_passes_the_rollout_engine_to_its_ppo_stage():
    from dataclasses import asdict

    import main
    from trainer.config_flags import ConfigError
    from trainer.learn.cli import recipe_config
    from trainer.recipe.default_model import reproduce_command

    args = main.build_parser().parse_args(["train", "default", "--engine", "ray", "--ray-address", "auto"])
    cfg = recipe_config(args)
    assert (cfg.ppo.engine, cfg.ppo.ray_address) == ("ray", "auto")
    assert reproduce_command(asdict(cfg)).endswith("--engine ray --ray-address auto")
    args = main.build_parser().parse_args(["train", "default", "--engine", "ray", "--workers", "0"])
    with pytest.raises(ConfigError, match="ppo.n_workers must be at least 1 with engine 'ray'"):
        recipe_config(args)


def test_a_torchrun_launch_joins_torchruns_process_group(tiny_vlm_dir, train_jsonl, tmp_path, capsys, monkeypatch):  # noqa: F811
    """`torchrun --nproc-per-node 2 main.py train sft ...` (the launcher a learner across machines
    uses): each process is one rank of torchrun's group, rank 0 alone reports, and the weights
    equal the one-process run's."""
    import subprocess
    import sys
    from pathlib import Path

    from main import main
    from trainer.learn.distributed import free_port

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", str(free_port()), str(root / "main.py"), "train", "sft", "--model",
                           str(tiny_vlm_dir), "--jsonl", str(train_jsonl), "--out", str(tmp_path / "torchrun"),
                           "--max-steps", "3", "--batch", "3", "--seed", "0"],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout[proc.stdout.index("{"):])  # one report: rank 0's
    assert res["processes"] == 2
    assert _sft(main, tiny_vlm_dir, train_jsonl, tmp_path / "one") == 0
    capsys.readouterr()
    assert _max_diff(_weights(tmp_path / "one"), _weights(tmp_path / "torchrun")) < 1e-4

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    assert _sft(main, tiny_vlm_dir, train_jsonl, tmp_path / "x", "--nproc", "2") == 2
    assert "under torchrun each process is one rank: leave --nproc at 1 (got 2)" in capsys.readouterr().err
