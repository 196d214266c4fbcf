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
from agent.threads import ThreadsError, choose_threads, set_threads
from agent.vlm.model import VLMError
from trainer.config_flags import ConfigError, add_flags, describe, from_args
from trainer.learn.distributed import (
    DistributedError,
    check_nproc,
    full_state_dict,
    launch,
    rank_device,
    rank_world_of_launcher,
)
from trainer.learn.lora import save_lora
from trainer.learn.memory_plan import PlanError, format_plan, plan_memory, plan_ppo
from trainer.learn.metrics import MetricsLog, plot_metrics
from trainer.learn.ppo_config import PPOConfig, check_fsdp
from trainer.learn.sft import (
    DEVICES_HELP,
    ScaleConfig,
    SFTConfig,
    SFTError,
    jsonl_samples,
    load_for_training,
    save_checkpoint,
    store_samples,
    train_sft,
)
from trainer.recipe.default_model import RecipeConfig, RecipeError, run_recipe
from trainer.rollout.pool import RolloutError
from trainer.rollout.specs import EnvSpec, GameEnvSpec
from trainer.sandbox.env import observation_for
from trainer.sandbox.families import family_class, is_hybrid, parse_families
from trainer.sandbox.games import registry as game_registry
from trainer.sandbox.screen import SandboxError


def register(sub, common) -> None:
    # the settings' flags come from their configs' fields (trainer.config_flags): declared once, there

    p = sub.add_parser("train", help="train a policy: sft, ct, ppo, or the default model's whole recipe",
                       description="Training (SFT, CT, PPO) of Qwen2.5-VL-class policies; see trainer/.")
    ts = p.add_subparsers(dest="train_command", metavar="KIND", required=True)
    for kind, help_, base in (
            ("sft", "supervised fine-tuning on the high-quality pool (route 'sft')", SFTConfig(epochs=3.0)),
            ("ct", "continual pre-training on the lower-quality pool (route 'ct'): same loss, other data",
             SFTConfig(epochs=1.0, lr=5e-4))):
        s = ts.add_parser(kind, parents=[common], help=help_)
        s.add_argument("--model", required=True, help="checkpoint directory to start from")
        s.add_argument("--out", required=True, help="output checkpoint directory (metrics and curves go beside it)")
        s.add_argument("--jsonl", help="train on an `export` JSONL file instead of the store")
        s.add_argument("--route", default=kind, help=f"store route to read (default {kind})")
        s.add_argument("--format", choices=("runtime", "export"), default="runtime",
                       help="prompt layout for store episodes: the agent's own (default) or agent.storage.export's")
        add_flags(s, SFTConfig, base=base)
        _add_launch_args(s)
        s.set_defaults(func=cmd_sft, phase=kind)

    s = ts.add_parser("ppo", parents=[common], help="multi-turn PPO on the sandbox or the games (critic, value pretraining)",
                      description="Multi-turn PPO. --suite games plays the browser games (headless Chromium, one per "
                                  "environment): a step's reward is the score it gained divided by the game's reference "
                                  "mean (norms.json), so a reference player's episode earns 1 and games with big raw "
                                  "scores do not dominate; the step budget (100, or --max-steps) truncates an episode; "
                                  "an unparsable reply costs --format-penalty as on the sandbox.")
    s.add_argument("--model", required=True)
    s.add_argument("--out", required=True)
    add_flags(s, PPOConfig)
    s.add_argument("--suite", choices=("sandbox", "games"), default="sandbox",
                   help="the sandbox's GUI tasks (default) or the browser games, rewarded by normalized score gained")
    s.add_argument("--max-steps", type=int, help="cap on an episode's steps (default: each family's own limit; a "
                                                  "game's step budget, 100)")
    s.add_argument("--families", help="comma-separated sandbox families (default: all the GUI-only ones; 'hybrid': "
                                      "every hybrid GUI+tools family)")
    s.add_argument("--tools", choices=("on", "off"), default=None,
                   help="the terminal and file tools (run_command, read_file, write_file) over a workspace folder per "
                        "episode, beside the GUI; default: on when a hybrid family is asked for, else off")
    s.add_argument("--games", help="--suite games: comma-separated games (default: every game there is)")
    s.add_argument("--width", type=int, help="sandbox screen width (default 320; a game's screen is its canvas)")
    s.add_argument("--height", type=int, help="sandbox screen height (default 240)")
    _add_launch_args(s)
    s.set_defaults(func=cmd_ppo)

    s = ts.add_parser("plan", parents=[common], help="memory per learner process of a model and settings, and whether it fits a GPU",
                      description="Per-process memory (weights, gradients, AdamW states, activations) of training a model "
                                  "with the given settings, from its configuration on the meta device: nothing is "
                                  "downloaded or allocated.")
    s.add_argument("--model", required=True,
                   help="a known configuration (qwen2.5-vl-3b, qwen2.5-vl-7b, qwen2.5-vl-32b, qwen2.5-vl-72b, "
                        "ui-tars-1.5-7b), a model directory or a config.json")
    _add_nproc_arg(s)
    add_flags(s, ScaleConfig, exclude=("lora_alpha", "lora_save"))
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
    add_flags(s, RecipeConfig)
    s.add_argument("--resume", action="store_true", help="reuse a finished SFT stage (checkpoint + eval) in the work folder")
    _add_device_arg(s)
    s.set_defaults(func=cmd_default)


