"""Ray as the rollout engine (`train ppo --engine ray`): rollout workers are Ray actors, on this
machine or across a cluster (`ray start --head` on one machine, `ray start --address HEAD:6379`
on the others, then `--ray-address auto` or `HEAD:6379`).

`RayRolloutPool` is a trainer.rollout.pool.RolloutSource (start, collect, publish, stats, close), as
the local RolloutPool is, over Ray: each actor owns `spec.n_envs` sandbox environments played together by one
EpisodeRunner (one batched generation per round) and either its own policy copy
(trainer.rollout.actors.VLMActor; `spec.inference` "own") or a handle on one shared inference actor
("shared": the rollout actors only step sandboxes, on CPU machines, while one policy copy,
on a GPU when `spec.inference_gpus` asks Ray for one, answers their requests, those waiting at
each generation batched together). The learner puts every new version's weights into Ray's object store once (`ray.put`); an
actor fetches them at the start of its next call, so weights cross the network once per actor
and version; the shared inference actor is loaded at publish time, before new tickets go out. The unit of work is one call: a list of tickets (seed, family) played to the end with
the weights of one version, whose trajectories come back together.
  - "async": every actor always has a call in flight; the learner takes trajectories as calls
    finish and gives that actor new tickets with the newest weights at once. Trajectories are
    judged by the same staleness rule as the local pool (trainer.rollout.pool.OffPolicy); any beyond
    the batch wait for the next one.
  - "sync": one call per actor with the batch's tickets, all waited for.
Ray is imported only here, when the engine is asked for: the rest of Tandem runs without it.
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from trainer.learn.lora import plain_state_dict
from trainer.rollout.actors import Actor, VLMActor
from trainer.rollout.pool import OffPolicy, RolloutError, Tickets, WorkerSpec, check_pool, resolve_threads
from trainer.rollout.runner import EpisodeRunner, Trajectory
from trainer.sandbox.env_process import make_envs

ROOT = Path(__file__).resolve().parents[2]


class _Inference:
    """The body of the shared inference actor (`inference="shared"`): the one policy copy, on a
    GPU where Ray gives it one. An async Ray actor: the rollout actors' requests queue up, and
    each generation answers all that are waiting as one batch (their chats concatenated, the
    replies split back), after waiting up to GATHER_S for every rollout actor to have asked, so
    N actors of E envs share generations of up to N x E rows. Weights change only between
    generations."""

    GATHER_S = 0.05

    def __init__(self, spec: WorkerSpec, n_callers: int = 1):
        import asyncio
        from concurrent.futures import ThreadPoolExecutor

        import torch

        torch.set_num_threads(spec.threads)
        device = "cuda" if spec.inference_gpus and torch.cuda.is_available() else "cpu"
        self.actor = VLMActor.load(spec.model_dir, device=device, **spec.actor.kwargs())
        self.version = -1
        self.n_callers = max(1, n_callers)
        self.pending: list = []  # (chats, greedy, future)
        self.busy = asyncio.Lock()  # held by a generation or a weight load: never both at once
        self.torch_thread = ThreadPoolExecutor(1)  # the model runs here, off the event loop
        self.drainer = None
        self.counts = {"requests": 0, "generations": 0, "rows": 0}

    async def load(self, version: int, weights: list) -> int:
        import asyncio

        if version != self.version:
            state = await weights[0]
            async with self.busy:
                await asyncio.get_running_loop().run_in_executor(
                    self.torch_thread, self.actor.load_state, state, f"weights of version {version}")
                self.version = version
        return self.version

    async def generate_batch(self, chats, greedy: bool = False, slots=None):
        import asyncio

        fut = asyncio.get_running_loop().create_future()
        slots = list(slots) if slots is not None else [None] * len(chats)  # None: nothing kept for that row
        self.pending.append((list(chats), bool(greedy), fut, slots))
        self.counts["requests"] += 1
        if self.drainer is None or self.drainer.done():
            self.drainer = asyncio.ensure_future(self._drain())
        return await fut

    async def generate(self, messages, greedy: bool = False):
        return (await self.generate_batch([messages], greedy))[0]

    async def model_extent(self, width: int, height: int):
        return self.actor.model_extent(width, height)

    async def stats(self) -> dict:
        return dict(self.counts)

    async def _drain(self) -> None:
        import asyncio
        import functools

        loop = asyncio.get_running_loop()
        while self.pending:
            deadline = loop.time() + self.GATHER_S
            while len(self.pending) < self.n_callers and loop.time() < deadline:
                await asyncio.sleep(0.002)
            batch, self.pending = self.pending, []
            for greedy in sorted({g for _, g, _, _ in batch}):
                group = [(chats, fut, slots) for chats, g, fut, slots in batch if g == greedy]
                rows = [chat for chats, _, _ in group for chat in chats]
                keys = [k for _, _, slots in group for k in slots]
                try:
                    async with self.busy:
                        outs = await loop.run_in_executor(self.torch_thread, functools.partial(
                            self.actor.generate_batch, rows, greedy=greedy, slots=keys))
                except Exception as e:  # every waiting rollout actor hears it
                    for _, fut, _ in group:
                        fut.set_exception(e)
                    continue
                self.counts["generations"] += 1
                self.counts["rows"] += len(rows)
                k = 0
                for chats, fut, _ in group:
                    fut.set_result(outs[k:k + len(chats)])
                    k += len(chats)


class _RemotePolicy(Actor):
    """trainer.rollout.actors's interface over the shared inference actor: a rollout actor's EpisodeRunner
    plays its envs with it as with a local copy."""

    def __init__(self, handle):
        self.handle = handle
        self._extents: dict = {}

    def generate_batch(self, chats, *, greedy: bool = False, slots: list | None = None):
        import ray

        return ray.get(self.handle.generate_batch.remote(chats, greedy, slots))

    def model_extent(self, width: int, height: int):
        import ray

        if (width, height) not in self._extents:  # the processor's size, asked once per screen size
            self._extents[width, height] = ray.get(self.handle.model_extent.remote(width, height))
        return self._extents[width, height]

    def generate(self, messages, *, greedy: bool = False):
        import ray

        return ray.get(self.handle.generate.remote(messages, greedy))


class _Worker:
    """The body of a rollout actor (wrapped by ray.remote in RayRolloutPool.start); `inference`:
    the shared inference actor's handle, or None for a policy copy of its own."""

    def __init__(self, rank: int, spec: WorkerSpec, inference=None):
        import torch

        torch.set_num_threads(spec.threads)
        self.shared = inference is not None
        self.actor = _RemotePolicy(inference) if self.shared else VLMActor.load(spec.model_dir, **spec.actor.kwargs())
        self.envs = make_envs(spec.n_envs, **spec.env.kwargs())
        self.runner = EpisodeRunner(self.actor, self.envs, memory_kw=spec.memory.kwargs(), worker=rank, version=-1,
                                    **spec.episode.kwargs())

    def play(self, tickets: list, version: int, weights: list) -> list[Trajectory]:
        """Play `tickets` with the weights of `version` (weights: [ObjectRef], fetched only when the
        version changed: a bare ref would be fetched by Ray on every call). With a shared inference
        actor the learner has loaded that version into it before handing out the tickets."""
        if version != self.runner.version:
            if not self.shared:
                import ray

                self.actor.load_state(ray.get(weights[0]), f"weights of version {version}")
            self.runner.version = version
        # the learner reads the carried ids, not the chats: each screenshot crosses the network once
        return [t.drop_messages() for t in self.runner.run_all(tickets)]

    def close(self) -> None:
        for env in self.envs:
            env.close()


