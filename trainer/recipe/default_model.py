"""The default small model, end to end: build a tiny Qwen2.5-VL, SFT on the sandbox expert's
demonstrations, evaluate on held-out seeds, PPO on the sandbox, evaluate again, save. (Over 500
lines: the recipe's stages and its resumable checkpoints read as one script, top to bottom.)

    python main.py train default --out assets/default_model [--work DIR] [--ppo-minutes 14] [--resume]

OUT gets the checkpoint (a standard transformers directory, about 6 MB), eval.json (held-out
success per family after SFT and after PPO) and training_curves.png; the work folder (default
OUT-work) keeps the base and SFT checkpoints, metrics.jsonl, TensorBoard events, more plots and
report.json. --resume reuses a finished SFT stage there (stage_sft.json + sft/), and a finished PPO
stage of the same settings (stage_ppo.json + ppo_model/); a stage scored with another DECODING (how
the actor turns a generation into a reply) gets its held-out numbers again (SFT) or is run again (PPO,
whose rollouts replied that way). With --games (off by default) a games
stage follows PPO (trainer.recipe.games_stage): continued SFT on the browser games' reference
players with the sandbox's demonstrations replayed beside them, the games scored before and after.

The model sees screenshots at exactly agent.coords' smart_resize size (its image processor's
min/max pixels are set so), so the coordinates it writes mean the same thing to the sandbox,
to agent.policies.memory's history and to LocalVLMPolicy, and the checkpoint runs in the agent as is.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import ClassVar

from agent import coords
from agent.threads import choose_threads
from agent.vlm import pointer
from agent.vlm.model import VLMError, load_processor, load_vlm, name_stock_processor, resized_image_size
from trainer.config_flags import (
    ConfigError,
    check,
    check_choices,
    dotted,
    flatten,
    from_dict,
    knob,
    nested,
    tie,
    to_argv,
    validate_nested,
)
from trainer.errors import TrainerError
from trainer.learn.metrics import MetricsLog, plot_metrics, read_metrics
from trainer.learn.ppo_config import PPOConfig
from trainer.learn.sft import (
    Sample,
    ScaleConfig,
    SFTConfig,
    load_for_training,
    save_checkpoint,
    train_device,
    train_sft,
)
from trainer.learn.tiny_model import ARCHS, MROPE_LAYOUTS, build_tiny_model, default_corpus
from trainer.recipe import games_stage
from trainer.rollout.actors import VLMActor
from trainer.rollout.grounding import grounding_eval, grounding_samples
from trainer.rollout.runner import demonstrate, evaluate
from trainer.rollout.specs import EnvSpec
from trainer.sandbox.families import family_class, is_hybrid
from trainer.sandbox.games.browser import GameBrowserError, find_chromium
from trainer.sandbox.games.registry import GAME_MODULES
from trainer.stats import paired_difference, rate


class RecipeError(TrainerError, ValueError):
    """A recipe that cannot run as asked (a bad setting, a work folder from other settings)."""


# how the actor turns a generation into the reply the env runs; a stage saved under another one is
# scored again on --resume: "pointer" (the element-list pointer writes clicks), "+typed_copy" (type
# contents copied from the instruction's quotes, agent.vlm.typed_copy)
DECODING = "pointer+typed_copy"
SCALE = tuple(f.name for f in fields(ScaleConfig))  # the recipe runs one process, float32, every weight trained


@dataclass
class RecipeConfig:
    """The whole recipe's settings: its own (screen, data, model) plus the SFT and PPO stages' configs.
    `train default`'s flags are these fields (trainer.config_flags): the stages' under --sft-/--ppo-,
    PPO's rollout and shaping flags as `train ppo` names them. validate() names a bad one."""
    NAME: ClassVar[str] = "recipe"
    # the sandbox screen: 336x252 is pixel-exact for the model (smart_resize keeps it; 320x240 was resampled
    # x1.05, blurring 11-13 px text), 108 image tokens
    width: int = knob(336, "sandbox screen width (pixel-exact for the model)")
    height: int = knob(252, "sandbox screen height")
    # what the model observes: "elements" the screenshot and the screen's element list, a pointer head
    # choosing the clicked entry (agent.vlm.pointer); "pixels" the screenshot alone, clicks written as digits
    observation: str = knob("elements", "what the model sees: elements (the screenshot and the screen's element list, "
                                        "clicks chosen by a pointer over its entries) or pixels (the screenshot alone, "
                                        "clicks written as digits)", choices=("elements", "pixels"))
    # every sandbox family (trainer.sandbox.families.FAMILIES)
    families: list[str] = knob(help="comma-separated sandbox families", factory=lambda: [
        "click_button", "check_boxes", "radio", "dropdown", "list_pick", "type_text", "slider", "form", "scroll_find",
        "menu", "dialog", "tabs", "context_menu", "drag_drop", "settings_chain", "search_chain"])
    demo_episodes_per_family: int = knob(60, "expert episodes per family", flag="demos")
    # chance per demonstration turn (at most once an episode) of an injected mistake the expert recovers
    # from (ExpertActor). Without them the SFT model had never seen a second turn of most families nor a
    # re-ask: 0.3-0.4 of its rollout turns did not parse; with 0.3-0.4, 0.01-0.08 (measured, 20-seed runs)
    demo_slip: float = knob(0.3, "chance at each demonstration turn (at most once per episode) that it is a mistake - "
                                 "a random click or a cut-off reply - the expert then recovers from (not trained on)",
                            metavar="P")
    grounding_screens_per_family: int = knob(15, "screens per family of single-step 'click on X' samples added to SFT "
                                                 "(UI-TARS grounding data)", flag="grounding", metavar="N")
    eval_seeds_per_family: int = knob(13, "held-out seeds per family", flag="eval-seeds")  # 208 episodes over 16
    # the model class (trainer.learn.tiny_model.ARCHS): "qwen3_vl" is a Qwen3-VL (learned absolute positions in the
    # vision tower); not better so far (bench_position, and one recipe run: 22.5% SFT, 15.8% PPO held-out)
    arch: str = knob("qwen2_5_vl", "the model class (qwen3_vl: learned absolute vision positions)", choices=ARCHS)
    hidden: int = knob(128, "width of the model's language and vision layers (a multiple of 32)")
    layers: int = knob(2, "language model layers")
    vision_depth: int = knob(2, "vision tower layers")
    # the language model's rotary positions (trainer.learn.tiny_model.mrope_section): with Qwen2.5-VL's stock
    # "blocks" at theta 1e6 this model cannot tell image columns apart, so cannot learn where to click
    rope_theta: float = knob(10_000.0, "rotary base of the language model")
    mrope: str = knob("interleaved", "rotary frequencies per image axis: interleaved or blocks (Qwen2.5-VL's stock "
                                     "split, which vLLM and SGLang serve)", choices=MROPE_LAYOUTS)
    sft: SFTConfig = nested(lambda: SFTConfig(lr=2e-3, epochs=5.0, batch_size=8, warmup_steps=5),
                            prefix="sft-", skip=SCALE, tied=("seed",))
    # PPO: lr 5e-4 drove approx_kl to 0.3-0.6 per update and the parse rate down (measured); epochs are passes
    # over each batch, target_kl stops them early. Length-adaptive GAE, policy lambda = 1 - 1/(alpha *
    # generated tokens): the report's 0.05 puts lambda at its 0.9 clamp at this model's lengths (30-130
    # tokens an episode), and in those runs replies grew until cut off; 1.0 (lambda ~0.99) kept them flat
    # (measured; PPOConfig keeps the report's 0.05). Sampling (and scoring) temperature 0.5; evaluation is
    # greedy. The expert's replies take about 30 tokens. 20 updates take about 10 minutes on a quiet 2-core
    # machine; the 45-minute budget only caps a loaded one (both measured). kl_coef 0.05 (k3 to the SFT policy)
    # kept the reply format where PPO alone let it slip (held-out parse rate 91.2% vs 86.5%; success the same).
    ppo: PPOConfig = nested(lambda: PPOConfig(updates=20, batch_episodes=16, lr=1e-4, epochs=4, policy_alpha=1.0,
                                              temperature=0.5, max_new_tokens=48, max_minutes=45.0, target_kl=0.1,
                                              kl_coef=0.05, value_pretrain_iters=1, value_pretrain_epochs=3),
                            prefix="ppo-", skip=SCALE, tied=("seed",),
                            bare=("updates", "n_workers", "n_envs", "engine", "ray_address", "temperature", "policy_alpha",
                                  "train_vision", "format_penalty", "target_kl", "dual_clip", "progress_reward",
                                  "click_reward", "kl_coef", "no_effect_penalty", "end_on_parse_error"))
    ppo_max_steps: int = knob(5, "rollouts are cut (and bootstrapped) at this many steps; evaluation keeps each "
                                 "family's limit")
    # the games stage (trainer.recipe.games_stage): continued SFT from the PPO model on each game's reference
    # player, the sandbox's demonstrations replayed beside them (game_replay per game sample) so its skills stay
    # off by default: at this model's size the stage cost 6.7 points of held-out sandbox success and did not
    # raise the games' score (README, Results: "The games stage")
    games: list[str] | None = knob(None, "browser games the model learns after PPO, from their reference players "
                                         "('all', or comma-separated names; none: no games stage)")
    game_demo_episodes: int = knob(8, "reference episodes per game for the games stage", flag="game-demos")
    game_demo_turns: int = knob(25, "turns kept per game episode (evenly spaced): a game's turns are much alike")
    game_replay: float = knob(1.0, "sandbox demonstration turns replayed per game turn in the games stage")
    game_eval_episodes: int = knob(5, "held-out episodes per game, scored before and after the games stage",
                                   flag="game-eval")
    games_sft: SFTConfig = nested(lambda: SFTConfig(lr=1e-3, epochs=2.0, batch_size=8, warmup_steps=5),
                                  prefix="games-sft-", skip=SCALE, tied=("seed",))
    threads: int = knob(1, "torch threads of the PPO learner beside its rollout workers (they take the other cores)")
    # torch threads of SFT and the held-out evaluations, when nothing else runs (None: the cores other work leaves
    # free, agent.threads). Measured on 2 cores: an SFT step of the default shape 1.06 s with 1 thread, 0.65 s with
    # 2; of 256x4x4 3.5 s, 2.0 s
    sft_threads: int | None = knob(None, "torch threads of SFT and the held-out evaluations (none: the cores other "
                                         "work leaves free)")
    seed: int = knob(0, "random seed (of every stage)")

    # keys of recipe configs saved before the stages nested (eval.json, stage_sft.json), where "<stage>_<field>"
    # does not name the field
    LEGACY: ClassVar[dict] = {"sft_batch": "sft.batch_size", "ppo_batch": "ppo.batch_episodes",
                              "n_workers": "ppo.n_workers", "n_envs": "ppo.n_envs", "ray_address": "ppo.ray_address"}

    def __post_init__(self):
        if self.games == ["all"]:
            self.games = list(GAME_MODULES)
        tie(self)
        self.validate()

    @classmethod
    def from_dict(cls, d: dict) -> RecipeConfig:
        """A saved config (asdict), or one saved before the stages nested (flat ppo_*/sft_* keys)."""
        return from_dict(cls, d, legacy=cls.LEGACY)

    def validate(self) -> None:
        """Raise config_flags.ConfigError naming the first setting that cannot work (before any work
        is done); the stages' configs checked themselves when made."""
        check_choices(self)
        for f in self.families:
            try:
                family_class(f)
            except Exception as e:  # SandboxError names the known families
                raise ConfigError("recipe.families", str(e)) from None
        check(self.hidden >= 32 and self.hidden % 32 == 0, "recipe.hidden", "must be a positive multiple of 32",
              self.hidden)
        for name in ("layers", "vision_depth", "demo_episodes_per_family", "eval_seeds_per_family", "ppo_max_steps",
                     "threads"):
            check(getattr(self, name) >= 1, f"recipe.{name}", "must be at least 1", getattr(self, name))
        check(self.sft_threads is None or self.sft_threads >= 1, "recipe.sft_threads", "must be at least 1",
              self.sft_threads)
        for g in self.games or []:
            if g not in GAME_MODULES:
                raise ConfigError("recipe.games", f"has {g!r}, not a game: the games are {', '.join(GAME_MODULES)}")
        for name in ("game_demo_episodes", "game_demo_turns", "game_eval_episodes"):
            check(getattr(self, name) >= 1, f"recipe.{name}", "must be at least 1", getattr(self, name))
        check(self.game_replay >= 0, "recipe.game_replay", "must be >= 0", self.game_replay)
        check(self.rope_theta > 1, "recipe.rope_theta", "must be > 1", self.rope_theta)
        check(0.0 <= self.demo_slip <= 1.0, "recipe.demo_slip", "must be in [0, 1]", self.demo_slip)
        check(self.grounding_screens_per_family >= 0, "recipe.grounding_screens_per_family", "must be >= 0",
              self.grounding_screens_per_family)
        check(self.width >= 28 and self.height >= 28, "recipe.width", "and height must be at least 28",
              (self.width, self.height))
        validate_nested(self)


