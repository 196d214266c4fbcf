"""`python main.py train sft|ct|ppo|default`: training from the command line, with progress
bars, per-update metrics in OUT/metrics.jsonl and TensorBoard (OUT/tb), and PNG curves.

    python main.py train sft --model assets/default_model --out runs/sft1             # store, route "sft"
    python main.py train ct  --model assets/default_model --out runs/ct1              # store, route "ct"
    python main.py train sft --model M --jsonl export/train.jsonl --out runs/sft2     # an `export` file
    python main.py train ppo --model runs/sft1 --out runs/ppo1 --updates 10 --workers 2
    python main.py train default --out assets/default_model                           # the whole recipe
"""
from __future__ import annotations

import json

from agent.cli_common import fail as _fail  # the name its many call sites use
from agent.cli_common import open_store


def register(sub, common) -> None:
    p = sub.add_parser("train", help="train a policy: sft, ct, ppo, or the default model's whole recipe",
                       description="Training (SFT, CT, PPO) of Qwen2.5-VL-class policies; see trainer/.")
    ts = p.add_subparsers(dest="train_command", metavar="KIND", required=True)
    for kind, help_ in (("sft", "supervised fine-tuning on the high-quality pool (route 'sft')"),
                        ("ct", "continual pre-training on the lower-quality pool (route 'ct'): same loss, other data")):
        s = ts.add_parser(kind, parents=[common], help=help_)
        s.add_argument("--model", required=True, help="checkpoint directory to start from")
        s.add_argument("--out", required=True, help="output checkpoint directory (metrics and curves go beside it)")
        s.add_argument("--jsonl", help="train on an `export` JSONL file instead of the store")
        s.add_argument("--route", default=kind, help=f"store route to read (default {kind})")
        s.add_argument("--format", choices=("runtime", "export"), default="runtime",
                       help="prompt layout for store episodes: the agent's own (default) or agent.export's")
        s.add_argument("--epochs", type=float, default=1.0 if kind == "ct" else 3.0)
        s.add_argument("--lr", type=float, default=5e-4 if kind == "ct" else 1e-3)
        s.add_argument("--batch", type=int, default=8, help="samples per optimizer step (gradient accumulation)")
        s.add_argument("--max-steps", type=int)
        _add_sft_schedule_args(s, recipe=False)
        s.add_argument("--seed", type=int, default=0)
        _add_device_arg(s)
        _add_scale_args(s)
        s.set_defaults(func=cmd_sft, phase=kind)

    s = ts.add_parser("ppo", parents=[common], help="multi-turn PPO on the sandbox (critic, value pretraining)")
    s.add_argument("--model", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--updates", type=int, default=10)
    s.add_argument("--batch", type=int, default=8, help="episodes per update")
    s.add_argument("--workers", type=int, default=2, help="rollout worker processes (0: in the learner's process)")
    s.add_argument("--envs", type=int, default=16,
                   help="sandbox environments per rollout worker, played together with one batched generation per "
                        "round (default 16)")
    s.add_argument("--mode", choices=("async", "sync"), default="async")
    s.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="rollout workers: local processes (default) or Ray actors, here or on a cluster (--ray-address)")
    s.add_argument("--ray-address", help="with --engine ray: the cluster to join (auto, or HEAD:6379 after `ray start "
                                         "--head`); default: start a local Ray")
    s.add_argument("--inference", choices=("own", "shared"), default="own",
                   help="with --engine ray: each rollout actor generates with its own policy copy (own), or one "
                        "inference actor generates for all of them while they step sandboxes (shared)")
    s.add_argument("--inference-gpus", type=float, default=0.0,
                   help="with --inference shared: GPUs the inference actor asks Ray for (default 0: a CPU)")
    s.add_argument("--max-staleness", type=int, default=1)
    s.add_argument("--staleness-decay", type=float, default=1.0)
    s.add_argument("--value-pretrain", type=int, default=2, metavar="K", help="critic-only iterations before PPO")
    s.add_argument("--lr", type=float, default=2e-4)
    s.add_argument("--epochs", type=int, default=2, help="passes over each batch")
    s.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the rollouts")
    s.add_argument("--max-new-tokens", type=int, default=64, help="tokens the policy may generate per turn")
    s.add_argument("--max-steps", type=int, help="cap on an episode's steps (default: each family's own limit)")
    s.add_argument("--policy-alpha", type=float, default=0.05, help="length-adaptive lambda = 1 - 1/(alpha * l)")
    s.add_argument("--minutes", type=float, help="wall-clock budget (stops after the update that crosses it)")
    _add_ppo_shaping_args(s, recipe=False)
    s.add_argument("--families", help="comma-separated sandbox families (default: all)")
    s.add_argument("--width", type=int, default=320)
    s.add_argument("--height", type=int, default=240)
    s.add_argument("--seed", type=int, default=0)
    _add_device_arg(s)
    s.add_argument("--nproc", type=int, default=1,
                   help="learner processes (torch.distributed, gloo on the CPU, NCCL with one GPU each): rank 0 runs "
                        "the rollouts, every rank a share of each minibatch, gradients summed")
    s.add_argument("--shard", choices=("ddp", "fsdp"), default="ddp",
                   help="with --nproc > 1: ddp (a replica per process) or fsdp (FSDP2: policy, critic and optimizer "
                        "states sharded per decoder layer; needs --workers >= 1)")
    _add_memory_args(s)
    s.set_defaults(func=cmd_ppo)

    s = ts.add_parser("plan", parents=[common], help="memory per learner process of a model and settings, and whether it fits a GPU",
                      description="Per-process memory (weights, gradients, AdamW states, activations) of training a model "
                                  "with the given settings, from its configuration on the meta device: nothing is "
                                  "downloaded or allocated.")
    s.add_argument("--model", required=True,
                   help="a known configuration (qwen2.5-vl-3b, qwen2.5-vl-7b, qwen2.5-vl-32b, qwen2.5-vl-72b, "
                        "ui-tars-1.5-7b), a model directory or a config.json")
    s.add_argument("--nproc", type=int, default=1, help="learner processes (FSDP shards weights and states across them)")
    s.add_argument("--shard", choices=("ddp", "fsdp"), default="ddp")
    s.add_argument("--lora", type=int, metavar="R", help="LoRA rank (adapters only are trained)")
    s.add_argument("--bf16", action="store_true", help="bf16 autocast (with --lora: a bf16 frozen base)")
    s.add_argument("--grad-checkpointing", action="store_true")
    s.add_argument("--seq", type=int, default=4096, help="tokens of one sample (default 4096)")
    s.add_argument("--image-tokens", type=int, default=1024,
                   help="of which image tokens (default 1024: about one 1920x1080 screenshot at UI-TARS's size)")
    s.add_argument("--target-tokens", type=int, default=256, help="of which target (assistant) tokens (default 256)")
    s.add_argument("--gpu", default="h100", help="GPU to check the fit against: a name (h100, h200, a100-40, a100-80, "
                                                 "l40s, a10, rtx4090, b200) or its memory in GiB (default h100)")
    s.add_argument("--ppo", action="store_true",
                   help="plan `train ppo`'s learner: policy and critic (vision towers frozen), trained together")
    s.add_argument("--kl", action="store_true", help="with --ppo: also the frozen reference policy (--kl-coef > 0)")
    s.add_argument("--json", action="store_true", help="print the plan as JSON")
    s.set_defaults(func=cmd_plan)

    s = ts.add_parser("default", parents=[common], help="build the small default model: tiny VLM, SFT on expert demos, PPO")
    s.add_argument("--out", default="assets/default_model")
    s.add_argument("--work", help="folder for intermediate checkpoints, metrics and plots (default: OUT-work)")
    s.add_argument("--families", help="comma-separated sandbox families")
    s.add_argument("--demos", type=int, help="expert episodes per family")
    s.add_argument("--grounding", type=int, metavar="N",
                   help="screens per family of single-step 'click on X' samples added to SFT (UI-TARS grounding data)")
    s.add_argument("--demo-slip", type=float, metavar="P",
                   help="chance at each demonstration turn (at most once per episode) that it is a mistake - a "
                        "random click or a cut-off reply - the expert then recovers from (not trained on)")
    s.add_argument("--eval-seeds", type=int, help="held-out seeds per family")
    s.add_argument("--updates", type=int, help="PPO updates")
    s.add_argument("--workers", type=int, help="rollout worker processes")
    s.add_argument("--engine", choices=("local", "ray"), help="PPO's rollout workers: local processes or Ray actors")
    s.add_argument("--ray-address", help="with --engine ray: the cluster to join (default: a local Ray)")
    s.add_argument("--envs", type=int, help="sandbox environments per rollout worker (one batched generation per round)")
    s.add_argument("--sft-epochs", type=float, help="SFT epochs over the demonstrations")
    s.add_argument("--sft-lr", type=float, help="SFT learning rate (default 2e-3)")
    _add_sft_schedule_args(s, recipe=True)
    s.add_argument("--ppo-minutes", type=float, help="wall-clock budget of the PPO phase (stops after that update)")
    s.add_argument("--ppo-lr", type=float, help="PPO learning rate")
    s.add_argument("--ppo-batch", type=int, help="episodes per PPO update")
    s.add_argument("--ppo-epochs", type=int, help="PPO passes over each batch")
    s.add_argument("--temperature", type=float, help="sampling temperature of the PPO rollouts")
    s.add_argument("--policy-alpha", type=float, help="alpha of the length-adaptive policy lambda 1 - 1/(alpha*l)")
    s.add_argument("--observation", choices=("elements", "pixels"),
                   help="what the model sees: elements (default: the screenshot and the screen's element list, clicks "
                        "chosen by a pointer over its entries) or pixels (the screenshot alone, clicks written as digits)")
    s.add_argument("--width", type=int, help="sandbox screen width (default 336: pixel-exact for the model)")
    s.add_argument("--height", type=int, help="sandbox screen height (default 252)")
    s.add_argument("--arch", help="the model class: qwen2_5_vl (default) or qwen3_vl (learned absolute vision positions)")
    s.add_argument("--hidden", type=int, help="width of the model's language and vision layers (a multiple of 32)")
    s.add_argument("--layers", type=int, help="language model layers")
    s.add_argument("--vision-depth", type=int, help="vision tower layers")
    s.add_argument("--rope-theta", type=float, help="rotary base of the language model (default 10000)")
    s.add_argument("--mrope", help="rotary frequencies per image axis: interleaved (default) or blocks "
                                   "(Qwen2.5-VL's stock split, which vLLM and SGLang serve)")
    _add_ppo_shaping_args(s, recipe=True)
    s.add_argument("--resume", action="store_true", help="reuse a finished SFT stage (checkpoint + eval) in the work folder")
    s.add_argument("--seed", type=int, default=0)
    _add_device_arg(s)
    s.set_defaults(func=cmd_default)