class RayRolloutPool:
    """Rollout workers as Ray actors; see the module doc. Use as a context manager."""

    def __init__(self, spec: WorkerSpec, n_workers: int = 2, *, mode: str = "async", max_staleness: int = 1,
                 staleness_decay: float = 1.0, seed_start: int = 0, families: list[str] | None = None,
                 address: str | None = None):
        check_pool(mode, n_workers, max_staleness, staleness_decay)
        if address and spec.threads is None:  # actors on other machines, whose free cores this one cannot see
            spec = replace(spec, threads=1)
        # a local Ray: the free cores divided among the actors (the shared inference actor is one more)
        spec = resolve_threads(spec, n_workers + (spec.inference == "shared"), mode)
        self.spec, self.n_workers, self.mode, self.address = spec, n_workers, mode, address
        self.offpolicy = OffPolicy(max_staleness, staleness_decay)
        self.tickets_out = Tickets(seed_start, families)
        self.version = 0
        self.workers: list = []
        self.inference = None  # the shared inference actor (spec.inference "shared")
        self.inflight: dict = {}  # ObjectRef of a play call -> worker index
        self.spare: list = []  # trajectories that came back beyond a batch
        self.stats = self.offpolicy.stats
        self._weights = None
        self._started_ray = False

    # -- life cycle
    def start(self, model) -> RayRolloutPool:
        import ray

        if not ray.is_initialized():
            _check_reachable(self.address)
            env = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
                   "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "offscreen")}
            actors = self.n_workers + (self.spec.inference == "shared")
            kw = {} if self.address else {"num_cpus": max(os.cpu_count() or 1, actors * self.spec.threads)}
            try:
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                         runtime_env={"env_vars": env}, **kw)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise RolloutError(f"could not start or reach Ray at {self.address or 'a new local instance'}: {e}") from e
            self._started_ray = True
        actor_cls = ray.remote(num_cpus=self.spec.threads)(_Worker)
        self._weights = ray.put(_state(model))
        if self.spec.inference == "shared":
            infer_cls = ray.remote(num_cpus=self.spec.threads, num_gpus=self.spec.inference_gpus)(_Inference)
            self.inference = infer_cls.remote(self.spec, self.n_workers)
            self._load_inference()
        self.workers = [actor_cls.remote(rank, self.spec, self.inference) for rank in range(self.n_workers)]
        return self

    def _load_inference(self, timeout: float = 600.0) -> None:
        """The current version into the shared inference actor, waited for: calls from the rollout
        actors are not ordered after the learner's, so tickets go out only once it holds it."""
        import ray

        try:
            ray.get(self.inference.load.remote(self.version, [self._weights]), timeout=timeout)
        except ray.exceptions.RayError as e:
            raise RolloutError(f"the shared inference actor failed: {e}") from e

    def close(self) -> None:
        import ray

        for w in self.workers:
            try:
                ray.get(w.close.remote(), timeout=30)
            except Exception:  # a dead actor has nothing left to close
                pass
            ray.kill(w)
        if self.inference is not None:
            ray.kill(self.inference)
        self.workers, self.inflight, self.inference = [], {}, None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the learner's side
    def publish(self, model) -> int:
        """Put new weights into the object store; returns the new policy version."""
        import ray

        self._weights = ray.put(_state(model))
        self.version += 1
        if self.inference is not None:
            self._load_inference()
            c = ray.get(self.inference.stats.remote())
            # how many rollout actors' requests each generation answered, and its rows
            self.stats["requests_per_generation"] = c["requests"] / max(1, c["generations"])
            self.stats["rows_per_generation"] = c["rows"] / max(1, c["generations"])
        return self.version

    def _play(self, k: int, n: int) -> None:
        ref = self.workers[k].play.remote(self.tickets_out.take(n), self.version, [self._weights])
        self.inflight[ref] = k

    def _wait(self, timeout: float) -> tuple[int, list[Trajectory]]:
        """The trajectories of the next finished call."""
        import ray

        ready, _ = ray.wait(list(self.inflight), num_returns=1, timeout=timeout)
        if not ready:
            raise RolloutError(f"nothing from the Ray rollout actors within {timeout:.0f} s")
        k = self.inflight.pop(ready[0])
        try:
            return k, ray.get(ready[0])
        except ray.exceptions.RayError as e:
            raise RolloutError(f"Ray rollout actor {k} failed: {e}") from e

    def collect(self, batch_size: int, timeout: float = 600.0) -> list[Trajectory]:
        """The next `batch_size` usable trajectories for the learner's current version."""
        learner_version = self.version
        pending, self.spare = self.spare, []
        if self.mode == "sync":  # the batch's tickets shared out, one call per actor
            per = -(-batch_size // self.n_workers)
            for k in range(self.n_workers):
                if batch_size > k * per:
                    self._play(k, min(per, batch_size - k * per))
        batch: list[Trajectory] = []
        while len(batch) < batch_size:
            if self.mode == "async":  # every actor busy with a call of n_envs tickets
                for k in set(range(self.n_workers)) - set(self.inflight.values()):
                    self._play(k, self.spec.n_envs)
            elif not pending and not self.inflight:  # cannot happen in sync mode, but never hang if it does
                self._play(0, batch_size - len(batch))
            if not pending:
                _, pending = self._wait(timeout)
            traj = pending.pop(0)
            if self.offpolicy.admit(traj, learner_version):
                batch.append(traj)
        self.spare = pending
        return batch


def _check_reachable(address: str | None, timeout: float = 5.0) -> None:
    """Raise RolloutError when a HOST:PORT address has nothing listening (Ray itself would retry
    for minutes); "auto", ray:// addresses and None are left to Ray."""
    import socket

    if not address or address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return
    except ValueError:
        raise RolloutError(f"--ray-address {address!r} is not HOST:PORT, auto or ray://...") from None
    except OSError as e:
        raise RolloutError(f"nothing answers at --ray-address {address} ({e}); start the cluster with "
                           "`ray start --head` there first") from None


def _state(model) -> dict:
    """A model's weights for the actors (a state dict passes as it is)."""
    return model if isinstance(model, dict) else plain_state_dict(model)  # with LoRA: the adapters merged in
