"""Rollouts: episodes of a policy in the sandbox, in-process or in worker processes.

`run_episode(actor, env, ...)` plays one episode the way the agent runs (the same prompt and
hierarchical memory as agent.policies, the model's raw text sent to the env) and returns a
`Trajectory`: per turn the messages the model saw, the tokens it generated and their log-probs
under the policy that generated them, the reward, and terminated / truncated kept apart.

`RolloutPool` runs worker processes (multiprocessing, spawn: each has its own Qt sandbox and its
own copy of the weights). The learner hands out episode tickets (a task seed) through one queue
and receives finished trajectories through another; weights are broadcast as a safetensors file
per policy version plus a shared version counter, and a worker loads the newest version before
each episode. Modes:
  - "async": the ticket queue is kept full, so workers never wait; the learner updates as soon
    as a batch of trajectories is in, while the workers keep playing with the weights they have.
    Data may be a few versions old: `staleness()` drops trajectories more than `max_staleness`
    versions behind and down-weights the rest by `staleness_decay ** lag`.
  - "sync": the learner issues exactly one batch of tickets per version and waits for all of
    them (the classic loop, where the slowest episode holds everyone up).
"""
from __future__ import annotations

import os
import queue as queue_mod
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from agent.executors.base import Frame
from agent.memory import Memory, MemoryStep
from agent.policies.base import build_prompt

MODES = ("async", "sync")


class RolloutError(RuntimeError):
    """A worker died or the pool was used wrongly; the message says which and why."""


# ---------------------------------------------------------------- data


@dataclass
class Turn:
    messages: list  # the chat the model saw (agent.memory's neutral form, images as Frames)
    response_ids: list[int]  # generated tokens (the end-of-turn token included)
    logprobs: list[float]  # their log-probs under the behaviour policy
    text: str
    reward: float = 0.0  # the env's reward for this turn (shaping is the learner's business)
    parse_error: str | None = None
    progress: float = 0.0  # the verifier's partial progress after this turn (0..1)
    point: tuple | None = None  # the turn's first click (start_box), normalized; None if none
    expert_point: tuple | None = None  # where the task's expert would have clicked in that state
    # did the turn's action change the screen (the env's info["screen_changed"])? None when no action
    # ran, the turn ended the episode, or the env does not say
    changed: bool | None = None


@dataclass
class Trajectory:
    seed: int
    family: str
    instruction: str
    turns: list[Turn] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    success: bool = False
    progress: float = 0.0
    start_progress: float = 0.0  # the verifier's progress before the first turn (some subgoals may hold already)
    version: int = 0  # the policy version that generated it
    worker: int = -1
    seconds: float = 0.0
    final_messages: list | None = None  # the next prompt, to bootstrap a truncated episode
    weight: float = 1.0  # set by the staleness rule
    slipped: list[int] = field(default_factory=list)  # demonstrations: turns that were injected mistakes

    @property
    def n_generated(self) -> int:
        return sum(len(t.response_ids) for t in self.turns)


# ---------------------------------------------------------------- one episode


def frame_of(obs) -> Frame:
    return Frame(geometry=obs["geometry"], pixels=obs["screenshot"])