def _add_scale_args(s) -> None:
    """The flags of README "Scaling out": learner processes and memory for real-sized models."""
    s.add_argument("--nproc", type=int, default=1,
                   help="learner processes (torch.distributed: gloo on the CPU, NCCL with one GPU each); the global "
                        "batch and the result do not depend on it")
    s.add_argument("--shard", choices=("ddp", "fsdp"), default="ddp",
                   help="with --nproc > 1: ddp (a replica per process) or fsdp (FSDP2: weights, gradients and "
                        "optimizer states sharded across processes)")
    _add_memory_args(s)


def _add_memory_args(s) -> None:
    """bf16, gradient checkpointing and LoRA: `train sft|ct` and `train ppo` share them."""
    s.add_argument("--bf16", action="store_true",
                   help="bf16 autocast (float32 master weights and AdamW states); with --lora the frozen base is bf16")
    s.add_argument("--grad-checkpointing", action="store_true",
                   help="recompute each decoder layer in backward instead of keeping its activations")
    s.add_argument("--lora", type=int, metavar="R", help="train rank-R LoRA adapters (peft) instead of every weight")
    s.add_argument("--lora-alpha", type=float, help="LoRA alpha (default 2R)")
    s.add_argument("--lora-save", choices=("adapter", "merged"), default="adapter",
                   help="a LoRA run saves its adapter (default) or the weights with it merged in")