def _add_nproc_arg(s) -> None:
    s.add_argument("--nproc", type=int, default=1,
                   help="learner processes (torch.distributed: gloo on the CPU, NCCL with one GPU each); the global "
                        "batch and the result do not depend on it (`train ppo`: rank 0 runs the rollouts)")


def _add_launch_args(s) -> None:
    """Where the learner runs: --device, --nproc and --threads (the memory flags are ScaleConfig's fields)."""
    _add_nproc_arg(s)
    _add_device_arg(s)
    s.add_argument("--threads", type=int, default=None,
                   help="torch threads of each learner process (default: the cores other work leaves free, "
                        "divided among the processes; TANDEM_THREADS sets it too)")


def _pick_threads(args, beside: int = 0) -> str | None:
    """Decide the learner processes' torch threads (agent.threads), say so on stderr and keep the
    count in args.threads for each rank to set; `beside`: rollout worker processes training in
    parallel with the learner, which take their share of the free cores. The error, or None."""
    import os
    import sys

    # under torchrun each rank is a `main.py train` of its own: its machine's ranks share the cores
    per_machine = int(os.environ.get("LOCAL_WORLD_SIZE", args.nproc))
    try:
        choice = choose_threads(args.threads, workers=per_machine + beside)
    except ThreadsError as e:
        return str(e)
    print(choice.line(), file=sys.stderr)
    args.threads = choice.threads
    return None


def _add_device_arg(s) -> None:
    s.add_argument("--device", default="auto",
                   help=f"where the learner trains and evaluates: {DEVICES_HELP}; rollout workers stay on the CPU")




def _plot(log, out_dir, phase, keys):
    try:
        return str(plot_metrics(log.path, out_dir / f"{phase}_curves.png", phase=phase, keys=keys, title=phase))
    except ValueError:
        return None


def _config(cls, args):
    """(the config the flags ask for, None) or (None, the error naming the flag)."""
    try:
        return from_args(cls, args), None
    except ConfigError as e:
        return None, describe(e, cls)


def _learner_config(cls, args):
    """_config, and the learner processes it asks for checked against the device (--nproc)."""
    cfg, error = _config(cls, args)
    if error:
        return None, error
    try:
        check_nproc(args.nproc, args.device)
    except DistributedError as e:
        return None, str(e)
    return cfg, None


def cmd_sft(args) -> int:
    cfg, error = _learner_config(SFTConfig, args)
    if error:
        return _fail(error)
    error = _pick_threads(args)
    if error:
        return _fail(error)
    res = _run_job(sft_job, args, cfg)
    if "error" in res:
        return _fail(res["error"])
    print(json.dumps(res, indent=2))
    return 0