# the settings of the games stage (after PPO): changing them reruns that stage alone on --resume
GAMES_STAGE_KEYS = ("games", "game_demo_episodes", "game_demo_turns", "game_replay", "game_eval_episodes", "games_sft")
# the settings that shape the SFT stage (demonstrations, model, SFT, its evaluation): --resume needs them unchanged
SFT_STAGE_KEYS = ("width", "height", "observation", "families", "demo_episodes_per_family", "demo_slip",
                  "grounding_screens_per_family", "eval_seeds_per_family", "arch", "hidden", "layers", "vision_depth",
                  "rope_theta", "mrope", "sft", "seed")


def sft_stage_config(cfg: RecipeConfig | dict) -> dict:
    """The part of `cfg` an SFT stage is recorded with (and compared against on --resume), as
    {dotted field: value}; a dict is a saved config, possibly flat (before the stages nested):
    only the keys it has are given."""
    if isinstance(cfg, dict):
        full, _ = dotted(RecipeConfig, cfg, legacy=RecipeConfig.LEGACY)
    else:
        full = flatten(cfg)
    return {k: v for k, v in full.items() if k.split(".")[0] in SFT_STAGE_KEYS}


def demonstrations(families, per_family: int, *, width: int, height: int, seed_start: int = 0, memory_kw=None,
                   progress: bool = True, slip: float = 0.0, observation: str = "elements", tools: bool = False):
    """Expert trajectories on training seeds (trainer.rollout.runner.demonstrate, the one path of
    demonstrations; `slip`: trainer.rollout.actors.ExpertActor's injected mistakes; `tools`: with the
    terminal and file tools, which a hybrid family needs), and the SFT samples they give (every expert
    turn of the successful ones; a slipped turn is context only)."""
    from tqdm import tqdm

    tickets = [(seed_start + k, families[k % len(families)]) for k in range(per_family * len(families))]
    bar = tqdm(total=len(tickets), desc="expert demos", disable=not progress or None)
    try:
        env_kw = {"width": width, "height": height, "observation": observation, **({"tools": True} if tools else {})}
        trajs = demonstrate(tickets, env_kw=env_kw, slip=slip,
                            seed=seed_start, memory_kw=memory_kw, progress=lambda _t: bar.update(1))
    finally:
        bar.close()
    samples = []
    for tr in trajs:
        if tr.success:  # only demonstrations that reached the goal are worth imitating
            samples += [Sample(t.messages, t.text, f"{tr.family}:{tr.seed}#{i}") for i, t in enumerate(tr.turns)
                        if i not in tr.slipped]
    return trajs, samples