def run_episode(actor, env, seed: int, *, family: str | None = None, memory_kw: dict | None = None,
                platform: str = "desktop", greedy: bool = False, version: int = 0, worker: int = -1,
                max_steps: int | None = None, end_on_parse_error: bool = False) -> Trajectory:
    """Play one episode; `actor.generate(messages, greedy=...)` gives (text, ids, logprobs).

    By default an output that does not parse is answered with feedback and the episode goes on,
    as in the agent; with end_on_parse_error it ends the episode there (terminated, failed), so
    an RL policy cannot buy extra attempts with unparseable outputs."""
    from agent.grammar import parse_normalized
    from agent.loop import reask_feedback

    t0 = time.perf_counter()
    obs, info = env.reset(seed=int(seed), options={"family": family} if family else None)
    traj = Trajectory(seed=int(seed), family=info["family"], instruction=info["instruction"], version=version,
                      worker=worker, start_progress=float(info.get("progress", 0.0)))
    memory = Memory(**(memory_kw or {}))
    prompt = build_prompt(info["instruction"], (platform,))
    limit = max_steps or info.get("max_steps") or 10
    feedback = None
    while True:
        frame = frame_of(obs)
        messages = memory.build_messages(prompt, frame, space=env.coords_space, feedback=feedback)
        gen = actor.generate(messages, greedy=greedy)
        ask = getattr(env, "expert_click", None)  # before the step: the state the reply answers
        expert = ask() if ask else None
        obs, reward, terminated, truncated, info = env.step(gen.text)
        error = info.get("parse_error") or info.get("action_error")
        traj.turns.append(Turn(messages, list(gen.ids), list(gen.logprobs), gen.text, float(reward), error,
                               float(info.get("progress", 0.0)), expert_point=expert,
                               changed=info.get("screen_changed")))
        if info.get("parse_error"):
            if end_on_parse_error:
                terminated = True
            feedback = reask_feedback(info["parse_error"])
        else:
            feedback = None
            w, h = frame.size
            parsed = parse_normalized(gen.text, env.coords_space, w, h)
            if parsed:
                memory.add(MemoryStep(parsed.thought, list(parsed.actions), frame))
                box = parsed.actions[0].args.get("start_box") if parsed.actions else None
                traj.turns[-1].point = tuple(box[:2]) if box else None
        if not (terminated or truncated) and len(traj.turns) >= limit:
            truncated = True
        if terminated or truncated:
            break
    traj.terminated, traj.truncated = bool(terminated), bool(truncated and not terminated)
    traj.success, traj.progress = bool(info.get("success")), float(info.get("progress", 0.0))
    if traj.truncated:  # a time-limit cut is bootstrapped from the value of the next state
        traj.final_messages = memory.build_messages(prompt, frame_of(obs), space=env.coords_space, feedback=feedback)
    traj.seconds = time.perf_counter() - t0
    return traj


# ---------------------------------------------------------------- staleness


def staleness(traj_version: int, learner_version: int, max_staleness: int, decay: float = 1.0) -> float | None:
    """The weight of data generated `learner_version - traj_version` versions ago: None (drop)
    beyond the bound, else decay**lag (1.0 with the default decay)."""
    lag = learner_version - traj_version
    if lag < 0:
        raise RolloutError(f"trajectory version {traj_version} is newer than the learner's {learner_version}")
    if lag > max_staleness:
        return None
    return float(decay) ** lag


# ---------------------------------------------------------------- weights


def weights_path(weights_dir, version: int) -> Path:
    return Path(weights_dir) / f"policy-v{version:06d}.safetensors"


def publish_weights(model, weights_dir, version: int, keep: int = 4) -> Path:
    """Write the model's weights for `version` atomically; remove versions older than `keep`."""
    from safetensors.torch import save_file

    path = weights_path(weights_dir, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(tmp))
    os.replace(tmp, path)
    for old in Path(weights_dir).glob("policy-v*.safetensors"):
        try:
            if int(old.stem.split("-v")[1]) < version - keep:
                old.unlink()
        except (ValueError, OSError):
            pass
    return path


# ---------------------------------------------------------------- worker processes


@dataclass
class WorkerSpec:
    model_dir: str  # the policy's architecture and processor (agent.vlm.load_vlm)
    weights_dir: str
    env_kw: dict = field(default_factory=dict)  # SandboxEnv(**env_kw)
    memory_kw: dict = field(default_factory=dict)
    actor_kw: dict = field(default_factory=dict)  # temperature, max_new_tokens
    threads: int = 1  # torch threads per worker
    # seconds added to every env step: a sandbox in a VM or a remote browser waits on its screen
    # this long per action, the regime asynchronous rollouts are built for (the benchmark's knob)
    env_latency_s: float = 0.0
    episode_kw: dict = field(default_factory=dict)  # more run_episode keywords (end_on_parse_error)
    # scheduling niceness of the workers (POSIX): the learner is the critical path of async
    # training, so where workers and learner share cores the workers take the cycles it leaves
    nice: int = 10