def _run_job(fn, args, *extra) -> dict:
    """fn(rank, world, job, result_path, *extra) in args.nproc learner processes
    (trainer.learn.distributed.launch); what rank 0 wrote to result_path: the result or {"error": ...}."""
    import tempfile
    from pathlib import Path

    from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

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
    if args.kl and not args.ppo:
        return _fail("--kl is for --ppo (the reference policy of PPO's KL penalty)")
    kw = {"kl": args.kl} if args.ppo else {}
    try:
        plan = (plan_ppo if args.ppo else plan_memory)(
            args.model, nproc=args.nproc, shard=args.shard, bf16=args.bf16, lora=args.lora_r,
            grad_checkpointing=args.grad_checkpointing, seq_len=args.seq, image_tokens=args.image_tokens,
            target_tokens=args.target_tokens, gpu=args.gpu, **kw)
    except PlanError as e:
        return _fail(str(e))
    print(json.dumps(plan.to_dict(), indent=2) if args.json else format_plan(plan))
    return 0


def sft_job(rank: int, world: int, job: dict, result_path: str, cfg) -> None:
    """One learner process of `train sft|ct` (all of them when --nproc is 1): load, train its
    share, and (rank 0) log, save and write the result (or {"error": ...}) to result_path."""
    import argparse
    from pathlib import Path

    args = argparse.Namespace(**job)
    try:
        set_threads(args.threads)  # as cmd_sft decided
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
        res = train_sft(model, processor, samples, cfg, out, log=log, phase=args.phase)
        if log is not None:
            log.close()
            res["plot"] = _plot(log, log.dir, args.phase, ["loss", "grad_norm", "lr"])
    except (VLMError, SFTError, OSError) as e:
        res = {"error": str(e)}
    if rank == 0:
        Path(result_path).write_text(json.dumps(res, default=str), encoding="utf-8")


def cmd_ppo(args) -> int:
    try:
        families = ppo_families(args)
    except (SandboxError, ValueError) as e:
        return _fail(str(e))
    args.tools = ppo_tools(args.tools, families)
    blocked = [f for f in families or [] if not args.tools and is_hybrid(f) and not family_class(f).gui_route]
    if blocked:
        return _fail(f"--tools off: {', '.join(blocked)} cannot be played without the tools (drop them or use --tools on)")
    cfg, error = _learner_config(PPOConfig, args)
    if error:
        return _fail(error)
    if args.suite == "games":
        unused = [flag for flag, value in (("--progress-reward", cfg.progress_reward), ("--click-reward", cfg.click_reward),
                                           ("--no-effect-penalty", cfg.no_effect_penalty)) if value]
        if unused:  # said, not silently ignored
            return _fail(f"{', '.join(unused)} {'is' if len(unused) == 1 else 'are'} the sandbox's shaping: a game's "
                         "reward is already its score gained step by step, and a game has no expert click or "
                         "screen-change signal")
    from pathlib import Path

    if cfg.lora_r and not Path(args.model).is_dir():
        return _fail(f"--lora needs --model to be a model directory (the adapter names its base), got {args.model!r}")
    if cfg.shard == "fsdp" and args.nproc > 1:
        try:
            check_fsdp(cfg)
        except ValueError as e:
            return _fail(str(e))
    if cfg.engine == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            return _fail("--engine ray needs Ray: pip install 'ray==2.60.0' (the [scale] extra)")
    # async rollout workers on this machine play while the learner trains: they share the free cores
    error = _pick_threads(args, beside=cfg.n_workers if cfg.mode == "async" and not cfg.ray_address else 0)
    if error:
        return _fail(error)
    res = _run_job(ppo_job, args, families, cfg)
    if "error" in res:
        return _fail(res["error"])
    print(json.dumps(res, indent=2, default=str))
    return 0


def ppo_families(args) -> list[str] | None:
    """The families `train ppo` plays: --families of the sandbox, or with --suite games each game of
    --games as "games/<name>" (every game there is by default). ValueError names a wrong flag."""
    if getattr(args, "suite", "sandbox") != "games":
        if args.games:
            raise ValueError("--games is for --suite games")
        return parse_families(args.families)
    wrong = [flag for flag, given in (("--families", args.families), ("--width", args.width),
                                      ("--height", args.height), ("--tools", args.tools)) if given]
    if wrong:
        raise ValueError(f"{', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} not for --suite games: it takes "
                         "--games, and a game's screen is its canvas (336x252)")
    return [game_registry.PREFIX + g for g in game_registry.parse_games(args.games)]