def build_default_model(out_dir, cfg: RecipeConfig, demo_texts: list[str]) -> Path:
    """The tiny model with a tokenizer that also learned the sandbox's words, and an image
    processor that resizes screenshots exactly as agent.coords.smart_resize does."""
    h, w = coords.smart_resize(cfg.height, cfg.width)
    side = int((h * w) ** 0.5) + 1
    out = build_tiny_model(out_dir, default_corpus(cfg.seed) + demo_texts, hidden=cfg.hidden, layers=cfg.layers,
                           vision_depth=cfg.vision_depth, image_size=side, seed=cfg.seed, rope_theta=cfg.rope_theta,
                           mrope=cfg.mrope, arch=cfg.arch)
    proc = load_processor(out)
    ip = proc.image_processor
    ip.size = {"shortest_edge": coords.MIN_PIXELS, "longest_edge": max(side * side, coords.MIN_PIXELS)}
    # the input centred on the sandbox's usual (light) background: flat background patches then embed near
    # zero, instead of one large common direction that every RMSNorm downstream divides the detail away by
    ip.image_mean = [0.94, 0.94, 0.94]
    proc.save_pretrained(str(out))

    name_stock_processor(out)  # the configs stock tools read follow the new size too

    rw, rh = resized_image_size(load_processor(out), cfg.width, cfg.height)
    if (rh, rw) != (h, w):
        raise RuntimeError(f"the processor resizes {cfg.width}x{cfg.height} to {rw}x{rh}, not smart_resize's {w}x{h}")
    if cfg.observation == "elements":  # the pointer head over the element list, in its own file beside the weights
        import torch

        model, _ = load_vlm(out)
        torch.manual_seed(cfg.seed)
        pointer.save_head(pointer.make_head(pointer.hidden_size(model)).state_dict(), out)
    return out


