"""MiniWoB++ as an evaluation suite: tasks played by the one episode runner (trainer.rollout.runner),
success per task and overall with Wilson 95% intervals (trainer.stats).

    trajs = play("oracle", ["click-test", "enter-text"], episodes=10)
    summary = evaluate_miniwob(actor, DEFAULT_TASKS, episodes_per_task=5)

`sandbox eval --suite miniwob` and the flywheel's evaluation use it. MiniWoB++ is an external test
of transfer: its episodes are measured and reported beside the sandbox's, never stored as
training data and never part of a promotion decision.

Policies: "oracle" (the DOM oracle, trainer.sandbox.miniwob_oracle: it checks the adapter),
"random" (trainer.rollout.actors.RandomActor) or any actor (a model). The built-in two play in one
browser; an actor plays in `envs` browsers at once, its replies generated in one batch per round.
Seeds are 0, 1, ... within each task, so every policy meets the same episodes.
"""
from __future__ import annotations

from collections.abc import Callable

from trainer.rollout.actors import ExpertActor, RandomActor
from trainer.rollout.runner import EpisodeRunner, summarize
from trainer.sandbox.miniwob_env import PREFIX, MiniWoBEnv, task_of
from trainer.sandbox.miniwob_oracle import ORACLES

DEFAULT_TASKS = ("click-test", "click-button", "click-link", "focus-text", "enter-text", "click-checkboxes")
BUILTIN = ("oracle", "random")


def parse_tasks(text: str | None) -> list[str]:
    """'click-test,click-button' -> the task names (checked); None or '' -> DEFAULT_TASKS."""
    if not text:
        return list(DEFAULT_TASKS)
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError(f"--tasks names no task: {text!r}")
    tasks = [task_of(n) for n in names]
    dup = sorted({t for t in tasks if tasks.count(t) > 1})
    if dup:
        raise ValueError(f"--tasks names {', '.join(dup)} more than once")
    return tasks


def tickets(tasks: list[str], episodes: int) -> list[tuple[int, str]]:
    """`episodes` (seed, family) tickets spread evenly over the tasks (the first tasks get one more
    when it does not divide), grouped by task, seeds 0, 1, ... within each."""
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    if not tasks:
        raise ValueError("no MiniWoB++ tasks to play")
    out = []
    for i, task in enumerate(tasks):
        n = episodes // len(tasks) + (i < episodes % len(tasks))
        out += [(k, PREFIX + task) for k in range(n)]
    return out


def play(policy, tasks: list[str], episodes: int, *, envs: int = 1, env_kw: dict | None = None, trace: bool = False,
         progress: Callable | None = None, seed: int = 0) -> list:
    """Trajectories of `policy` ("oracle", "random" or an actor) over `episodes` episodes of
    `tasks`, in ticket order; greedy replies. env_kw go to MiniWoBEnv (max_steps, episode_seconds,
    timeouts). progress(trajectory) after each episode."""
    if isinstance(policy, str) and policy not in BUILTIN:
        raise ValueError(f"policy must be one of {BUILTIN} or an actor, got {policy!r}")
    if policy == "oracle":
        unknown = [t for t in tasks if t not in ORACLES]
        if unknown:
            raise ValueError(f"the oracle does not know {', '.join(unknown)}; it knows {', '.join(sorted(ORACLES))}")
    todo = tickets(tasks, episodes)
    n = 1 if isinstance(policy, str) else max(1, min(int(envs), len(tasks), len(todo)))
    made = []
    try:
        for _ in range(n):
            made.append(MiniWoBEnv(tasks, **(env_kw or {})))
        if policy == "oracle":
            actor = ExpertActor(made[0])
        elif policy == "random":
            actor = RandomActor(made[0], seed=seed)
        else:
            actor = policy
        runner = EpisodeRunner(actor, made, greedy=True, platform="desktop", trace=trace)
        return runner.run_all(todo, progress)
    finally:
        for env in made:
            env.close()


def evaluate_miniwob(actor, tasks=DEFAULT_TASKS, episodes_per_task: int = 5, *, envs: int = 2,
                     env_kw: dict | None = None, progress: Callable | None = None) -> dict:
    """Greedy episodes of `actor` on the same seeds of each task: trainer.rollout.runner.summarize's
    numbers per task ("families") and overall, plus the tasks and the episode clock used."""
    if episodes_per_task < 1:
        raise ValueError(f"episodes_per_task must be at least 1, got {episodes_per_task}")
    tasks = [task_of(t) for t in tasks]
    trajs = play(actor, tasks, episodes_per_task * len(tasks), envs=envs, env_kw=env_kw, progress=progress)
    out = summarize(trajs, [PREFIX + t for t in tasks])
    out["tasks"] = tasks
    out["episode_seconds"] = (env_kw or {}).get("episode_seconds")  # None: each task's own clock
    return out