def _add_device_arg(s) -> None:
    from trainer.sft import DEVICES_HELP

    s.add_argument("--device", default="auto",
                   help=f"where the learner trains and evaluates: {DEVICES_HELP}; rollout workers stay on the CPU")


def _add_sft_schedule_args(s, *, recipe: bool) -> None:
    """The learning-rate schedule and clipping flags of SFT, for `train sft|ct` and (prefixed
    --sft-, no defaults so the recipe's values stand) `train default`."""
    pre = "--sft-" if recipe else "--"
    s.add_argument(f"{pre}schedule", choices=("linear", "constant"), default=None if recipe else "linear",
                   help="linear: decay the rate to a tenth by the last step; constant: hold it after warmup")
    s.add_argument(f"{pre}clip", type=float, default=None if recipe else 1.0,
                   help="max gradient norm of a step (0: no clipping)")


def _add_ppo_shaping_args(s, *, recipe: bool) -> None:
    """PPO's stability and reward-shaping flags, one definition for `train ppo` and `train
    default` (where a flag left out keeps the recipe's value, hence no defaults there)."""
    def default(value):
        return None if recipe else value

    s.add_argument("--train-vision", action="store_true", default=default(False),
                   help="train the vision tower too (default: frozen, each screenshot encoded once per batch)")
    s.add_argument("--format-penalty", type=float, default=default(0.5),
                   help="reward subtracted for a turn whose output does not parse (must outweigh a retry's chance)")
    s.add_argument("--target-kl", type=float, help="stop an update's policy passes once a minibatch's approx_kl exceeds this")
    s.add_argument("--dual-clip", type=float, metavar="C",
                   help="dual-clip PPO: bound a negative-advantage token's loss at -A*C (C > 1, e.g. 3; default off)")
    s.add_argument("--end-on-parse-error", action="store_true", default=default(False),
                   help="a rollout ends at an output that does not parse (default: the agent is asked again)")
    s.add_argument("--progress-reward", type=float, default=default(0.0),
                   help="weight of shaping by the verifier's partial progress (each subgoal met earns its share)")
    s.add_argument("--click-reward", type=float, default=default(0.0),
                   help="weight of a dense grounding reward: each click earns exp(-d^2/2s^2) for its distance d to "
                        "where the task's expert would click (s = 0.05 of the screen)")
    s.add_argument("--kl-coef", type=float, default=default(0.0),
                   help="weight of a per-token KL penalty (k3) to the policy PPO started from (0: none, no copy kept)")
    s.add_argument("--no-effect-penalty", type=float, default=default(0.0),
                   help="reward subtracted for a turn whose action left the screen exactly as it was (a click on "
                        "nothing, a re-click of what is selected)")