def run_recipe(out_dir, cfg: RecipeConfig, *, work_dir=None, progress: bool = True, resume: bool = False,
               device: str | None = "auto") -> dict:
    """The whole recipe; with resume, a finished SFT stage in the work folder is reused. SFT, PPO's
    learner and the held-out evaluations run on `device` (trainer.learn.sft.load_for_training: "auto"
    takes a GPU when there is one); the rollout workers and the demonstrations stay on the CPU."""
    import torch

    cfg.validate()

    try:  # a device that is not there fails now, not after the demonstrations
        dev = str(train_device(device))
    except VLMError as e:
        raise RecipeError(f"--device: {e}") from None

    if cfg.games:  # the games stage's browser, checked before hours of work, not after
        try:
            find_chromium()
        except GameBrowserError as e:
            raise RecipeError(f"the games stage needs Chromium: {e}; or skip it with --games none") from None

    torch.manual_seed(cfg.seed)
    sft_threads = choose_threads(cfg.sft_threads, flag="--sft-threads").apply()
    print(sft_threads.line("torch threads of SFT and evaluation"), file=sys.stderr)
    out = Path(out_dir)
    work = Path(work_dir) if work_dir else out.parent / (out.name + "-work")
    work.mkdir(parents=True, exist_ok=True)
    log = MetricsLog(work)
    env_kw = {"width": cfg.width, "height": cfg.height, "observation": cfg.observation}
    # the tools are on throughout (demos, PPO, evaluations) when a hybrid family is among the families, so
    # every stage prompts with one action space; grounding scores the GUI families' screens alone
    tools = any(is_hybrid(f) for f in cfg.families)
    play_kw = {**env_kw, **({"tools": True} if tools else {})}
    gui_families = [f for f in cfg.families if not is_hybrid(f)]
    report: dict = {"config": asdict(cfg), "device": dev}
    t0 = time.perf_counter()
    started = time.time()  # the log's wall clock: a resumed run's PPO rows are the ones after this

    def heldout(tag):
        actor = VLMActor(model, processor, max_new_tokens=64)
        from tqdm import tqdm

        bar = tqdm(total=len(cfg.families) * cfg.eval_seeds_per_family, desc=f"eval {tag}", disable=not progress or None)
        res = evaluate(actor, cfg.families, cfg.eval_seeds_per_family, env_kw=play_kw, progress=lambda: bar.update(1))
        bar.close()
        # and the skill under it all: finding a named element (two per held-out screen of a GUI family)
        scores = {}
        if gui_families:
            bar = tqdm(total=len(gui_families) * cfg.eval_seeds_per_family, desc=f"grounding {tag}",
                       disable=not progress or None)
            res["grounding"] = grounding_eval(actor, gui_families, cfg.eval_seeds_per_family, **env_kw,
                                              progress=lambda: bar.update(1))
            bar.close()
            scores = {"grounding": res["grounding"]["mean_accuracy"], "named": res["grounding"]["mean_named"]}
        log.log(0, f"eval_{tag}", mean_success=res["mean_success"], **scores,
                **{f"success_{k}": v["success"] for k, v in res["families"].items()})
        return res

    stage = work / "stage_sft.json"  # the SFT stage's report, written once its checkpoint and eval are done
    if resume and stage.is_file() and (work / "sft" / "model.safetensors").is_file():
        # -- 1+2 done before: the SFT checkpoint and its held-out numbers are in the work folder
        done = json.loads(stage.read_text(encoding="utf-8"))
        # stages written before this check carry no config; older ones a flat one (sft_stage_config reads both)
        was, now = sft_stage_config(done.get("config", {})), sft_stage_config(cfg)
        changed = [k for k in now if k in was and was[k] != now[k]]
        if changed:
            raise RecipeError(f"--resume: the SFT stage in {work} was made with other settings "
                             f"({', '.join(f'{k}={was[k]!r}' for k in changed)}); use another --work folder or drop --resume")
        report.update({k: done[k] for k in ("demos", "params", "sft", "eval_sft")})
        report["resumed_from"] = str(work / "sft")
        model, processor = load_for_training(work / "sft", dev)
        if done.get("decoding") != DECODING:  # its held-out numbers came from another way of replying: again
            report["eval_sft"] = heldout("sft")
            stage.write_text(json.dumps(_slim({**done, "eval_sft": report["eval_sft"], "decoding": DECODING}),
                                        indent=2) + "\n", encoding="utf-8")
    else:
        # -- 1. expert demonstrations and the model
        trajs, samples = demonstrations(cfg.families, cfg.demo_episodes_per_family, width=cfg.width,
                                        height=cfg.height, progress=progress, slip=cfg.demo_slip,
                                        observation=cfg.observation, tools=tools)
        report["demos"] = {"episodes": len(trajs), "successful": sum(t.success for t in trajs), "samples": len(samples),
                           "slipped": sum(bool(t.slipped) for t in trajs),
                           "recovered": sum(bool(t.slipped) and t.success for t in trajs)}
        if cfg.grounding_screens_per_family:
            grounding = grounding_samples(gui_families, cfg.grounding_screens_per_family, width=cfg.width,
                                          height=cfg.height, progress=progress, observation=cfg.observation)
            report["demos"]["grounding_samples"] = len(grounding)
            samples += grounding
        texts = [s.target for s in samples] + [t.instruction for t in trajs]
        base = build_default_model(work / "base", cfg, texts)
        model, processor = load_for_training(base, dev)
        report["params"] = sum(p.numel() for p in model.parameters())

        # -- 2. SFT on the demonstrations, then the held-out numbers
        report["sft"] = train_sft(model, processor, samples, cfg.sft, work / "sft", log=log, progress=progress)
        report["eval_sft"] = heldout("sft")
        stage.write_text(json.dumps(_slim({**{k: report[k] for k in ("demos", "params", "sft", "eval_sft")},
                                           "config": sft_stage_config(cfg), "decoding": DECODING}), indent=2)
                         + "\n", encoding="utf-8")

    # -- 3. PPO on the sandbox, from the SFT model (with resume, a finished PPO stage of the same settings is reused)
    ppo_stage = work / "stage_ppo.json"
    ppo_done = json.loads(ppo_stage.read_text(encoding="utf-8")) if resume and ppo_stage.is_file() else None
    if ppo_done and "resumed_from" in report and (work / "ppo_model" / "model.safetensors").is_file() \
            and ppo_done.get("config") == ppo_stage_config(cfg) and ppo_done.get("decoding") == DECODING:
        report.update({k: ppo_done[k] for k in ("ppo", "eval_ppo")})
        report["resumed_ppo_from"] = str(work / "ppo_model")
        model, processor = load_for_training(work / "ppo_model", dev)
    else:
        from trainer.learn.ppo import train_ppo  # lazy: torch: this module stays light

        torch.set_num_threads(cfg.threads)
        res = train_ppo(model, processor, cfg.ppo, model_dir=work / "sft", work_dir=work / "ppo",
                        env=EnvSpec(**{**play_kw, "max_steps": cfg.ppo_max_steps}),
                        families=cfg.families, log=log, progress=progress)
        sft_threads.apply()  # the workers have stopped
        res["critic"].save(work / "critic")
        report["ppo"] = {"updates": res["updates"], "last": res["history"][-1] if res["history"] else None}
        report["eval_ppo"] = heldout("ppo")
        save_checkpoint(model, processor, work / "ppo_model", {"recipe": "trainer.recipe.default_model", "stage": "ppo"})
        ppo_stage.write_text(json.dumps(_slim({"ppo": report["ppo"], "eval_ppo": report["eval_ppo"],
                                               "config": ppo_stage_config(cfg), "decoding": DECODING}), indent=2)
                             + "\n", encoding="utf-8")

    # -- 3b. the games: continued SFT on their reference players, the sandbox replayed beside them
    if cfg.games:
        run_games_stage(model, processor, cfg, report, work=work, log=log, heldout=heldout, progress=progress)

    # -- 4. save, plot, report
    report["seconds"] = round(time.perf_counter() - t0, 1)
    if out.exists():
        shutil.rmtree(out)
    save_checkpoint(model, processor, out, {"recipe": "trainer.recipe.default_model", "report": _slim(report)})
    log.close()
    plots = {}
    for phase, keys in (("sft", ["loss", "grad_norm"]), ("games_sft", ["loss", "grad_norm"]),
                        ("ppo", ["reward", "success_rate", "entropy", "approx_kl", "clipfrac", "clipfrac_dual",
                                 "explained_variance",
                                 "value_loss", "think_length", "episode_length", "policy_loss", "learner_tokens_per_s",
                                 "click_score", "no_effect_rate"])):
        try:
            since = started if phase == "ppo" else None  # the SFT stage may come from an earlier run
            plots[phase] = str(plot_metrics(log.path, work / f"{phase}_curves.png", phase=phase, keys=keys,
                                            title=f"default model: {phase}", since=since))
        except ValueError:
            pass
    plots["eval"] = str(plot_eval(report, work / "eval_per_family.png"))
    # what ships beside the weights: the held-out numbers and one figure of the whole run
    plots["summary"] = str(plot_summary(log.path, report, out / "training_curves.png", ppo_since=started))
    report["plots"] = plots
    (out / "eval.json").write_text(json.dumps(eval_summary(report), indent=2) + "\n", encoding="utf-8")
    (work / "report.json").write_text(json.dumps(_slim(report), indent=2) + "\n", encoding="utf-8")
    return report


