"""Rollouts for the learner: worker processes that play sandbox episodes, weights broadcast,
and the staleness rule.

Episodes are played by trainer.rollout.runner.EpisodeRunner (the one runner PPO, eval and the flywheel
share): per turn the messages the model saw, the tokens it generated and their log-probs under
the policy that generated them, the reward, and terminated / truncated kept apart.

`RolloutPool` runs worker processes (multiprocessing, spawn: each has its own Qt sandbox and its
own copy of the weights). Each worker steps `WorkerSpec.n_envs` sandbox environments together and
asks its policy copy for all their replies in one batched generation; a slot whose episode ends
takes the next ticket at once. The learner hands out episode tickets (a task seed) through one
queue and receives finished trajectories through another; weights are broadcast as a safetensors
file per policy version plus a shared version counter, and a worker loads the newest version
between two batched generations, so an episode may span versions: every token keeps the
log-prob of the policy that sampled it (the learner corrects for that, trainer.learn.ppo), and a
trajectory's version is the oldest of its turns. Modes:
  - "async": the ticket queue is kept full, so workers never wait; the learner updates as soon
    as a batch of trajectories is in, while the workers keep playing with the weights they have.
    Data may be a few versions old: `staleness()` drops trajectories more than `max_staleness`
    versions behind and down-weights the rest by `staleness_decay ** lag`.
  - "sync": the learner issues exactly one batch of tickets per version and waits for all of
    them (the classic loop, where the slowest episode holds everyone up).

Both pools (this one and trainer.rollout.ray_pool.RayRolloutPool) are a `RolloutSource`, the PPO loop's
one view of a rollout engine; they hand out tickets through one `Tickets` and judge what comes back
by one `OffPolicy`. A worker is made from a frozen `WorkerSpec` of typed specs (trainer.rollout.specs), and
sends each trajectory without its chats (Trajectory.drop_messages): its turns carry the prompt ids
the actor generated from, its screenshots travel once each, and the learner reads those.
"""
from __future__ import annotations

import os
import queue as queue_mod
import sys
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

from agent.threads import ENV, choose_threads
from trainer.errors import TrainerError
from trainer.learn.lora import plain_state_dict
from trainer.rollout.actors import VLMActor
from trainer.rollout.runner import EpisodeRunner, Trajectory, Turn, frame_of  # noqa: F401  (re-exported)
from trainer.rollout.specs import ActorSpec, EnvSpec, EpisodeSpec, MemorySpec
from trainer.sandbox.env_process import make_envs

MODES = ("async", "sync")
INFERENCE = ("own", "shared")


@runtime_checkable
class RolloutSource(Protocol):
    """What the PPO loop (trainer.learn.ppo.train_ppo) asks of a rollout engine: RolloutPool (worker
    processes) and trainer.rollout.ray_pool.RayRolloutPool (Ray actors) both are one. `stats` holds
    OffPolicy's counts ("received", "dropped", "lags") and whatever the engine adds."""

    stats: dict

    def start(self, model) -> RolloutSource:
        """Publish `model` as version 0 and start the workers; returns self."""
        ...

    def collect(self, batch_size: int, timeout: float = 600.0) -> list[Trajectory]:
        """The next `batch_size` trajectories the staleness rule admits for the current version,
        each with its weight set."""
        ...

    def publish(self, model) -> int:
        """Broadcast new weights (a model or its state dict); returns the new policy version."""
        ...

    def close(self) -> None:
        ...


class RolloutError(TrainerError, RuntimeError):
    """A worker died or the pool was used wrongly; the message says which and why."""


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


class OffPolicy:
    """The staleness rule as both pools apply it to what comes back, and its counts: `admit` weighs
    a trajectory for the learner's version (True: use it, its weight set) or drops it."""

    def __init__(self, max_staleness: int, decay: float = 1.0):
        self.max_staleness, self.decay = max_staleness, decay
        self.stats: dict = {"received": 0, "dropped": 0, "lags": []}

    def admit(self, traj: Trajectory, learner_version: int) -> bool:
        self.stats["received"] += 1
        w = staleness(traj.version, learner_version, self.max_staleness, self.decay)
        if w is None:
            self.stats["dropped"] += 1
            return False
        traj.weight = w
        self.stats["lags"].append(learner_version - traj.version)
        return True


class Tickets:
    """Episode tickets (seed, family or None) in seed order from `seed_start`, families in turn."""

    def __init__(self, seed_start: int = 0, families: list[str] | None = None):
        self.next_seed, self.families = int(seed_start), list(families) if families else None

    def take(self, n: int) -> list[tuple[int, str | None]]:
        out = []
        for _ in range(n):
            fam = self.families[self.next_seed % len(self.families)] if self.families else None
            out.append((self.next_seed, fam))
            self.next_seed += 1
        return out


