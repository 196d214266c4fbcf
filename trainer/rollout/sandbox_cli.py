"""`python main.py sandbox show | generate | eval`: look at a task, write expert demonstrations
into the store, measure a policy's success per family."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from agent.cli_common import fail, open_store
from agent.executors.base import encode_pixels
from agent.storage.model_files import DEFAULT_MODEL_DIR, model_screen
from trainer.rollout import games_cli, miniwob_eval
from trainer.rollout.actors import ExpertActor, RandomActor
from trainer.rollout.cli_actors import make_actor, make_policy, progress_bar
from trainer.rollout.grounding import grounding_eval
from trainer.rollout.runner import EpisodeRunner, demonstrate, plan, rates, trace_summary, trajectory_to_episode
from trainer.rollout.specs import INFERENCE_DTYPES
from trainer.sandbox.env import SandboxEnv, observation_for
from trainer.sandbox.env_process import make_envs
from trainer.sandbox.families import FAMILIES, HYBRID_FAMILIES, family_class, is_hybrid, parse_families
from trainer.sandbox.miniwob_browser import MiniWoBError
from trainer.sandbox.miniwob_env import available
from trainer.sandbox.screen import SandboxError
from trainer.sandbox.task import HELDOUT_START
from trainer.stats import wilson


def register(sub, common) -> None:
    p = sub.add_parser("sandbox", help="generated GUI tasks on real Qt widgets: show, generate, eval",
                       description="The sandbox of verifiable GUI tasks (see trainer/sandbox).")
    ss = p.add_subparsers(dest="sandbox_command", metavar="SUBCOMMAND", required=True)
    size = _size_parent()

    s = ss.add_parser("show", parents=[common, size], help="show one task in a window (or save a PNG offscreen)")
    s.add_argument("--family", required=True, help="task family (see `sandbox families`)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--png", metavar="PATH", help="save the screenshot here instead of opening a window")
    s.add_argument("--expert-steps", type=int, default=0, metavar="K", help="let the expert act K steps first")
    _tools_flag(s, both=False)
    s.set_defaults(func=cmd_show)

    s = ss.add_parser("families", parents=[common], help="list the task families, easiest first")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_families)

    s = ss.add_parser("generate", parents=[common, size], help="write expert trajectories into the store",
                      description="Expert demonstrations into the store, played through the one episode runner: the "
                                  "sandbox's scripted expert, or (--suite games) each game's reference player with a "
                                  "short thought per step. A game episode's outcome is a success when it scored above "
                                  "the game's random player's mean (norms.json); its score is in the episode's meta.")
    s.add_argument("--suite", choices=("sandbox", "games"), default="sandbox",
                   help="the sandbox's tasks (default) or the browser games (needs chromium)")
    s.add_argument("--episodes", type=int, required=True, help="episodes in all; --suite games: per game")
    s.add_argument("--split", choices=("train", "heldout"), default="train")
    s.add_argument("--families", help="comma-separated families (default: all)")
    s.add_argument("--games", help="--suite games: comma-separated games (default: every game there is)")
    s.add_argument("--start", type=int, default=0, help="offset of the first seed within the split")
    s.add_argument("--workers", type=int, default=1, help="worker processes (one environment each)")
    _tools_flag(s, both=False)
    s.set_defaults(func=cmd_generate)

    s = ss.add_parser("eval", parents=[common, size], help="success rate of a policy per family and overall",
                      description="Success rates with Wilson 95%% intervals, on the sandbox's tasks or (--suite "
                                  "miniwob) on MiniWoB++ tasks in headless Chromium; with --suite games, normalized "
                                  "game scores (the reference player's mean = 100) with t 95%% intervals.")
    s.add_argument("--suite", choices=("sandbox", "miniwob", "games"), default="sandbox",
                   help="the sandbox's own tasks (default), MiniWoB++ (needs miniwob, chromium, chromium-driver) or "
                        "the browser games (needs chromium)")
    s.add_argument("--policy", required=True,
                   choices=("expert", "oracle", "reference", "random", "default", "local", "endpoint"),
                   help="expert: the sandbox's scripted expert; oracle: MiniWoB++'s DOM oracle (checks the adapter); "
                        "reference: each game's scripted reference player (--suite games)")
    s.add_argument("--model-dir", help="model directory for --policy local/default")
    s.add_argument("--url", help="base URL of an OpenAI-compatible server for --policy endpoint")
    s.add_argument("--model", help="model name for --policy endpoint")
    s.add_argument("--episodes", type=int, required=True,
                   help="episodes in all, spread evenly over the families (or --tasks); --suite games: per game")
    s.add_argument("--split", choices=("train", "heldout"), default="heldout")
    s.add_argument("--families", help="comma-separated families (default: all the GUI-only ones; 'hybrid': every "
                                      "hybrid GUI+tools family)")
    _tools_flag(s, both=True)
    s.add_argument("--tasks", help="--suite miniwob: comma-separated MiniWoB++ tasks (default: "
                                   "click-test,click-button,click-link,focus-text,enter-text,click-checkboxes)")
    s.add_argument("--games", help="--suite games: comma-separated games (default: every game there is; "
                                   "`sandbox games list` names them)")
    s.add_argument("--episode-seconds", type=float, metavar="S",
                   help="--suite miniwob: MiniWoB++'s episode clock in seconds (default: each task's own, mostly 10; "
                        "a model that thinks for seconds a step needs more)")
    s.add_argument("--workers", type=int, default=1,
                   help="expert/random: environments played together, each in a process of its own (default 1)")
    s.add_argument("--envs", type=int, default=16,
                   help="model policies: environments played together, one batched generation per round (default 16)")
    s.add_argument("--max-new-tokens", type=int, default=128, help="model policies: reply length limit (default 128)")
    s.add_argument("--threads", type=int, default=None,
                   help="model policies: torch threads (default: the cores other work leaves free; TANDEM_THREADS "
                        "sets it too)")
    s.add_argument("--inference-dtype", choices=INFERENCE_DTYPES, default="fp32",
                   help="--policy default/local: the dtype the model's weights run in (default fp32; see the README's "
                        "bf16 result for what bf16 changes)")
    s.add_argument("--json", action="store_true",
                   help='print {"overall": rate, "families": {NAME: rate}, "intervals": {...}} (intervals: episodes and '
                        'Wilson 95%% interval per family and overall)')
    s.add_argument("--grounding", action="store_true",
                   help="score grounding instead: 'Click on X' for two labelled elements of each of --episodes "
                        "screens, a hit when the click lands inside X (trainer.rollout.grounding)")
    s.add_argument("--trace", action="store_true",
                   help="show what each step did: per episode, every click with the labelled element it landed on "
                        "(or none) and whether it changed the screen; per family, the shares of clicks on no "
                        "labelled element and of actions that changed nothing")
    s.set_defaults(func=cmd_eval)

    games_cli.register(ss, common)



TOOLS_HELP = ("the terminal and file tools (run_command, read_file, write_file) over a workspace folder per "
              "episode, beside the GUI: on, off{both}; default: on when a hybrid family is asked for (see `sandbox "
              "families`), else off. With off, a hybrid family with no GUI-only route is reported as not playable")


def _tools_flag(parser, both: bool) -> None:
    parser.add_argument("--tools", choices=("on", "off", "both") if both else ("on", "off"), default=None,
                        help=TOOLS_HELP.format(both=", or both (each episode played with and without them, "
                                                    "success and mean steps side by side)" if both else ""))


def tools_modes(flag: str | None, families: list[str] | None) -> list[bool]:
    """The tool settings to play: --tools as given, else on exactly when a hybrid family is asked for."""
    if flag is None:
        flag = "on" if families and any(is_hybrid(f) for f in families) else "off"
    return {"on": [True], "off": [False], "both": [True, False]}[flag]


def playable(families: list[str], tools: bool) -> tuple[list[str], dict[str, str]]:
    """(the families that can be played with these tools, {family: why not} for the others)."""
    out, not_playable = [], {}
    for f in families:
        cls = family_class(f)
        if not tools and is_hybrid(f) and not cls.gui_route:
            not_playable[f] = f"needs the tools: {cls.needs_tools}"
        else:
            out.append(f)
    return out, not_playable


def trained_families(model_dir) -> list[str] | None:
    """The sandbox families a checkpoint of trainer.recipe.default_model was trained on (None if unknown)."""
    try:
        meta = json.loads((Path(model_dir) / "tandem_training.json").read_text(encoding="utf-8"))
        fams = meta["report"]["config"]["families"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return [f for f in fams if isinstance(f, str)] or None


def _size_parent():
    import argparse

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--width", type=int, help="screen width in pixels (default: the model's training size, else 320)")
    p.add_argument("--height", type=int, help="screen height in pixels (default: the model's, else 240)")
    return p


def resolve_screen(args) -> None:
    """Fill args.width, args.height and args.observation: given flags win, then the size and
    observation the evaluated model was trained with (without a policy, as `sandbox generate`:
    the default model's, whose data it makes), then 320x240 with element lists."""
    trained, observation = {}, "elements"
    policy = getattr(args, "policy", None)
    if policy in ("default", "local") or policy is None:  # no policy: demonstrations, for the default model
        model_dir = getattr(args, "model_dir", None) or DEFAULT_MODEL_DIR
        trained, observation = model_screen(model_dir), observation_for(model_dir)
    args.width = args.width or trained.get("width", 320)
    args.height = args.height or trained.get("height", 240)
    args.observation = observation


def _families(args) -> list[str] | None:
    return parse_families(getattr(args, "families", None))


def cmd_families(args) -> int:
    rows = [{"family": n, "level": c.level, "max_steps": c.max_steps} for n, c in FAMILIES.items()]
    # the hybrid ones (played only when named): their step budget is sized per episode
    hybrid = [{"family": n, "level": c.level, "hybrid": True, "gui_route": c.gui_route} for n, c in HYBRID_FAMILIES.items()]
    if args.json:
        print(json.dumps(rows + hybrid))
    else:
        for r in rows:
            print(f"{r['family']:<16} level {r['level']}  max steps {r['max_steps']}")
        for r in hybrid:
            route = "GUI-only route too" if r["gui_route"] else "tools required"
            print(f"{r['family']:<16} level {r['level']}  hybrid: GUI + tools ({route})")
    return 0


def cmd_show(args) -> int:
    offscreen = os.environ.get("QT_QPA_PLATFORM", "").startswith("offscreen")
    if offscreen and not args.png:
        return fail("QT_QPA_PLATFORM is offscreen, so no window can be shown: pass --png PATH to save the screen")
    if not args.png:
        os.environ.setdefault("QT_QPA_PLATFORM", "xcb" if sys.platform.startswith("linux") else "")

    resolve_screen(args)
    try:
        env = SandboxEnv(args.width, args.height, tools=tools_modes(args.tools, [args.family])[0])
        obs, info = env.reset(seed=args.seed, options={"family": args.family})
        for _ in range(args.expert_steps):
            thought, action = env.expert_action()
            print(f"expert: {thought}")
            obs, _, term, trunc, info = env.step(action)
            if obs.get("tool_output"):
                out = obs["tool_output"]
                print(f"  {out['tool']} {out['target']!r} (exit code {out['exit_code']}):\n" + "".join(
                    f"    {line}\n" for line in out["output"].splitlines()[:8]), end="")
            if term or trunc:
                break
    except (SandboxError, ValueError) as e:
        return fail(str(e))
    print(f"[{info['family']} seed {info['task_seed']}] {info['instruction']}  ({info['status']}, progress {info['progress']:.2f})")
    if args.png:
        with open(args.png, "wb") as f:
            f.write(encode_pixels(obs["screenshot"], "image/png"))
        print(f"saved {args.png}")
        env.close()
        return 0
    return _interactive(env)


def _interactive(env) -> int:
    """Let a person try the task in a real window; the verifier reports as they act."""
    from PySide6.QtCore import QTimer

    screen, task = env.screen, env.task
    screen.window.setWindowTitle(f"Tandem sandbox: {task.instruction}")
    last = [None]

    def poll():
        v = task.verdict()
        if (v.status, v.progress) != last[0]:
            last[0] = (v.status, v.progress)
            print(f"verifier: {v.status}, progress {v.progress:.2f} {v.reason}".rstrip(), flush=True)

    timer = QTimer()
    timer.timeout.connect(poll)
    timer.start(200)
    screen.app.setQuitOnLastWindowClosed(True)
    screen.app.exec()
    return 0


def cmd_generate(args) -> int:
    if args.suite == "games":
        return games_cli.generate(args)
    if args.games:
        return fail("--games is for --suite games")
    try:
        tickets = plan(args.episodes, args.split, _families(args), args.start)
        tools = tools_modes(args.tools, _families(args))[0]
        _, not_playable = playable(sorted({t[1] for t in tickets}), tools)
    except Exception as e:
        return fail(str(e))
    if not_playable:
        return fail("; ".join(f"{f} {why}" for f, why in not_playable.items()) + " (use --tools on)")
    if args.workers < 1:
        return fail(f"--workers must be at least 1, got {args.workers}")
    store = open_store(args)
    resolve_screen(args)
    ok = 0
    bar = progress_bar(len(tickets), "expert episodes")

    def keep(traj) -> None:  # stored as each episode ends
        nonlocal ok
        trajectory_to_episode(traj, store, producer="expert", policy_version="sandbox-expert")
        ok += traj.success
        bar.update(1)

    try:
        env_kw = {"width": args.width, "height": args.height, **({"tools": True} if tools else {})}
        demonstrate(tickets, env_kw=env_kw, n_envs=args.workers, progress=keep)
    finally:
        bar.close()
        store.close()
    print(f"wrote {len(tickets)} expert episodes ({ok} successful) to {store.root}")
    return 0 if ok == len(tickets) else 1


def _play(args, make, tickets, n_envs: int, bar, tools: bool = False) -> list:
    """The tickets played by the one episode runner (trainer.rollout.runner) over `n_envs` sandbox envs
    (with the terminal and file tools where `tools`); `make(envs)` gives the actor (the expert and
    random policy answer for each env)."""
    envs = make_envs(min(n_envs, len(tickets)), width=args.width, height=args.height, observation=args.observation,
                     **({"tools": True} if tools else {}))
    try:
        runner = EpisodeRunner(make(envs), envs, greedy=True, platform="desktop", trace=args.trace)
        return runner.run_all(tickets, progress=lambda _t: bar.update(1))
    finally:
        for env in envs:
            env.close()


def _grounding(args, families) -> int:
    if args.policy in ("expert", "random"):
        return fail("--grounding scores a model: use --policy default, local or endpoint")
    families = families or list(FAMILIES)
    per_family = max(1, args.episodes // len(families))
    try:
        policy = make_policy(args)
    except Exception as e:
        return fail(str(e))
    bar = progress_bar(per_family * len(families), f"{args.policy} grounding screens")
    try:
        res = grounding_eval(policy, families, per_family, width=args.width, height=args.height,
                             observation=args.observation,
                             seed_start=HELDOUT_START if args.split == "heldout" else 0, progress=lambda: bar.update(1))
    except Exception as e:
        return fail(str(e))
    finally:
        bar.close()
        policy.close()
    # "named": the thought names the element (the instruction was read); "hits|named": hits among those
    _print_rates(args.json, "hits", res["mean_accuracy"],
                 {k: (v["asked"], v["accuracy"], v["unparsed"], f"{v['named']:.0%}", f"{v['accuracy_named']:.0%}")
                  for k, v in res["families"].items()}, ("unparsed", "named", "hits|named"),
                 {"named": {"overall": res["mean_named"], "families": {k: v["named"] for k, v in res["families"].items()}}})
    return 0


def _print_rates(as_json: bool, what: str, overall: float, rows: dict, extra: tuple[str, ...] = (),
                 more_json: dict | None = None) -> None:
    """{"overall": rate, "families": {name: rate}, "intervals": {...}} (plus `more_json`) as JSON, or
    a table of rows name -> (n, rate, *one value per `extra` column), each rate with its Wilson 95%
    interval (trainer.stats)."""
    def interval(n, r):
        return wilson(round(r * n), n)

    total = sum(r[0] for r in rows.values())
    lo, hi = interval(total, overall)
    width = max([16] + [len(k) for k in rows])
    if as_json:
        intervals = {"overall": {"episodes": total, "ci95": [lo, hi]},
                     "families": {k: {"episodes": r[0], "ci95": list(interval(r[0], r[1]))} for k, r in rows.items()}}
        print(json.dumps({"overall": overall, "families": {k: r[1] for k, r in rows.items()}, "intervals": intervals,
                          **(more_json or {})}))
        return
    print(f"{'family':<{width}} {'n':>5} {what:>8} {'95% interval':>16}" + "".join(f" {h:>10}" for h in extra))
    for name, r in rows.items():
        a, b = interval(r[0], r[1])
        print(f"{name:<{width}} {r[0]:>5} {r[1]:>8.2%} {f'[{a:.2f}, {b:.2f}]':>16}"
              + "".join(f" {v:>10}" for v in r[2:2 + len(extra)]))
    print(f"{'overall':<{width}} {total:>5} {overall:>8.2%} {f'[{lo:.2f}, {hi:.2f}]':>16}")


def _suite_problem(args) -> str | None:
    """What is wrong with the flags for the chosen --suite, or None."""
    if args.suite != "games" and (args.policy == "reference" or args.games):
        return "--policy reference and --games are for --suite games"
    if args.suite == "games":
        if args.policy in ("expert", "oracle"):
            return f"--suite games has no --policy {args.policy}: its scripted player is --policy reference"
        wrong = [flag for flag, given in (("--families", args.families), ("--tasks", args.tasks),
                                          ("--grounding", args.grounding), ("--trace", args.trace),
                                          ("--episode-seconds", args.episode_seconds is not None),
                                          ("--width", args.width is not None), ("--height", args.height is not None),
                                          ("--workers", args.workers != 1)) if given]
        if wrong:  # said, not silently ignored
            return (f"{', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} not for --suite games: it takes --games, "
                    "and a game's screen is its canvas (336x252)")
    elif args.suite == "miniwob":
        if args.policy == "expert":
            return "--suite miniwob has no scripted expert: use --policy oracle (it reads the page's DOM)"
        if args.families:
            return "--suite miniwob takes --tasks, not --families"
        if args.grounding:
            return "--grounding scores the sandbox's labelled screens; it has no MiniWoB++ form"
        if args.episode_seconds is not None and not args.episode_seconds > 0:
            return f"--episode-seconds must be > 0, got {args.episode_seconds}"
        ignored = [flag for flag, given in (("--width", args.width is not None), ("--height", args.height is not None),
                                            ("--split", args.split != "heldout"), ("--workers", args.workers != 1))
                   if given]
        if ignored:  # said, not silently ignored
            return (f"{', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} the sandbox's: MiniWoB++ pages are "
                    "its own size (160x210) and its seeds run 0, 1, … in each task")
    else:
        if args.policy == "oracle":
            return "--policy oracle is MiniWoB++'s DOM oracle: add --suite miniwob (the sandbox's is --policy expert)"
        if args.tasks or args.episode_seconds is not None:
            return "--tasks and --episode-seconds are for --suite miniwob"
    if getattr(args, "inference_dtype", "fp32") != "fp32" and (args.policy not in ("default", "local") or args.grounding):
        return ("--inference-dtype is for the episodes of a local model (--policy default or local, without "
                "--grounding): an endpoint, the expert and the random policy have no weights here")
    return None


def _eval_miniwob(args) -> int:
    """`sandbox eval --suite miniwob`: MiniWoB++ tasks through the one episode runner."""
    missing = available()
    if missing:
        return fail(f"MiniWoB++ cannot run here: {missing} (see the README's MiniWoB++ section)")
    try:
        tasks = miniwob_eval.parse_tasks(args.tasks)
        miniwob_eval.tickets(tasks, args.episodes)
    except ValueError as e:
        return fail(str(e))
    policy = args.policy
    if policy not in miniwob_eval.BUILTIN:
        try:
            policy = make_actor(args)
        except Exception as e:
            return fail(str(e))
    bar = progress_bar(args.episodes, f"{args.policy} MiniWoB++ episodes")
    try:
        trajs = miniwob_eval.play(policy, tasks, args.episodes, envs=args.envs, trace=args.trace,
                                  env_kw={"episode_seconds": args.episode_seconds}, progress=lambda _t: bar.update(1))
    except (MiniWoBError, ValueError) as e:
        return fail(str(e))
    finally:
        bar.close()
    return _report(args, trajs, {"suite": "miniwob", "episode_seconds": args.episode_seconds})


def cmd_eval(args) -> int:
    problem = _suite_problem(args)
    if problem:
        return fail(problem)
    if args.suite == "miniwob":
        return _eval_miniwob(args)
    if args.suite == "games":
        return games_cli.evaluate(args)
    resolve_screen(args)
    try:
        families = _families(args)
        if families is None and args.policy == "default":
            # the default model knows only the families it was trained on; say so rather than
            # silently mixing in tasks it never saw (--families picks any others)
            families = trained_families(args.model_dir or DEFAULT_MODEL_DIR)
            if families:
                print(f"--policy default: the {len(families)} families it was trained on ({', '.join(families)}); "
                      "pass --families for others", file=sys.stderr)
        tickets = plan(args.episodes, args.split, families)
        modes = tools_modes(args.tools, families)
    except Exception as e:
        return fail(str(e))
    if args.grounding:
        if args.tools is not None or any(is_hybrid(f) for f in families or []):
            return fail("--grounding scores clicks on the GUI families' screens; it takes neither --tools nor hybrid "
                        "families")
        return _grounding(args, families)
    if args.policy in ("expert", "random"):
        if args.workers < 1:
            return fail(f"--workers must be at least 1, got {args.workers}")
        n_envs, make = args.workers, (ExpertActor if args.policy == "expert" else RandomActor)
    else:
        try:
            actor = make_actor(args)
        except Exception as e:
            return fail(str(e))
        n_envs, make = args.envs, (lambda _envs: actor)
    if args.tools is None and modes == [False]:  # the GUI-only families, as before the hybrid ones
        bar = progress_bar(len(tickets), f"{args.policy} episodes")
        try:
            trajs = _play(args, make, tickets, n_envs, bar)
        finally:
            bar.close()
        return _report(args, trajs)
    return _eval_tools(args, make, tickets, n_envs, modes)


def _eval_tools(args, make, tickets, n_envs: int, modes: list[bool]) -> int:
    """`sandbox eval` with the tools on, off or both: per family the success rate with its Wilson 95%
    interval and the mean steps per episode, for each setting; a family that cannot be played
    without the tools is reported as such, not as a 0."""
    families = list(dict.fromkeys(t[1] for t in tickets))
    results = {}
    for tools in modes:
        ok, not_playable = playable(families, tools)
        mine = [t for t in tickets if t[1] in ok]
        trajs = []
        if mine:
            bar = progress_bar(len(mine), f"{args.policy} episodes, tools {'on' if tools else 'off'}")
            try:
                trajs = _play(args, make, mine, n_envs, bar, tools=tools)
            finally:
                bar.close()
        results["on" if tools else "off"] = _tools_report(trajs, ok, not_playable)
    if args.json:
        if len(results) == 1:
            (name, out), = results.items()
            print(json.dumps({**out, "tools": name}))
        else:
            steps = {f: {k: r["mean_steps"].get(f) for k, r in results.items()} for f in families}
            print(json.dumps({"tools": "both", **results, "mean_steps": steps}))
        return 0
    width = max([16] + [len(f) for f in families])
    print(f"{'family':<{width}}" + "".join(f" | tools {k:<3} {'n':>4} {'success':>8} {'95% interval':>14} {'steps':>6}"
                                           for k in results))
    for f in families + ["overall"]:
        line = f"{f:<{width}}"
        for r in results.values():
            if f in r["not_playable"]:
                line += f" | {'not playable (needs the tools)':>50}"
                continue
            where = r["intervals"]["overall"] if f == "overall" else r["intervals"]["families"][f]
            rate = r["overall"] if f == "overall" else r["families"][f]
            steps = r["overall_mean_steps"] if f == "overall" else r["mean_steps"][f]
            lo, hi = where["ci95"]
            line += (f" | {'':9} {where['episodes']:>4} {rate:>8.2%} {f'[{lo:.2f}, {hi:.2f}]':>14} "
                     f"{steps:>6.1f}")
        print(line)
    return 0


def _tools_report(trajs: list, families: list[str], not_playable: dict) -> dict:
    """`sandbox eval --json`'s report ({"overall": rate, "families": {name: rate}, "intervals": episodes
    and Wilson 95% interval per family and overall}) for the families played, with the mean steps
    per episode ("mean_steps" per family, "overall_mean_steps") and the families not played and why."""
    def steps(ts):
        return sum(len(t.turns) for t in ts) / len(ts) if ts else 0.0

    def interval(ts):
        return {"episodes": len(ts), "ci95": list(wilson(sum(t.success for t in ts), len(ts)))}

    by = {f: [t for t in trajs if t.family == f] for f in families}
    return {"overall": sum(t.success for t in trajs) / len(trajs) if trajs else 0.0,
            "families": {f: sum(t.success for t in ts) / len(ts) if ts else 0.0 for f, ts in by.items()},
            "intervals": {"overall": interval(trajs), "families": {f: interval(ts) for f, ts in by.items()}},
            "mean_steps": {f: steps(ts) for f, ts in by.items()}, "overall_mean_steps": steps(trajs),
            "not_playable": not_playable}


def _report(args, trajs: list, more_json: dict | None = None) -> int:
    """Print the success rates of played trajectories (and with --trace, what each turn did)."""
    out = rates(trajs)
    if not args.trace:
        rows = {k: (out["counts"][k], r) for k, r in out["families"].items()}
        _print_rates(args.json, "success", out["overall"], rows, more_json=more_json)
        return 0
    if not args.json:
        for t in sorted(trajs, key=lambda t: (t.family, t.seed)):
            print(f"{t.family} {t.seed} {'success' if t.success else 'failure'}: {t.instruction}")
            print("    " + " ; ".join(_traced(u) for u in t.turns))
    summary = trace_summary(trajs)
    _print_rates(args.json, "success", out["overall"],
                 {k: (out["counts"][k], rate, f"{summary[k]['clicks_per_episode']:.1f}", f"{summary[k]['missed']:.0%}",
                      f"{summary[k]['no_effect']:.0%}") for k, rate in out["families"].items()},
                 ("clicks/ep", "missed", "no effect"), {"trace": summary, **(more_json or {})})
    return 0


def _traced(turn) -> str:
    """One traced turn, e.g. `click 'Save' (0.41,0.62)`, `click nothing (0.50,0.28) no effect`."""
    if not turn.action:
        return f"unparsed ({turn.parse_error})"
    text = turn.action
    if turn.hit is not None:
        text += f" {repr(turn.hit) if turn.hit else 'nothing'} ({turn.point[0]:.2f},{turn.point[1]:.2f})"
    if turn.changed is False:
        text += " no effect"
    elif turn.action_error:
        text += f" ({turn.action_error})"
    return text