def ppo_stage_config(cfg: RecipeConfig) -> dict:
    """The settings a PPO stage is recorded with (stage_ppo.json) and reused on --resume only when
    unchanged: all of them but the games stage's, which comes after it."""
    return _slim({k: v for k, v in flatten(cfg).items() if k.split(".")[0] not in GAMES_STAGE_KEYS})


def run_games_stage(model, processor, cfg: RecipeConfig, report: dict, *, work: Path, log, heldout,
                    progress: bool = True) -> None:
    """The games stage, in place on `model` (the PPO model): its games' held-out scores before,
    continued SFT on the reference players' turns with as many sandbox demonstration turns beside
    them (cfg.game_replay), then the sandbox's held-out success (`heldout`) and the games' scores
    after, paired on the same seeds. Fills report["games"] and report["eval_final"]."""
    import random

    from tqdm import tqdm

    games = list(cfg.games or [])
    def scored(tag: str) -> dict:
        actor = VLMActor(model, processor, max_new_tokens=64)
        bar = tqdm(total=len(games) * cfg.game_eval_episodes, desc=f"games {tag}", disable=not progress or None)
        res = games_stage.evaluate_games(actor, games, cfg.game_eval_episodes, observation=cfg.observation,
                                         progress=lambda _t: bar.update(1))
        bar.close()
        log.log(0, f"games_{tag}", overall=res["overall"], parse_rate=res["parse_rate"],
                **{f"normalized_{g}": v["normalized"] for g, v in res["games"].items()})
        return res

    before = scored("ppo")
    bar = tqdm(total=len(games) * cfg.game_demo_episodes, desc="game demos", disable=not progress or None)
    samples, info = games_stage.game_samples(games, cfg.game_demo_episodes, cfg.game_demo_turns,
                                             observation=cfg.observation, seed=cfg.seed,
                                             progress=lambda _t: bar.update(1))
    bar.close()
    replay: list[Sample] = []
    want = round(cfg.game_replay * len(samples))
    if want:  # the SFT stage's demonstrations again (the same train seeds), as many turns as asked
        gui = [f for f in cfg.families if not is_hybrid(f)] or cfg.families
        per = max(1, -(-want // (2 * len(gui))))  # an episode gives about two turns; more rounds if short
        demos: list[Sample] = []
        start = 0
        while len(demos) < want:
            _, got = demonstrations(gui, per, width=cfg.width, height=cfg.height, progress=progress,
                                    slip=cfg.demo_slip, observation=cfg.observation, seed_start=start)
            if not got:
                raise RecipeError(f"the expert succeeded on none of {per * len(gui)} demonstrations to replay")
            demos += got
            start += per * len(gui)
        replay = random.Random(cfg.seed).sample(demos, min(want, len(demos)))
    info["replayed"] = len(replay)
    mixed = samples + replay
    random.Random(cfg.seed + 1).shuffle(mixed)
    trained = train_sft(model, processor, mixed, cfg.games_sft, work / "games_sft", log=log, phase="games_sft",
                        progress=progress)
    report["eval_final"] = heldout("final")
    after = scored("final")
    report["games"] = {"demos": info, "sft": trained, "before": before, "after": after,
                       "paired": games_stage.paired_games(before, after)}


def eval_summary(report: dict) -> dict:
    """Held-out success per family after SFT and after PPO, and how they were measured."""
    fams = list(report["eval_sft"]["families"])
    sft, ppo = report["eval_sft"], report["eval_ppo"]
    return {
        "split": "heldout (task seeds from trainer.sandbox.task.HELDOUT_START), greedy decoding",
        "episodes_per_family": report["config"]["eval_seeds_per_family"],
        "families": {f: {"sft": sft["families"][f]["success"], "ppo": ppo["families"][f]["success"],
                         "delta": round(ppo["families"][f]["success"] - sft["families"][f]["success"], 4),
                         **_intervals(sft, ppo, f)} for f in fams},
        "mean": {"sft": sft["mean_success"], "ppo": ppo["mean_success"],
                 "delta": round(ppo["mean_success"] - sft["mean_success"], 4), **_intervals(sft, ppo)},
        # greedy "Click on 'X'." on held-out screens: the share of clicks inside X (trainer.rollout.grounding)
        "grounding": {tag: r["grounding"]["mean_accuracy"] for tag, r in (("sft", sft), ("ppo", ppo))
                      if "grounding" in r},
        # of those replies, the share whose thought names X: the instruction read, whatever the click
        "named": {tag: r["grounding"]["mean_named"] for tag, r in (("sft", sft), ("ppo", ppo))
                  if "mean_named" in r.get("grounding", {})},
        **_final_summary(report),
        "demos": report.get("demos"), "ppo_updates": report.get("ppo", {}).get("updates"),
        "seconds": report.get("seconds"), "device": report.get("device"), "config": report["config"],
        "reproduce": reproduce_command(report["config"]),
        "resumed_from": report.get("resumed_from"),
    }


def _final_summary(report: dict) -> dict:
    """What ships after the games stage: its held-out success beside PPO's (paired, the same seeds),
    and the games' normalized scores before and after it. Empty without a games stage."""
    if "games" not in report:
        return {}
    ppo, final, g = report["eval_ppo"], report["eval_final"], report["games"]
    pair = _intervals(ppo, final)
    return {
        "final": {"stage": "games", "success": final["mean_success"],
                  "delta_vs_ppo": round(final["mean_success"] - ppo["mean_success"], 4),
                  **({"ci95": pair["ppo_ci95"], "delta_ci95": pair["delta_ci95"], "episodes": pair["episodes"]}
                     if pair else {}),
                  "families": {f: v["success"] for f, v in final["families"].items()}},
        "games": {"split": "heldout (seeds from trainer.sandbox.task.HELDOUT_START), greedy decoding, 100 steps",
                  "episodes_per_game": report["config"]["game_eval_episodes"],
                  "per_game": {name: {"before": g["before"]["games"][name]["normalized"],
                                      "after": g["after"]["games"][name]["normalized"],
                                      "after_ci95": g["after"]["games"][name]["ci95"],
                                      "delta_ci95": g["paired"]["games"].get(name, {}).get("ci95")}
                               for name in g["after"]["games"]},
                  "overall": {"before": g["before"]["overall"], "after": g["after"]["overall"],
                              "before_ci95": g["before"]["ci95"], "after_ci95": g["after"]["ci95"],
                              "delta": g["paired"]["delta"], "delta_ci95": g["paired"]["ci95"]},
                  "parse_rate": {"before": g["before"]["parse_rate"], "after": g["after"]["parse_rate"]},
                  "demos": g["demos"]},
    }


def _intervals(sft: dict, ppo: dict, family: str | None = None) -> dict:
    """Episodes, Wilson 95% intervals of both rates and the paired 95% interval of PPO - SFT on the
    same seeds (trainer.stats), for one family or all; empty for evaluations that kept no outcomes."""
    if "outcomes" not in sft or "outcomes" not in ppo:
        return {}
    a = {(f, s): ok for f, s, ok in sft["outcomes"] if family in (None, f)}
    b = {(f, s): ok for f, s, ok in ppo["outcomes"] if family in (None, f)}
    keys = sorted(a.keys() & b.keys())
    first, second = [a[k] for k in keys], [b[k] for k in keys]
    diff = paired_difference(first, second)
    return {"episodes": len(keys), "sft_ci95": rate(first)["ci95"], "ppo_ci95": rate(second)["ci95"],
            "delta_ci95": [round(x, 4) for x in diff["ci95"]]}


def reproduce_command(config: dict) -> str:
    """`python main.py train default ...` with the flag of every setting whose value differs from
    the default (trainer.config_flags.to_argv: each field is a flag, so nothing can be left out);
    `config` as saved (asdict), flat keys of older runs included."""
    import shlex

    argv = to_argv(RecipeConfig.from_dict(config))
    return " ".join(["python main.py train default --out assets/default_model", *map(shlex.quote, argv)])


def plot_summary(metrics_path, report: dict, out_png, ppo_since: float | None = None) -> Path:
    """One small PNG: SFT loss; PPO reward, success rate and entropy per update; held-out
    success per family after SFT and after PPO."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    sft = [r for r in rows if r["phase"] == "sft"]
    ppo = [r for r in rows if r["phase"] == "ppo" and (ppo_since is None or r.get("time", 0.0) >= ppo_since)]
    games = report.get("games")
    fig, axes = plt.subplots(1, 6 if games else 5, figsize=(20 if games else 17, 3.1))
    panels = [(sft, "loss", "SFT loss (assistant tokens)"), (ppo, "reward", "PPO reward / episode"),
              (ppo, "success_rate", "PPO rollout success rate"), (ppo, "entropy", "PPO policy entropy")]
    for ax, (data, key, title) in zip(axes, panels, strict=False):  # axes[4] is drawn below
        xs = [r["step"] for r in data if isinstance(r.get(key), float)]
        ys = [r[key] for r in data if isinstance(r.get(key), float)]
        ax.plot(xs, ys, lw=1, alpha=0.5 if len(ys) > 20 else 1.0)
        if len(ys) > 5:  # a running mean shows the trend through the batch noise
            k = max(3, len(ys) // 10)
            sm = [sum(ys[max(0, i - k + 1): i + 1]) / len(ys[max(0, i - k + 1): i + 1]) for i in range(len(ys))]
            ax.plot(xs, sm, lw=2)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("SFT step" if data is sft else "PPO update", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    ax = axes[4]
    fams = list(report["eval_sft"]["families"])
    x = range(len(fams))
    for off, tag in ((-0.2, "sft"), (0.2, "ppo")):
        ev = report[f"eval_{tag}"]
        ax.bar([i + off for i in x], [ev["families"][f]["success"] for f in fams], 0.4,
               label=f"after {tag.upper()} (mean {ev['mean_success']:.0%})")
    ax.set_xticks(list(x), fams, rotation=30, ha="right", fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_title("held-out success per family", fontsize=9)
    ax.legend(fontsize=7)
    if games:
        ax = axes[5]
        names = list(games["after"]["games"])
        for off, tag, label in ((-0.2, "before", "after PPO"), (0.2, "after", "after the games stage")):
            vals = [games[tag]["games"][n]["normalized"] or 0.0 for n in names]
            ax.bar([i + off for i in range(len(names))], vals, 0.4,
                   label=f"{label} (mean {games[tag]['overall'] or 0:.1f})")
        ax.axhline(100, color="grey", lw=0.8, ls="--")
        ax.set_xticks(list(range(len(names))), names, rotation=30, ha="right", fontsize=7)
        ax.set_title("games: normalized score (reference = 100)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=80)
    plt.close(fig)
    return Path(out_png)


def _slim(report: dict) -> dict:
    return json.loads(json.dumps(report, default=str))


def plot_eval(report: dict, out_png) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = list(report["eval_sft"]["families"])
    a = [report["eval_sft"]["families"][f]["success"] for f in fams]
    b = [report["eval_ppo"]["families"][f]["success"] for f in fams]
    x = range(len(fams))
    fig, ax = plt.subplots(figsize=(1.2 * len(fams) + 2, 3.2))
    ax.bar([i - 0.2 for i in x], a, 0.4, label=f"after SFT (mean {report['eval_sft']['mean_success']:.0%})")
    ax.bar([i + 0.2 for i in x], b, 0.4, label=f"after PPO (mean {report['eval_ppo']['mean_success']:.0%})")
    ax.set_xticks(list(x), fams, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("held-out success")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
    return Path(out_png)