def check_pool(mode: str, n_workers: int, max_staleness: int, staleness_decay: float) -> None:
    """Raise RolloutError naming the first setting a rollout pool (local or Ray) cannot use."""
    if mode not in MODES:
        raise RolloutError(f"mode must be one of {MODES}, got {mode!r}")
    if n_workers < 1:
        raise RolloutError(f"n_workers must be at least 1, got {n_workers}")
    if max_staleness < 0 or not 0 < staleness_decay <= 1:
        raise RolloutError(f"need max_staleness >= 0 and 0 < staleness_decay <= 1, got {max_staleness}, {staleness_decay}")


# ---------------------------------------------------------------- weights


def weights_path(weights_dir, version: int) -> Path:
    return Path(weights_dir) / f"policy-v{version:06d}.safetensors"


def publish_weights(model, weights_dir, version: int, keep: int = 4) -> Path:
    """Write the model's weights (or a state dict, e.g. gathered from FSDP2 shards) for `version`
    atomically; remove versions older than `keep`."""
    from safetensors.torch import save_file

    path = weights_path(weights_dir, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")

    state = model if isinstance(model, dict) else plain_state_dict(model)  # with LoRA: the adapters merged in
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp))
    os.replace(tmp, path)
    for old in Path(weights_dir).glob("policy-v*.safetensors"):
        try:
            if int(old.stem.split("-v")[1]) < version - keep:
                old.unlink()
        except (ValueError, OSError):
            pass
    return path