def _plot(log, out_dir, phase, keys):
    from trainer.metrics import plot_metrics

    try:
        return str(plot_metrics(log.path, out_dir / f"{phase}_curves.png", phase=phase, keys=keys, title=phase))
    except ValueError:
        return None


def cmd_sft(args) -> int:
    from trainer.distributed import DistributedError, check_nproc
    from trainer.lora import LoRAError, check_lora

    try:
        check_nproc(args.nproc, args.device)
        check_lora(args.lora, args.lora_alpha, args.lora_save)
    except (DistributedError, LoRAError) as e:
        return _fail(str(e))
    res = _run_job(sft_job, args)
    if "error" in res:
        return _fail(res["error"])
    print(json.dumps(res, indent=2))
    return 0


def _run_job(fn, args, *extra) -> dict:
    """fn(rank, world, job, result_path, *extra) in args.nproc learner processes
    (trainer.distributed.launch); what rank 0 wrote to result_path: the result or {"error": ...}."""
    import tempfile
    from pathlib import Path

    from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

    from trainer.distributed import launch, rank_world_of_launcher

    job = {k: v for k, v in vars(args).items() if k != "func"}
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        try:
            launch(fn, args.nproc, job, str(result), *extra)
        except (ProcessRaisedException, ProcessExitedException) as e:  # a rank failed; spawn ended the others
            if not result.is_file():
                return {"error": f"a learner process failed: {str(e).strip().splitlines()[-1]}"}
        if rank_world_of_launcher()[0] > 0:  # a torchrun rank other than 0: rank 0 reports
            raise SystemExit(0)
        return json.loads(result.read_text(encoding="utf-8"))


