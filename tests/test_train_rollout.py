"""Rollouts: real episodes of the tiny VLM in the Qt sandbox, in-process and in two spawned
worker processes; the staleness bound drops data from policies too many versions old."""
from __future__ import annotations

import os
import time

import pytest

from agent.schema import Action
from tests.vlm_fixtures import one_thread, tiny_vlm_dir  # noqa: F401 - fixtures
from trainer.rollout.actors import Actor

ENV = {"width": 224, "height": 168, "families": ["click_button", "radio"]}


def test_staleness_rule():
    from trainer.rollout.pool import RolloutError, staleness

    assert staleness(5, 5, 0) == 1.0
    assert staleness(4, 5, 1) == 1.0
    assert staleness(3, 5, 1) is None  # two versions behind, bound 1: dropped
    assert staleness(3, 5, 2, decay=0.5) == 0.25  # kept, down-weighted
    with pytest.raises(RolloutError, match="newer"):
        staleness(6, 5, 1)


def test_run_episode_records_the_policys_tokens(tiny_vlm_dir, one_thread):  # noqa: F811
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.runner import run_episode
    from trainer.sandbox.env import SandboxEnv

    actor = VLMActor.load(tiny_vlm_dir, max_new_tokens=12)
    env = SandboxEnv(**ENV)
    try:
        tr = run_episode(actor, env, 3, family="radio", max_steps=2)
    finally:
        env.close()
    assert tr.family == "radio" and 1 <= len(tr.turns) <= 2
    assert tr.terminated != tr.truncated or not (tr.terminated or tr.truncated)
    t = tr.turns[0]
    assert 1 <= len(t.response_ids) <= 12 and len(t.logprobs) == len(t.response_ids)
    assert all(lp <= 0 for lp in t.logprobs)
    assert any(isinstance(p, dict) and p.get("type") == "image" for m in t.messages if isinstance(m["content"], list)
               for p in m["content"])
    if tr.truncated:
        assert tr.final_messages is not None  # the next state, to bootstrap from


def test_two_workers_async_then_sync(tiny_vlm_dir, tmp_path):  # noqa: F811
    """One pool (spawning workers costs seconds each): async first, then the same workers in
    sync mode."""
    from agent.vlm.model import load_vlm
    from trainer.rollout.pool import RolloutError, RolloutPool, RolloutSource, WorkerSpec
    from trainer.rollout.specs import ActorSpec, EnvSpec

    with pytest.raises(RolloutError, match="mode"):
        RolloutPool(WorkerSpec("x", "y"), 1, mode="later")
    model, _ = load_vlm(tiny_vlm_dir, device="cpu")
    spec = WorkerSpec(str(tiny_vlm_dir), str(tmp_path / "w"), env=EnvSpec(**ENV, max_steps=1),
                      actor=ActorSpec(max_new_tokens=6))
    with RolloutPool(spec, 2, mode="async", max_staleness=1, prefetch=2).start(model) as pool:
        assert isinstance(pool, RolloutSource)
        assert pool.wait_ready(timeout=300).ready == {0, 1}
        # the workers run niced, so a learner sharing their cores gets the CPU first
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert [os.getpriority(os.PRIO_PROCESS, p.pid) for p in pool.procs] == [min(19, mine + spec.nice)] * 2
        # -- async: the workers keep playing while the learner holds its batch
        first = pool.collect(4, timeout=300)
        assert len(first) == 4 and all(t.version == 0 and t.turns for t in first)
        seen, extra = {t.worker for t in first}, 0
        while len(seen) < 2 and extra < 8:  # on busy cores a niced worker can be late to its first episode
            seen |= {t.worker for t in pool.collect(1, timeout=300)}
            extra += 1
        assert seen == {0, 1}  # both workers played
        assert pool.outstanding >= 2  # tickets were handed out beyond the batch
        time.sleep(0.5)  # the workers are now inside episodes that use version 0
        pool.publish(model)
        pool.publish(model)  # the learner is two versions ahead: version-0 data is beyond the bound
        later = pool.collect(2, timeout=300)
        assert pool.stats["dropped"] >= 1
        assert all(t.version >= 1 for t in later)
        assert all(pool.version.value - t.version <= 1 for t in later)

        # -- sync: exactly one batch of tickets per version, all played with that version
        with pytest.raises(RolloutError, match="mode"):
            pool.set_mode("later")
        pool.set_mode("sync")
        assert pool.outstanding == 0
        pool.offpolicy.max_staleness = 0
        dropped = pool.stats["dropped"]
        v = pool.publish(model)
        a = pool.collect(2, timeout=300)
        assert pool.outstanding == 0 and [t.version for t in a] == [v, v]
        v = pool.publish(model)
        b = pool.collect(2, timeout=300)
        assert [t.version for t in b] == [v, v] and pool.stats["dropped"] == dropped


