"""`sandbox games list|calibrate`, and the games' side of `sandbox generate --suite games` and
`sandbox eval --suite games` (trainer.rollout.sandbox_cli parses the flags and calls in here)."""
from __future__ import annotations

import json
import sys

from agent.cli_common import fail, open_store
from agent.storage.model_files import DEFAULT_MODEL_DIR
from trainer.rollout import games_eval
from trainer.rollout.cli_actors import make_actor, progress_bar
from trainer.sandbox.env import observation_for
from trainer.sandbox.games import registry as game_registry
from trainer.sandbox.games.browser import GameBrowserError


def register(ss, common) -> None:
    """The `sandbox games` subcommands, under the sandbox command's subparsers `ss`."""
    g = ss.add_parser("games", help="the browser games: list them, calibrate their normalized scores",
                      description="Browser games played in headless Chromium under a fake clock (trainer/sandbox/games).")
    gs = g.add_subparsers(dest="games_command", metavar="SUBCOMMAND", required=True)
    s = gs.add_parser("list", parents=[common], help="the games, what their verifiers read, their norms")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_list)
    s = gs.add_parser("calibrate", parents=[common],
                      help="measure the reference and random players' mean scores (train seeds) into norms.json")
    s.add_argument("--episodes", type=int, required=True, help="episodes per game and player")
    s.add_argument("--games", help="comma-separated games (default: all); only these games' norms change")
    s.add_argument("--dry-run", action="store_true", help="print the means without writing norms.json")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_calibrate)


def generate(args) -> int:
    """`sandbox generate --suite games`: the reference players' episodes into the store."""
    wrong = [flag for flag, given in (("--families", args.families), ("--tools", args.tools is not None),
                                      ("--width", args.width is not None), ("--height", args.height is not None),
                                      ("--workers", args.workers != 1)) if given]
    if wrong:  # said, not silently ignored
        return fail(f"{', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} not for --suite games: it takes --games, "
                    "and a game's screen is its canvas (336x252)")
    try:
        games = game_registry.parse_games(args.games)
        games_eval.tickets(games, args.episodes, args.split, args.start)
    except ValueError as e:
        return fail(str(e))
    store = open_store(args)
    bar = progress_bar(args.episodes * len(games), "reference game episodes")
    try:
        done = games_eval.demonstrate(games, args.episodes, store, split=args.split, start=args.start,
                                      progress=lambda _t: bar.update(1))
    except (GameBrowserError, ValueError) as e:
        return fail(str(e))
    finally:
        bar.close()
        store.close()
    for g in games:
        mine = [d for d in done if d["game"] == g]
        norm = [d["normalized"] for d in mine if d["normalized"] is not None]
        print(f"{g:<8} {len(mine)} episodes, mean score {sum(d['score'] for d in mine) / len(mine):.1f}"
              + (f" (normalized {sum(norm) / len(norm):.1f})" if norm else "")
              + f", {sum(d['success'] for d in mine)} above the random player's mean")
    print(f"wrote {len(done)} reference game episodes to {store.root}")
    return 0


def evaluate(args) -> int:
    """`sandbox eval --suite games`: the games through the one episode runner, normalized scores."""
    try:
        games = game_registry.parse_games(args.games)
        games_eval.tickets(games, args.episodes, args.split)
    except ValueError as e:
        return fail(str(e))
    gone = {k: v for k, v in game_registry.missing().items() if not args.games}
    for name, why in gone.items():
        print(f"skipping game {name}: {why}", file=sys.stderr)
    policy, env_kw = args.policy, {}
    if policy not in games_eval.BUILTIN:
        if policy in ("default", "local"):
            env_kw["observation"] = observation_for(args.model_dir or DEFAULT_MODEL_DIR)
        try:
            policy = make_actor(args)
        except Exception as e:
            return fail(str(e))
    bar = progress_bar(args.episodes * len(games), f"{args.policy} game episodes")
    try:
        trajs = games_eval.play(policy, games, args.episodes, split=args.split, envs=args.envs, env_kw=env_kw,
                                progress=lambda _t: bar.update(1))
    except (GameBrowserError, ValueError) as e:
        return fail(str(e))
    finally:
        bar.close()
    out = games_eval.summarize(trajs, games)
    out.update(suite="games", policy=args.policy, split=args.split, skipped=gone)
    if args.json:
        print(json.dumps(out))
        return 0
    print_scores(out)
    return 0


def print_scores(out: dict) -> None:
    def ci(v):
        return f"[{v[0]:.1f}, {v[1]:.1f}]" if v else "-"

    width = max([8] + [len(g) for g in out["games"]])
    print(f"{'game':<{width}} {'n':>4} {'score':>9} {'reference':>10} {'normalized':>11} {'95% interval':>16}")
    for g, r in out["games"].items():
        ref = f"{r['reference']:.1f}" if r["reference"] else "-"
        norm = f"{r['normalized']:.1f}" if r["normalized"] is not None else "no norm"
        print(f"{g:<{width}} {r['episodes']:>4} {r['score']:>9.1f} {ref:>10} {norm:>11} {ci(r['ci95']):>16}")
    if out["overall"] is not None:
        print(f"{'mean over games':<{width + 15}} {'':>10} {out['overall']:>11.1f} {ci(out['ci95']):>16}")
    if out["unnormed"]:
        print(f"no norm for {', '.join(out['unnormed'])}: run `python main.py sandbox games calibrate --games "
              f"{','.join(out['unnormed'])} --episodes 20`", file=sys.stderr)


def cmd_list(args) -> int:
    norms = game_registry.norms()
    rows = [{"game": g.name, "title": g.title, "kind": g.kind, "reads": g.reads, "keys": list(g.keys),
             "clicks": g.clicks, "step_ms": g.step_ms, "max_steps": g.max_steps, "norm": norms.get(g.name)}
            for g in game_registry.games().values()]
    missing = game_registry.missing()
    if args.json:
        print(json.dumps({"games": rows, "missing": missing}))
        return 0
    for r in rows:
        n = r["norm"]
        norm = f"reference {n['reference']:g}, random {n['random']:g}" if n else "no norm yet"
        print(f"{r['game']:<8} {r['kind']:<28} {norm}")
    for name, why in missing.items():
        print(f"{name:<8} not available: {why}")
    return 0


def cmd_calibrate(args) -> int:
    try:
        games = game_registry.parse_games(args.games)
        games_eval.tickets(games, args.episodes, "train")
    except ValueError as e:
        return fail(str(e))
    bar = progress_bar(2 * args.episodes * len(games), "calibration episodes")
    try:
        found = games_eval.calibrate(games, args.episodes, progress=lambda _t: bar.update(1), write=not args.dry_run)
    except (GameBrowserError, ValueError) as e:
        return fail(str(e))
    finally:
        bar.close()
    if args.json:
        print(json.dumps(found))
    else:
        print(f"{'game':<8} {'n':>4} {'reference':>10} {'95% interval':>18} {'random':>8} {'95% interval':>18} "
              f"{'random/ref':>10}")
        for g, r in found.items():
            a, b = r["reference_ci95"]
            c, d = r["random_ci95"]
            share = f"{100 * r['random'] / r['reference']:.0f}%" if r["reference"] else "-"
            print(f"{g:<8} {r['episodes']:>4} {r['reference']:>10.1f} {f'[{a:.1f}, {b:.1f}]':>18} {r['random']:>8.1f} "
                  f"{f'[{c:.1f}, {d:.1f}]':>18} {share:>10}")
    if not args.dry_run:
        print(f"wrote {', '.join(games)} into {game_registry.NORMS}", file=sys.stderr)
    return 0