def cmd_plan(args) -> int:
    from trainer.memory_plan import PlanError, format_plan, plan_memory, plan_ppo

    if args.kl and not args.ppo:
        return _fail("--kl is for --ppo (the reference policy of PPO's KL penalty)")
    kw = {"kl": args.kl} if args.ppo else {}
    try:
        plan = (plan_ppo if args.ppo else plan_memory)(
            args.model, nproc=args.nproc, shard=args.shard, bf16=args.bf16, lora=args.lora,
            grad_checkpointing=args.grad_checkpointing, seq_len=args.seq, image_tokens=args.image_tokens,
            target_tokens=args.target_tokens, gpu=args.gpu, **kw)
    except PlanError as e:
        return _fail(str(e))
    print(json.dumps(plan.to_dict(), indent=2) if args.json else format_plan(plan))
    return 0


def sft_job(rank: int, world: int, job: dict, result_path: str) -> None:
    """One learner process of `train sft|ct` (all of them when --nproc is 1): load, train its
    share, and (rank 0) log, save and write the result (or {"error": ...}) to result_path."""
    import argparse
    from pathlib import Path

    from agent.vlm import VLMError
    from trainer.distributed import rank_device
    from trainer.metrics import MetricsLog
    from trainer.sft import SFTConfig, SFTError, jsonl_samples, load_for_training, store_samples, train_sft

    args = argparse.Namespace(**job)
    try:
        model, processor = load_for_training(args.model, rank_device(args.device, rank, world))
        if args.jsonl:
            samples = jsonl_samples(args.jsonl)
        else:
            with open_store(args) as store:
                samples = store_samples(store, route=args.route, fmt=args.format)
        if not samples:
            raise SFTError(f"no training samples: no episodes routed {args.route!r} in the store" if not args.jsonl
                           else f"{args.jsonl} holds no samples")
        out = Path(args.out)
        log = MetricsLog(out.parent / (out.name + "-logs")) if rank == 0 else None
        cfg = SFTConfig(lr=args.lr, epochs=args.epochs, batch_size=args.batch, max_steps=args.max_steps,
                        schedule=args.schedule, grad_clip=args.clip, seed=args.seed, bf16=args.bf16,
                        grad_checkpointing=args.grad_checkpointing, lora_r=args.lora, lora_alpha=args.lora_alpha,
                        lora_save=args.lora_save, shard=args.shard)
        res = train_sft(model, processor, samples, cfg, out, log=log, phase=args.phase)
        if log is not None:
            log.close()
            res["plot"] = _plot(log, log.dir, args.phase, ["loss", "grad_norm", "lr"])
    except (VLMError, SFTError, OSError) as e:
        res = {"error": str(e)}
    if rank == 0:
        Path(result_path).write_text(json.dumps(res, default=str), encoding="utf-8")