def test_env_latency_delays_each_step_and_leaves_the_env_as_is():
    """WorkerSpec.env_latency_s (the benchmark's remote-sandbox knob) adds its delay to every step."""
    from trainer.rollout.pool import _Delayed
    from trainer.sandbox.env import SandboxEnv

    env = _Delayed(SandboxEnv(width=224, height=168), 0.15)
    try:
        obs, info = env.reset(seed=4, options={"family": "click_button"})
        assert env.coords_space == env.env.coords_space  # attributes pass through
        t0 = time.perf_counter()
        _, reward, terminated, truncated, info = env.step(Action("wait", {}))
        assert time.perf_counter() - t0 >= 0.15
        assert not terminated and info["family"] == "click_button"
    finally:
        env.close()


class _ScriptedActor(Actor):
    """A scripted model: replies in turn from a list (the only thing a test may script)."""

    def __init__(self, replies):
        self.replies = list(replies)

    def generate(self, messages, *, greedy=False):
        from trainer.rollout.actors import ActorOutput

        return ActorOutput(self.replies.pop(0), [7, 2], [-0.5, -0.1])


def test_end_on_parse_error_ends_the_rollout_at_the_first_unparseable_output():
    """By default an unparseable reply gets feedback and the episode goes on (as in the agent);
    with end_on_parse_error it ends there, terminated and failed, and its progress is recorded."""
    from trainer.rollout.runner import run_episode
    from trainer.sandbox.env import SandboxEnv

    junk, wait = "I think I should click", "Thought: wait.\nAction: wait()"
    env = SandboxEnv(width=224, height=168)
    try:
        tr = run_episode(_ScriptedActor([junk, wait, wait]), env, 3, family="check_boxes", max_steps=3)
        assert len(tr.turns) == 3 and tr.truncated and not tr.terminated
        assert tr.turns[0].parse_error and "Action" in tr.turns[0].parse_error
        tr = run_episode(_ScriptedActor([junk, wait, wait]), env, 3, family="check_boxes", max_steps=3,
                         end_on_parse_error=True)
        assert len(tr.turns) == 1 and tr.terminated and not tr.truncated and not tr.success
        assert tr.final_messages is None  # a terminated episode is not bootstrapped
        # two of check_boxes' subgoals may hold before any action: progress starts where reset left it
        assert tr.start_progress == tr.turns[0].progress == 0.5
    finally:
        env.close()


def test_run_episode_records_whether_each_action_changed_the_screen():
    """A click on empty space changes nothing, clicking the radio button already chosen changes
    nothing, clicking another one does (and again, nothing); an unparseable reply and the turn that ends the
    episode ran no action that could be judged (None)."""
    from agent.grammar import format_normalized
    from agent.schema import Action
    from trainer.rollout.runner import run_episode
    from trainer.sandbox.env import SandboxEnv

    env = SandboxEnv(width=320, height=240)
    try:
        env.reset(seed=4, options={"family": "radio"})
        boxes = {text: box for text, _, box in env.labelled_targets()}
        target = env.task.target
        group = [(t, r) for (g, t), r in env.task.radios.items() if g == env.task.group]
        chosen = next(t for t, r in group if r.isChecked())  # the group starts with its first option chosen
        other = next(t for t, r in group if t not in (target, chosen))

        def click(x, y):
            return format_normalized("x", [Action("click", {"start_box": (x, y)})], env.coords_space, 320, 240)

        def centre(name):
            x0, y0, x1, y1 = boxes[name]
            return click((x0 + x1) / 2, (y0 + y1) / 2)

        # radio allows four turns
        replies = [click(0.99, 0.99), "junk", centre(other), centre(other)]
        tr = run_episode(_ScriptedActor(replies), env, 4, family="radio")
        assert [t.changed for t in tr.turns] == [False, None, True, False]
        assert tr.truncated and not tr.success
        tr = run_episode(_ScriptedActor([centre(chosen), centre(target)]), env, 4, family="radio")
        assert [t.changed for t in tr.turns] == [False, None]
        assert tr.success and tr.terminated
    finally:
        env.close()


