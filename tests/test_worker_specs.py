"""The rollout contracts: typed worker specs (trainer.rollout.specs, trainer.rollout.pool.WorkerSpec) check
themselves by field name and survive pickling as they are; both rollout pools are RolloutSources
and share one staleness bookkeeping (OffPolicy) and one ticket order (Tickets)."""
from __future__ import annotations

import pickle

import pytest


def test_specs_name_the_bad_field():
    from trainer.rollout.pool import RolloutError, WorkerSpec
    from trainer.rollout.specs import ActorSpec, EnvSpec, MemorySpec, SpecError

    for bad, field in ((lambda: EnvSpec(observation="smell"), "EnvSpec.observation"),
                       (lambda: EnvSpec(width=0), "EnvSpec.width"),
                       (lambda: EnvSpec(split="test"), "EnvSpec.split"),
                       (lambda: EnvSpec(max_steps=0), "EnvSpec.max_steps"),
                       (lambda: ActorSpec(temperature=0.0), "ActorSpec.temperature"),
                       (lambda: ActorSpec(max_new_tokens=0), "ActorSpec.max_new_tokens"),
                       (lambda: MemorySpec(history_view="all"), "MemorySpec.history_view"),
                       (lambda: MemorySpec(working_steps=-1), "MemorySpec.working_steps")):
        with pytest.raises(SpecError, match=field.replace(".", r"\.")):
            bad()
    with pytest.raises(RolloutError, match=r"WorkerSpec\.env must be a trainer\.rollout\.specs\.EnvSpec, got dict"):
        WorkerSpec("m", "w", env={"width": 224})  # the old keyword dict is refused, not half-used
    with pytest.raises(RolloutError, match=r"WorkerSpec\.inference"):
        WorkerSpec("m", "w", inference="remote")
    with pytest.raises(RolloutError, match=r"WorkerSpec\.threads and \.n_envs"):
        WorkerSpec("m", "w", n_envs=0)


def test_a_worker_spec_round_trips_through_pickle_and_builds_what_it_names():
    from agent.policies.memory import Memory
    from trainer.rollout.pool import WorkerSpec
    from trainer.rollout.specs import ActorSpec, EnvSpec, EpisodeSpec, MemorySpec
    from trainer.sandbox.env import SandboxEnv

    spec = WorkerSpec("m", "w", env=EnvSpec(width=224, height=168, families=["radio"], max_steps=2, observation="pixels"),
                      memory=MemorySpec(working_steps=2), actor=ActorSpec(temperature=0.7, max_new_tokens=9, inference_dtype="bf16"),
                      episode=EpisodeSpec(end_on_parse_error=True), n_envs=3)
    back = pickle.loads(pickle.dumps(spec))
    assert back == spec and hash(back.env) == hash(spec.env)  # frozen all the way down
    with pytest.raises(AttributeError):
        back.env.width = 10  # type: ignore[misc]
    assert back.env.families == ("radio",)
    # each spec's kwargs are its component's own keywords
    env = SandboxEnv(**back.env.kwargs())
    try:
        assert (env.width, env.height, env.observation) == (224, 168, "pixels")
    finally:
        env.close()
    assert Memory(**back.memory.kwargs()).working_steps == 2
    assert back.actor.kwargs() == {"temperature": 0.7, "max_new_tokens": 9, "inference_dtype": "bf16"}
    assert back.episode.kwargs() == {"end_on_parse_error": True, "platform": "desktop"}
    assert MemorySpec().kwargs() == {k: getattr(Memory(), k) for k in MemorySpec().kwargs()}  # Memory's defaults


def test_offpolicy_weighs_counts_and_drops_and_tickets_cycle_families():
    from trainer.rollout.pool import OffPolicy, RolloutSource, Tickets
    from trainer.rollout.runner import Trajectory

    off = OffPolicy(max_staleness=1, decay=0.5)
    fresh, old, older = (Trajectory(0, "radio", "", version=v) for v in (4, 3, 2))
    assert off.admit(fresh, 4) and fresh.weight == 1.0
    assert off.admit(old, 4) and old.weight == 0.5
    assert not off.admit(older, 4)
    assert off.stats == {"received": 3, "dropped": 1, "lags": [0, 1]}
    t = Tickets(10, ["a", "b", "c"])
    assert t.take(4) == [(10, "b"), (11, "c"), (12, "a"), (13, "b")]  # the family by seed, as before
    assert Tickets(0).take(2) == [(0, None), (1, None)]

    from trainer.rollout.pool import RolloutPool, WorkerSpec
    from trainer.rollout.ray_pool import RayRolloutPool

    for cls in (RolloutPool, RayRolloutPool):  # structurally: both have what the PPO loop calls
        pool = cls(WorkerSpec("m", "w"), 1)
        assert isinstance(pool, RolloutSource) and pool.stats is pool.offpolicy.stats