def cmd_ppo(args) -> int:
    from trainer.distributed import DistributedError, check_nproc
    from trainer.ppo import shaping_checks
    from trainer.sandbox.families import parse_families
    from trainer.sandbox.screen import SandboxError

    try:
        families = parse_families(args.families)
    except SandboxError as e:
        return _fail(str(e))
    if args.temperature <= 0 or args.max_new_tokens < 1 or args.updates < 1:
        return _fail("--temperature must be > 0, --max-new-tokens and --updates at least 1")
    if args.envs < 1:
        return _fail(f"--envs must be at least 1, got {args.envs}")
    for ok, msg, value in shaping_checks(format_penalty=args.format_penalty, click_reward=args.click_reward,
                                         kl_coef=args.kl_coef, no_effect_penalty=args.no_effect_penalty,
                                         target_kl=args.target_kl, dual_clip=args.dual_clip):
        if not ok:
            return _fail(f"{msg}, got {value}")
    from trainer.lora import LoRAError, check_lora

    try:
        check_nproc(args.nproc, args.device)
        check_lora(args.lora, args.lora_alpha, args.lora_save)
    except (DistributedError, LoRAError) as e:
        return _fail(str(e))
    from pathlib import Path

    if args.lora and not Path(args.model).is_dir():
        return _fail(f"--lora needs --model to be a model directory (the adapter names its base), got {args.model!r}")
    if args.shard == "fsdp" and args.nproc > 1:
        from trainer.ppo import PPOConfig, check_fsdp

        try:
            check_fsdp(PPOConfig(lora_r=args.lora, n_workers=args.workers, train_vision=args.train_vision))
        except ValueError as e:
            return _fail(str(e))
    if args.engine == "ray":
        if args.workers < 1:
            return _fail(f"--engine ray needs --workers of at least 1 (Ray actors), got {args.workers}")
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            return _fail("--engine ray needs Ray: pip install 'ray==2.60.0' (the [scale] extra)")
    elif args.ray_address or args.inference != "own":
        return _fail(f"{'--ray-address' if args.ray_address else '--inference shared'} is for --engine ray")
    if args.inference_gpus < 0 or (args.inference_gpus and args.inference != "shared"):
        return _fail(f"--inference-gpus must be >= 0 and is for --inference shared, got {args.inference_gpus}")
    res = _run_job(ppo_job, args, families)
    if "error" in res:
        return _fail(res["error"])
    print(json.dumps(res, indent=2, default=str))
    return 0


def ppo_job(rank: int, world: int, job: dict, result_path: str, families) -> None:
    """One learner process of `train ppo` (the only one with --nproc 1); rank 0 runs the
    rollouts, logs, saves and writes the summary (or {"error": ...}) to result_path."""
    import argparse
    from pathlib import Path

    from agent.vlm import VLMError
    from trainer.distributed import rank_device
    from trainer.metrics import MetricsLog
    from trainer.ppo import PPOConfig, train_ppo
    from trainer.rollout import RolloutError
    from trainer.sft import load_for_training, save_checkpoint

    args = argparse.Namespace(**job)
    try:
        model, processor = load_for_training(args.model, rank_device(args.device, rank, world))
    except VLMError as e:
        if rank == 0:
            Path(result_path).write_text(json.dumps({"error": str(e)}), encoding="utf-8")
        return
    out = Path(args.out)
    work = out.parent / (out.name + "-logs")
    log = MetricsLog(work) if rank == 0 else None
    cfg = PPOConfig(updates=args.updates, batch_episodes=args.batch, n_workers=args.workers, n_envs=args.envs, mode=args.mode,
                    max_staleness=args.max_staleness, staleness_decay=args.staleness_decay,
                    value_pretrain_iters=args.value_pretrain, lr=args.lr, epochs=args.epochs,
                    temperature=args.temperature, max_new_tokens=args.max_new_tokens, policy_alpha=args.policy_alpha,
                    seed=args.seed, max_seconds=args.minutes * 60 if args.minutes else None,
                    train_vision=args.train_vision, format_penalty=args.format_penalty,
                    target_kl=args.target_kl, dual_clip=args.dual_clip, progress_reward=args.progress_reward,
                    click_reward=args.click_reward,
                    kl_coef=args.kl_coef, end_on_parse_error=args.end_on_parse_error,
                    no_effect_penalty=args.no_effect_penalty, engine=args.engine, ray_address=args.ray_address,
                    inference=args.inference, inference_gpus=args.inference_gpus, bf16=args.bf16, grad_checkpointing=args.grad_checkpointing, lora_r=args.lora,
                    lora_alpha=args.lora_alpha, shard=args.shard)
    from trainer.sandbox.env import observation_for
    from trainer.specs import EnvSpec

    env_kw = {"width": args.width, "height": args.height, "observation": observation_for(args.model)}
    if args.max_steps:
        env_kw["max_steps"] = args.max_steps
    try:
        res = train_ppo(model, processor, cfg, model_dir=args.model, work_dir=work, env=EnvSpec(**env_kw), families=families,
                        log=log)
    except RolloutError as e:  # the rollout side (rank 0): a worker died, Ray could not start or be reached
        Path(result_path).write_text(json.dumps({"error": str(e)}), encoding="utf-8")
        if world > 1:
            raise  # torch.multiprocessing.spawn then ends the ranks waiting for the next batch
        return
    from trainer.distributed import full_state_dict

    state, critic_state = full_state_dict(model, args.shard), full_state_dict(res["critic"], args.shard)  # FSDP2: every rank
    if rank > 0:
        return
    log.close()
    extra = {"ppo": res["config"], "last": res["history"][-1] if res["history"] else None, "processes": world}
    if res["peft"] is not None:
        from trainer.lora import save_lora

        # a gathered state is the adapted model's own; peft's keys carry its wrapper's prefix
        whole = None if state is None else {f"base_model.model.{k}": v for k, v in state.items()}
        save_lora(res["peft"], processor, out, args.model, args.lora_save, extra, state_dict=whole)
    else:
        save_checkpoint(model, processor, out, extra, state_dict=state)
    res["critic"].save(work / "critic", critic_state)
    plot = _plot(log, work, "ppo", ["reward", "success_rate", "entropy", "approx_kl", "clipfrac", "clipfrac_dual",
                                     "explained_variance",
                                     "value_loss", "think_length", "episode_length", "click_score",
                                     "no_effect_rate"])
    summary = {"out": str(out), "updates": res["updates"], "processes": world,
               "last": res["history"][-1] if res["history"] else None, "plot": plot}
    Path(result_path).write_text(json.dumps(summary, default=str), encoding="utf-8")