def test_workers_step_several_env_processes_with_batched_replies(tiny_vlm_dir, tmp_path):  # noqa: F811
    """A worker with n_envs=3 plays its tickets over three sandbox processes with one batched
    generation per round; every turn keeps the log-probs of the tokens it sampled, and closing
    the pool leaves no env process behind."""
    import multiprocessing as mp

    from agent.vlm.model import load_vlm
    from trainer.rollout.pool import RolloutPool, WorkerSpec
    from trainer.rollout.specs import ActorSpec, EnvSpec

    model, proc = load_vlm(tiny_vlm_dir, device="cpu")
    spec = WorkerSpec(str(tiny_vlm_dir), str(tmp_path / "w"), env=EnvSpec(**ENV, max_steps=2),
                      actor=ActorSpec(max_new_tokens=6), n_envs=3)
    with RolloutPool(spec, 1, mode="sync", max_staleness=0).start(model) as pool:
        pool.wait_ready(timeout=300)
        worker = pool.procs[0]
        trajs = pool.collect(5, timeout=300)
        assert sorted(t.seed for t in trajs) == [0, 1, 2, 3, 4]
        assert all(t.turns and all(len(u.logprobs) == len(u.response_ids) > 0 for u in t.turns) for t in trajs)
        # what came through the queue: each turn's prompt ids, each screenshot once, no chats
        assert all(u.messages is None and u.prompt_ids and u.image_keys for t in trajs for u in t.turns)
        assert all(set(t.images) == {k for u in t.turns for k in u.image_keys} for t in trajs)
        from trainer.learn.ppo_batch import build_turns

        tbs = build_turns(trajs, proc)  # the learner's batch from the carried ids alone
        assert len(tbs) == sum(len(t.turns) for t in trajs)
        assert all(tb.tokens == len(trajs[tb.traj].turns[tb.turn].response_ids) for tb in tbs)
        envs = _descendants(worker.pid)
        assert len(envs) >= 3  # the worker's env processes (and the fork server they come from)
    assert not worker.is_alive()
    time.sleep(1.0)
    assert not [p for p in envs if _alive(p)]
    assert mp.active_children() == []


def _descendants(pid: int) -> list[int]:
    """Every process below pid, from /proc (Linux)."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_runner_takes_the_agent_loops_reask_rule():
    """agent.run.reask.ReaskRule is the one rule for unparsed replies: with the agent loop's own
    (2 re-asks, executed steps counted) the runner never steps the env for junk, resets the count
    after a reply that parses, and ends the episode at the third junk reply in a row."""
    from agent.run.reask import ReaskRule
    from trainer.rollout.runner import EpisodeRunner
    from trainer.sandbox.env import SandboxEnv

    junk, wait = "I think I should click", "Thought: wait.\nAction: wait()"
    env = SandboxEnv(width=224, height=168)
    try:
        rule = ReaskRule(max_reasks=2, charge_step=False)
        runner = EpisodeRunner(_ScriptedActor([junk, junk, wait, junk, junk, junk, wait]), [env], max_steps=3,
                               reask=rule)
        (tr,) = runner.run_all([(3, "check_boxes")])
        assert [t.parse_error is None for t in tr.turns] == [False, False, True, False, False, False]
        assert tr.terminated and not tr.truncated and not tr.success
        assert env._steps == 1  # only the reply that parsed reached the env
        with pytest.raises(ValueError, match="either reask or end_on_parse_error"):
            EpisodeRunner(_ScriptedActor([]), [env], reask=rule, end_on_parse_error=True)
        with pytest.raises(ValueError, match="must charge a step"):
            EpisodeRunner(_ScriptedActor([]), [env], reask=ReaskRule(max_reasks=None, charge_step=False))
    finally:
        env.close()
    with pytest.raises(ValueError, match="max_reasks must be None or an integer >= 0, got -1"):
        ReaskRule(max_reasks=-1)


def test_each_reply_is_parsed_once_with_the_actors_extent_and_the_envs_platform():
    """The runner parses a reply where it arrives (agent.grammar.parse_reply): points in the
    actor's own image extent where it has one (a processor that resizes otherwise), actions the
    env's platform lacks refused there, and only the parsed actions reach the env."""
    from trainer.rollout.runner import run_episode
    from trainer.sandbox.env import SandboxEnv

    class Wide(_ScriptedActor):  # a model whose image is 1000 x 500 whatever the screen
        def model_extent(self, width, height):
            return (1000, 500)

    env = SandboxEnv(width=224, height=168)
    try:
        tr = run_episode(Wide(["Thought: t\nAction: run_command(command='ls')",
                               "Thought: c\nAction: click(start_box='(250,375)')"]), env, 3, family="check_boxes",
                         max_steps=2)
    finally:
        env.close()
    refused, click = tr.turns
    assert "not available on sandbox" in refused.parse_error and not refused.actions
    assert click.point == pytest.approx((0.25, 0.75)) and click.actions[0].args["start_box"] == pytest.approx((0.25, 0.75))