def _worker_main(rank: int, spec: WorkerSpec, version_value, tickets, results, stop_event) -> None:
    """A worker: take a ticket, load the newest weights, play the episode, send it back."""
    try:
        import torch

        torch.set_num_threads(spec.threads)
        if spec.nice > 0 and hasattr(os, "nice"):
            os.nice(spec.nice)
        from trainer.actor import VLMActor
        from trainer.sandbox.env import SandboxEnv

        actor = VLMActor.load(spec.model_dir, **spec.actor_kw)
        env = SandboxEnv(**spec.env_kw)
        if spec.env_latency_s > 0:
            env = _Delayed(env, spec.env_latency_s)
        results.put(("ready", rank))
        have = -1
        while not stop_event.is_set():
            try:
                ticket = tickets.get(timeout=0.2)
            except queue_mod.Empty:
                continue
            if ticket is None:
                break
            seed, family = ticket
            newest = version_value.value
            if newest != have:
                actor.load_weights(weights_path(spec.weights_dir, newest))
                have = newest
            traj = run_episode(actor, env, seed, family=family, memory_kw=spec.memory_kw, version=have, worker=rank,
                               **spec.episode_kw)
            results.put(("traj", traj))
        env.close()
    except BaseException:  # the learner must hear about it, not hang on an empty queue
        results.put(("error", f"worker {rank}: {traceback.format_exc()}"))


class _Delayed:
    """An env whose every step takes `latency` seconds longer, sleeping (no CPU), like a remote one."""

    def __init__(self, env, latency: float):
        self.env, self.latency = env, latency

    def step(self, action):
        time.sleep(self.latency)
        return self.env.step(action)

    def __getattr__(self, name):
        return getattr(self.env, name)