def recipe_config(args):
    """The RecipeConfig that `train default`'s flags ask for."""
    from trainer.recipe import RecipeConfig

    cfg = RecipeConfig(seed=args.seed)
    if args.families:
        cfg.families = [f.strip() for f in args.families.split(",")]
    for arg, attr in (("demos", "demo_episodes_per_family"), ("demo_slip", "demo_slip"),
                      ("grounding", "grounding_screens_per_family"), ("eval_seeds", "eval_seeds_per_family"),
                      ("updates", "ppo_updates"), ("workers", "n_workers"), ("envs", "n_envs"), ("sft_epochs", "sft_epochs"),
                      ("sft_lr", "sft_lr"), ("sft_schedule", "sft_schedule"),
                      ("sft_clip", "sft_grad_clip"), ("ppo_minutes", "ppo_max_minutes"), ("ppo_lr", "ppo_lr"), ("ppo_batch", "ppo_batch"),
                      ("ppo_epochs", "ppo_epochs"), ("temperature", "ppo_temperature"),
                      ("policy_alpha", "ppo_policy_alpha"), ("train_vision", "ppo_train_vision"),
                      ("format_penalty", "ppo_format_penalty"), ("target_kl", "ppo_target_kl"), ("dual_clip", "ppo_dual_clip"),
                      ("progress_reward", "ppo_progress_reward"), ("end_on_parse_error", "ppo_end_on_parse_error"),
                      ("click_reward", "ppo_click_reward"), ("kl_coef", "ppo_kl_coef"),
                      ("no_effect_penalty", "ppo_no_effect_penalty"),
                      ("observation", "observation"), ("width", "width"), ("height", "height"),
                      ("arch", "arch"), ("hidden", "hidden"), ("layers", "layers"), ("vision_depth", "vision_depth"),
                      ("rope_theta", "rope_theta"), ("mrope", "mrope"), ("engine", "ppo_engine"),
                      ("ray_address", "ray_address")):
        if getattr(args, arg) is not None:
            setattr(cfg, attr, getattr(args, arg))
    return cfg


def cmd_default(args) -> int:
    from trainer.recipe import RecipeError, run_recipe

    cfg = recipe_config(args)
    try:
        cfg.validate()
        report = run_recipe(args.out, cfg, work_dir=args.work, resume=args.resume, device=args.device)
    except RecipeError as e:
        return _fail(str(e))
    print(json.dumps({k: report[k] for k in ("demos", "eval_sft", "eval_ppo", "plots", "seconds") if k in report},
                     indent=2, default=str))
    return 0