def ppo_env(args, families) -> EnvSpec:
    """The env spec of `train ppo`'s rollouts: the sandbox's, or (--suite games) GameEnvSpec."""
    kw = {"observation": observation_for(args.model)}
    if args.max_steps:
        kw["max_steps"] = args.max_steps
    if getattr(args, "suite", "sandbox") == "games":
        return GameEnvSpec(games=tuple(f[len(game_registry.PREFIX):] for f in families), **kw)
    return EnvSpec(width=args.width or 320, height=args.height or 240, tools=bool(args.tools), **kw)


def ppo_tools(flag: str | None, families: list[str] | None) -> bool:
    """`train ppo --tools`: as given, else on exactly when a hybrid family is asked for (as `sandbox eval`)."""
    if flag is None:
        return bool(families) and any(is_hybrid(f) for f in families)
    return flag == "on"


def ppo_job(rank: int, world: int, job: dict, result_path: str, families, cfg) -> None:
    """One learner process of `train ppo` (the only one with --nproc 1); rank 0 runs the
    rollouts, logs, saves and writes the summary (or {"error": ...}) to result_path."""
    import argparse
    from pathlib import Path

    from trainer.learn.ppo import train_ppo  # lazy: torch: this module stays light

    args = argparse.Namespace(**job)
    set_threads(args.threads)  # as cmd_ppo decided
    try:
        model, processor = load_for_training(args.model, rank_device(args.device, rank, world))
    except VLMError as e:
        if rank == 0:
            Path(result_path).write_text(json.dumps({"error": str(e)}), encoding="utf-8")
        return
    out = Path(args.out)
    work = out.parent / (out.name + "-logs")
    log = MetricsLog(work) if rank == 0 else None

    try:
        res = train_ppo(model, processor, cfg, model_dir=args.model, work_dir=work, env=ppo_env(args, families),
                        families=families, log=log)
    except RolloutError as e:  # the rollout side (rank 0): a worker died, Ray could not start or be reached
        Path(result_path).write_text(json.dumps({"error": str(e)}), encoding="utf-8")
        if world > 1:
            raise  # torch.multiprocessing.spawn then ends the ranks waiting for the next batch
        return

    state, critic_state = full_state_dict(model, cfg.shard), full_state_dict(res["critic"], cfg.shard)  # FSDP2: every rank
    if rank > 0:
        return
    log.close()
    extra = {"ppo": res["config"], "last": res["history"][-1] if res["history"] else None, "processes": world}
    if res["peft"] is not None:
        # a gathered state is the adapted model's own; peft's keys carry its wrapper's prefix
        whole = None if state is None else {f"base_model.model.{k}": v for k, v in state.items()}
        save_lora(res["peft"], processor, out, args.model, cfg.lora_save, extra, state_dict=whole)
    else:
        save_checkpoint(model, processor, out, extra, state_dict=state)
    res["critic"].save(work / "critic", critic_state)
    if getattr(args, "suite", "sandbox") == "games":  # no success, expert clicks or screen-change signal in a game
        keys = ["reward", "entropy", "think_tokens", "think_length", "approx_kl", "clipfrac", "explained_variance",
                "value_loss", "episode_length", "parse_error_rate"]
    else:
        keys = ["reward", "success_rate", "entropy", "approx_kl", "clipfrac", "clipfrac_dual", "explained_variance",
                "value_loss", "think_length", "think_tokens", "episode_length", "click_score", "no_effect_rate"]
    plot = _plot(log, work, "ppo", keys)
    summary = {"out": str(out), "updates": res["updates"], "processes": world,
               "last": res["history"][-1] if res["history"] else None, "plot": plot}
    Path(result_path).write_text(json.dumps(summary, default=str), encoding="utf-8")


def recipe_config(args):
    """The RecipeConfig that `train default`'s flags ask for (config_flags.ConfigError names a bad one)."""
    return from_args(RecipeConfig, args)


def cmd_default(args) -> int:
    cfg, error = _config(RecipeConfig, args)
    if error:
        return _fail(error)
    try:
        report = run_recipe(args.out, cfg, work_dir=args.work, resume=args.resume, device=args.device)
    except RecipeError as e:
        return _fail(str(e))
    print(json.dumps({k: report[k] for k in ("demos", "eval_sft", "eval_ppo", "plots", "seconds") if k in report},
                     indent=2, default=str))
    return 0