# ---------------------------------------------------------------- worker processes


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a rollout worker is made from; frozen and picklable (it goes to a spawned process
    or a Ray actor as it is)."""
    model_dir: str  # the policy's architecture and processor (agent.vlm.model.load_vlm)
    weights_dir: str
    env: EnvSpec = field(default_factory=EnvSpec)
    memory: MemorySpec = field(default_factory=MemorySpec)
    actor: ActorSpec = field(default_factory=ActorSpec)
    episode: EpisodeSpec = field(default_factory=EpisodeSpec)
    # torch threads per worker; None: the cores other work leaves free divided among the workers
    # (less the learner's threads in async mode, where it trains beside them): resolve_threads
    threads: int | None = None
    # seconds added to every env step: a sandbox in a VM or a remote browser waits on its screen
    # this long per action, the regime asynchronous rollouts are built for (the benchmark's knob)
    env_latency_s: float = 0.0
    n_envs: int = 1  # environments per worker, stepped together with one batched generation per round
    # Ray engine only: "own" (each rollout actor generates with its own policy copy) or "shared" (one
    # inference actor holds the policy and answers every rollout actor's batched generations)
    inference: str = "own"
    inference_gpus: float = 0.0  # GPUs the shared inference actor asks Ray for (0: it runs on a CPU)
    # scheduling niceness of the workers (POSIX): the learner is the critical path of async
    # training, so where workers and learner share cores the workers take the cycles it leaves
    nice: int = 10

    def __post_init__(self):
        for name, kind in (("env", EnvSpec), ("memory", MemorySpec), ("actor", ActorSpec), ("episode", EpisodeSpec)):
            if not isinstance(getattr(self, name), kind):
                raise RolloutError(f"WorkerSpec.{name} must be a trainer.rollout.specs.{kind.__name__}, "
                                   f"got {type(getattr(self, name)).__name__}")
        if (self.threads is not None and self.threads < 1) or self.n_envs < 1:
            raise RolloutError(f"WorkerSpec.threads and .n_envs must be at least 1, got {self.threads}, {self.n_envs}")
        if self.env_latency_s < 0:
            raise RolloutError(f"WorkerSpec.env_latency_s must be >= 0, got {self.env_latency_s}")
        if self.inference not in INFERENCE:
            raise RolloutError(f"WorkerSpec.inference must be one of {INFERENCE}, got {self.inference!r}")
        if self.inference_gpus < 0:
            raise RolloutError(f"WorkerSpec.inference_gpus must be >= 0, got {self.inference_gpus}")


def _worker_main(rank: int, spec: WorkerSpec, version_value, tickets, results, stop_event) -> None:
    """A worker: `spec.n_envs` envs played together by one EpisodeRunner; tickets taken while a
    slot is free, the newest weights loaded between batched generations, each finished episode
    sent back at once."""
    try:
        import torch

        torch.set_num_threads(spec.threads)
        if spec.nice > 0 and hasattr(os, "nice"):
            os.nice(spec.nice)

        parent = os.getppid()
        actor = VLMActor.load(spec.model_dir, **spec.actor.kwargs())
        envs = make_envs(spec.n_envs, **spec.env.kwargs())
        if spec.env_latency_s > 0:
            envs = [_Delayed(env, spec.env_latency_s) for env in envs]
        results.put(("ready", rank))
        runner = EpisodeRunner(actor, envs, memory_kw=spec.memory.kwargs(), worker=rank, version=-1,
                               **spec.episode.kwargs())

        def load_newest() -> None:
            newest = version_value.value
            if newest != runner.version:
                actor.load_weights(weights_path(spec.weights_dir, newest))
                runner.version = newest

        closing = []

        def next_ticket(block: bool):
            while not stop_event.is_set() and not closing and os.getppid() == parent:  # an orphan stops
                try:
                    ticket = tickets.get(timeout=0.2) if block else tickets.get_nowait()
                except queue_mod.Empty:
                    if not block:
                        return None
                    continue
                if ticket is None:  # the pool is closing
                    closing.append(True)
                    return None
                load_newest()  # an episode starts with the newest weights
                return ticket
            return None

        runner.before_round = load_newest
        for traj in runner.run(next_ticket):
            results.put(("traj", traj.drop_messages()))  # the learner reads the carried ids, not the chats
            if stop_event.is_set() or closing:
                break
        for env in envs:
            env.close()
    except BaseException:  # the learner must hear about it, not hang on an empty queue
        results.put(("error", f"worker {rank}: {traceback.format_exc()}"))


def resolve_threads(spec: WorkerSpec, n_workers: int, mode: str, *, cores: int | None = None,
                    busy: float | None = None) -> WorkerSpec:
    """`spec` with its torch threads per worker decided: as given, else TANDEM_THREADS, else the free
    cores (agent.threads) split among the `n_workers` workers, so that workers x threads never
    exceed the free cores (each still gets at least 1). In async mode the learner trains beside the
    workers, so its own torch threads are taken off first; in sync mode it waits while they play.
    Says what it chose on stderr."""
    if spec.threads is not None:
        return spec
    import torch  # as the workers do: this module's import stays light

    reserved = torch.get_num_threads() if mode == "async" else 0
    choice = choose_threads(workers=n_workers, reserved=reserved, cores=cores, busy=busy, flag=ENV)
    aside = f", the learner's {reserved} set aside" if reserved and choice.source == "auto" else ""
    print(choice.line("rollout workers' torch threads") + aside, file=sys.stderr)
    return replace(spec, threads=choice.threads)


class _Delayed:
    """An env whose every step takes `latency` seconds longer, sleeping (no CPU), like a remote one;
    steps sent together (send_step) wait out their latency together, as remote envs would."""

    def __init__(self, env, latency: float):
        self.env, self.latency = env, latency
        self._sent = None

    def step(self, action):
        time.sleep(self.latency)
        return self.env.step(action)

    def send_step(self, action) -> None:
        self._sent = time.monotonic()
        self.env.send_step(action)

    def recv_step(self):
        time.sleep(max(0.0, self._sent + self.latency - time.monotonic()))
        return self.env.recv_step()

    def __getattr__(self, name):
        return getattr(self.env, name)


class RolloutPool:
    """Worker processes playing episodes for a learner. Use as a context manager."""

    def __init__(self, spec: WorkerSpec, n_workers: int = 2, *, mode: str = "async", max_staleness: int = 1,
                 staleness_decay: float = 1.0, seed_start: int = 0, families: list[str] | None = None,
                 prefetch: int = 2):
        import multiprocessing as mp

        check_pool(mode, n_workers, max_staleness, staleness_decay)
        self.spec, self.n_workers, self.mode = resolve_threads(spec, n_workers, mode), n_workers, mode
        self.offpolicy = OffPolicy(max_staleness, staleness_decay)
        self.tickets_out = Tickets(seed_start, families)
        self.prefetch = prefetch
        self._ctx = mp.get_context("spawn")  # Qt and torch threads do not survive fork
        self.version = self._ctx.Value("i", 0)
        self.tickets = self._ctx.Queue()
        self.results = self._ctx.Queue()
        self.stop_event = self._ctx.Event()
        self.procs = []
        self.outstanding = 0  # tickets handed out whose trajectory has not come back
        self.stats = self.offpolicy.stats
        self.ready: set[int] = set()  # workers that have loaded the model and the sandbox

    # -- life cycle
    def start(self, model) -> RolloutPool:
        publish_weights(model, self.spec.weights_dir, 0)
        for rank in range(self.n_workers):
            # not daemonic: a worker's environments are processes of its own (trainer.sandbox.env_process);
            # close() ends the workers, and a worker whose learner died stops by itself
            p = self._ctx.Process(target=_worker_main, name=f"rollout-{rank}", daemon=False,
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
        """Broadcast new weights (a model or its state dict); returns the new policy version."""
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
        for ticket in self.tickets_out.take(n):
            self.tickets.put(ticket)
            self.outstanding += 1

    def wait_ready(self, timeout: float = 600.0) -> RolloutPool:
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
                want = self.n_workers * (self.spec.n_envs + self.prefetch - 1) + (batch_size - len(batch))
                self._issue(max(0, want - self.outstanding))
            traj = self._receive(timeout)
            if self.offpolicy.admit(traj, learner_version):
                batch.append(traj)
            elif self.mode == "sync":  # cannot happen in sync mode, but never hang if it does
                self._issue(1)
        return batch