class RolloutPool:
    """Worker processes playing episodes for a learner. Use as a context manager."""

    def __init__(self, spec: WorkerSpec, n_workers: int = 2, *, mode: str = "async", max_staleness: int = 1,
                 staleness_decay: float = 1.0, seed_start: int = 0, families: list[str] | None = None,
                 prefetch: int = 2):
        import multiprocessing as mp

        if mode not in MODES:
            raise RolloutError(f"mode must be one of {MODES}, got {mode!r}")
        if n_workers < 1:
            raise RolloutError(f"n_workers must be at least 1, got {n_workers}")
        if max_staleness < 0 or not 0 < staleness_decay <= 1:
            raise RolloutError(f"need max_staleness >= 0 and 0 < staleness_decay <= 1, got {max_staleness}, {staleness_decay}")
        self.spec, self.n_workers, self.mode = spec, n_workers, mode
        self.max_staleness, self.staleness_decay = max_staleness, staleness_decay
        self.families = list(families) if families else None
        self.next_seed = int(seed_start)
        self.prefetch = prefetch
        self._ctx = mp.get_context("spawn")  # Qt and torch threads do not survive fork
        self.version = self._ctx.Value("i", 0)
        self.tickets = self._ctx.Queue()
        self.results = self._ctx.Queue()
        self.stop_event = self._ctx.Event()
        self.procs = []
        self.outstanding = 0  # tickets handed out whose trajectory has not come back
        self.stats = {"received": 0, "dropped": 0, "lags": []}
        self.ready: set[int] = set()  # workers that have loaded the model and the sandbox

    # -- life cycle
    def start(self, model) -> "RolloutPool":
        publish_weights(model, self.spec.weights_dir, 0)
        for rank in range(self.n_workers):
            p = self._ctx.Process(target=_worker_main, name=f"rollout-{rank}", daemon=True,
                                  args=(rank, self.spec, self.version, self.tickets, self.results, self.stop_event))
            p.start()
            self.procs.append(p)
        return self

    def close(self) -> None:
        self.stop_event.set()
        for _ in self.procs:
            self.tickets.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        self.procs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the learner's side
    def publish(self, model) -> int:
        """Broadcast new weights; returns the new policy version."""
        v = self.version.value + 1
        publish_weights(model, self.spec.weights_dir, v)
        self.version.value = v
        return v

    def set_mode(self, mode: str, timeout: float = 600.0) -> int:
        """Switch between async and sync with the same workers (a benchmark compares both in one
        run; tests start one pool): tickets already handed out are played to the end and their
        trajectories discarded, so the new mode starts clean. Returns how many were discarded."""
        if mode not in MODES:
            raise RolloutError(f"mode must be one of {MODES}, got {mode!r}")
        drained = 0
        while self.outstanding > 0:
            self._receive(timeout)
            drained += 1
        self.mode = mode
        return drained

    def _issue(self, n: int) -> None:
        for _ in range(n):
            fam = self.families[self.next_seed % len(self.families)] if self.families else None
            self.tickets.put((self.next_seed, fam))
            self.next_seed += 1
            self.outstanding += 1

    def wait_ready(self, timeout: float = 600.0) -> "RolloutPool":
        """Block until every worker has loaded the model and its sandbox (imports take seconds)."""
        deadline = time.monotonic() + timeout
        while len(self.ready) < self.n_workers:
            self._receive(max(0.0, deadline - time.monotonic()), until_ready=True)
        return self

    def _receive(self, timeout: float, until_ready: bool = False) -> Trajectory | None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                kind, payload = self.results.get(timeout=1.0)
                if kind == "ready":
                    self.ready.add(payload)
                    if until_ready:
                        return None
                    continue
                break
            except queue_mod.Empty:
                dead = [p.name for p in self.procs if not p.is_alive()]
                if dead:
                    raise RolloutError(f"rollout workers exited: {', '.join(dead)}") from None
                if time.monotonic() > deadline:
                    raise RolloutError(f"nothing from the rollout workers within {timeout:.0f} s") from None
        if kind == "error":
            raise RolloutError(payload)
        self.outstanding -= 1
        return payload

    def collect(self, batch_size: int, timeout: float = 600.0) -> list[Trajectory]:
        """The next `batch_size` usable trajectories for the learner's current version."""
        learner_version = self.version.value
        if self.mode == "sync":
            self._issue(batch_size)
        batch: list[Trajectory] = []
        while len(batch) < batch_size:
            if self.mode == "async":  # keep every worker busy, with a little queued work
                want = self.n_workers * self.prefetch + (batch_size - len(batch))
                self._issue(max(0, want - self.outstanding))
            traj = self._receive(timeout)
            self.stats["received"] += 1
            w = staleness(traj.version, learner_version, self.max_staleness, self.staleness_decay)
            if w is None:
                self.stats["dropped"] += 1
                if self.mode == "sync":  # cannot happen in sync mode, but never hang if it does
                    self._issue(1)
                continue
            traj.weight = w
            self.stats["lags"].append(learner_version - traj.version)
            batch.append(traj)
        return batch


# ---------------------------------------------------------------- in-process (evaluation, tests)


def evaluate(actor, families: list[str], seeds_per_family: int, *, env_kw: dict | None = None,
             memory_kw: dict | None = None, seed_start: int | None = None, progress=None) -> dict:
    """Greedy success rate per family on held-out seeds (the sandbox's held-out split)."""
    from trainer.sandbox.env import SandboxEnv
    from trainer.sandbox.task import HELDOUT_START

    start = HELDOUT_START if seed_start is None else seed_start
    env = SandboxEnv(**(env_kw or {}))
    out: dict = {"families": {}}
    try:
        for fam in families:
            wins, steps = 0, 0
            for k in range(seeds_per_family):
                traj = run_episode(actor, env, start + k, family=fam, memory_kw=memory_kw, greedy=True)
                wins += traj.success
                steps += len(traj.turns)
                if progress:
                    progress()
            out["families"][fam] = {"success": wins / seeds_per_family, "episodes": seeds_per_family,
                                    "mean_steps": steps / seeds_per_family}
    finally:
        env.close()
    rates = [v["success"] for v in out["families"].values()]
    out["mean_success"] = sum(rates) / len(rates) if rates else 0.0
    return out
