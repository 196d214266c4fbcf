"""The one episode runner: a policy plays sandbox tasks over N environments at once.

PPO's rollouts, `sandbox eval`, the flywheel's rollout collection and its evaluation all play
episodes through `EpisodeRunner`, so every number they report is measured under the same rules:
the same prompt and hierarchical memory as the agent (agent.policies, agent.memory), the model's
raw text handed to the env, and one rule for a reply that does not parse: the turn counts toward
the step limit, the agent is asked again with feedback (as agent.loop does), and with
`end_on_parse_error` the episode ends there instead (an RL policy cannot buy retries).

The runner keeps N slots, each an env playing one episode. Each round it asks the actor for the
replies of every slot at once (`actor.generate_batch`: one batched generation), steps each env,
and when an episode ends it hands the finished `Trajectory` out and starts the next ticket in
that slot, so no slot idles while long episodes run. An actor without `generate_batch` (the
scripted expert, an endpoint) is asked row by row. `run_episode` is the one-slot case.
"""
from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from agent.executors.base import Frame
from agent.memory import Memory, MemoryStep
from agent.policies.base import build_prompt
from agent.schema import monotonic


@dataclass
class Turn:
    messages: list | None  # the chat the model saw (agent.memory's neutral form, images as Frames); None: dropped
    response_ids: list[int]  # generated tokens (the end-of-turn token included)
    logprobs: list[float]  # their log-probs under the behaviour policy
    text: str
    reward: float = 0.0  # the env's reward for this turn (shaping is the learner's business)
    parse_error: str | None = None  # the reply did not parse (charged the format penalty)
    progress: float = 0.0  # the verifier's partial progress after this turn (0..1)
    point: tuple | None = None  # the turn's first click (start_box), normalized; None if none
    expert_point: tuple | None = None  # where the task's expert would have clicked in that state
    # did the turn's action change the screen (the env's info["screen_changed"])? None when no action
    # ran, the turn ended the episode, or the env does not say
    changed: bool | None = None
    action: str = ""  # the first action's name; "" when the reply did not parse
    hit: str | None = None  # with trace: the labelled element under the click ("" none; None: no click)
    version: int = 0  # the policy version that generated this turn
    space: str = "smart_resize"  # the coordinate space of the reply (the env's)
    t: tuple = (0.0, 0.0)  # monotonic times: the reply asked for, the env's answer in
    action_error: str | None = None  # it parsed, but the env could not perform it: an agent mistake, not format
    pointer: list[int] | None = None  # per click site, the element-list entry the pointer chose (agent.pointer)
    # the prompt as the actor tokenized it (its ids, its screenshots' keys into Trajectory.images, in
    # order): the learner scores the turn from them without the chat (None: the actor did not say)
    prompt_ids: list[int] | None = None
    image_keys: list[str] | None = None

    @property
    def frame(self) -> Frame | None:
        """The screenshot this turn answered (the last image of its prompt); None when the chat was dropped."""
        for m in reversed(self.messages or []):
            if isinstance(m.get("content"), list):
                for p in reversed(m["content"]):
                    if p.get("type") == "image" and p.get("frame") is not None:
                        return p["frame"]
        return None


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
    version: int = 0  # the oldest policy version among its turns (what staleness is judged by)
    worker: int = -1
    seconds: float = 0.0
    final_messages: list | None = None  # the next prompt, to bootstrap a truncated episode
    weight: float = 1.0  # set by the staleness rule
    slipped: list[int] = field(default_factory=list)  # demonstrations: turns that were injected mistakes
    status: str = ""  # the verifier's last word (running, success, failed)
    level: int | None = None  # the task's difficulty level
    # each distinct screenshot its turns' prompts show, by content key (agent.vlm_batch.image_key): the
    # RGB image as the model read it, kept once however many turns show it (Turn.image_keys)
    images: dict = field(default_factory=dict)

    @property
    def n_generated(self) -> int:
        return sum(len(t.response_ids) for t in self.turns)

    def drop_messages(self) -> Trajectory:
        """Drop every turn's chat (its screenshots with it) where the turn carries its prompt ids,
        so what a rollout worker sends the learner holds each screenshot once, in `images`; the
        chat of a truncated episode's next state (final_messages) stays for the bootstrap. Turn.frame
        of a dropped turn is None. Returns self."""
        for t in self.turns:
            if t.prompt_ids is not None:
                t.messages = None
        return self


def frame_of(obs) -> Frame:
    """An env's observation as the agent's Frame: the screenshot and, where the env reads one, the
    element list with its source ("sandbox", MiniWoB's "dom", or why there is none)."""
    elements = obs.get("elements")
    source = obs.get("elements_source") or ("sandbox" if elements is not None else None)
    return Frame(geometry=obs["geometry"], pixels=obs["screenshot"], elements=elements, elements_source=source)


@dataclass
class _Slot:
    env: object
    index: int  # its place among the runner's slots: the key of its kept turn (trainer.actor)
    traj: Trajectory | None = None
    memory: Memory | None = None
    prompt: str = ""
    obs: dict | None = None
    info: dict | None = None
    feedback: str | None = None
    limit: int = 10
    t0: float = 0.0


Ticket = tuple  # (seed, family or None)


class EpisodeRunner:
    """Plays tickets (seed, family) over `envs` (one slot each). `run(next_ticket)` yields each
    finished Trajectory as it ends; `next_ticket(block)` returns the next ticket or None (none now;
    with block=False the runner goes on with the slots it has, with block=True None means no more).
    `before_round()`, when set, runs before each batched generation (a worker loads new weights
    there and sets `version`)."""

    def __init__(self, actor, envs: list, *, memory_kw: dict | None = None, platform: str = "desktop",
                 greedy: bool = False, max_steps: int | None = None, end_on_parse_error: bool = False,
                 version: int = 0, worker: int = -1, trace: bool = False, batched: bool = True,
                 before_round: Callable[[], None] | None = None, keep_turns: bool = True):
        if not envs:
            raise ValueError("EpisodeRunner needs at least one environment")
        self.actor, self.slots = actor, [_Slot(env, i) for i, env in enumerate(envs)]
        self.memory_kw, self.platform, self.greedy = dict(memory_kw or {}), platform, greedy
        self.max_steps, self.end_on_parse_error = max_steps, end_on_parse_error
        self.version, self.worker, self.trace = version, worker, trace
        self.batched = batched and hasattr(actor, "generate_batch")
        # an actor that keeps each slot's last turn computes only a turn's new tokens
        self.keyed = keep_turns and self.batched and "slots" in inspect.signature(actor.generate_batch).parameters
        self.before_round = before_round
        self.rounds = 0
        self._asked = 0.0
        # where the time goes: generating replies, building prompts, stepping and resetting envs
        self.seconds = {"generate": 0.0, "prompts": 0.0, "envs": 0.0}

    # -- the loop
    def run(self, next_ticket: Callable[[bool], Ticket | None]) -> Iterator[Trajectory]:
        for slot in self.slots:
            ticket = next_ticket(False) if any(s.traj for s in self.slots) else next_ticket(True)
            if ticket is None:
                break
            self._start(slot, ticket)
        while True:
            active = [s for s in self.slots if s.traj is not None]
            if not active:
                ticket = next_ticket(True)
                if ticket is None:
                    return
                self._start(self.slots[0], ticket)
                continue
            if self.before_round is not None:
                self.before_round()
            t0 = time.perf_counter()
            chats = [self._messages(s) for s in active]
            self._asked = monotonic()
            t1 = time.perf_counter()
            replies = self._generate(chats, [(self.worker, s.index) for s in active])
            t2 = time.perf_counter()
            self.rounds += 1
            # every env steps at once where envs live in processes of their own (EnvProcess)
            pending = [self._send(slot, chat, gen) for slot, chat, gen in zip(active, chats, replies, strict=True)]
            finished = [slot for slot, sent in zip(active, pending, strict=True) if self._receive(slot, *sent)]
            done = [self._finish(slot) for slot in finished]
            for slot in finished:
                ticket = next_ticket(False)
                if ticket is not None:
                    self._start(slot, ticket)
            self.seconds["prompts"] += t1 - t0
            self.seconds["generate"] += t2 - t1
            self.seconds["envs"] += time.perf_counter() - t2
            yield from done

    def run_all(self, tickets: Iterable[Ticket], progress: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        """Every ticket played; the trajectories in ticket order."""
        tickets = list(tickets)
        it = iter(tickets)
        out: list[Trajectory | None] = [None] * len(tickets)
        for traj in self.run(lambda block: next(it, None)):
            # match a finished trajectory to its ticket by (seed, family); equal tickets are interchangeable
            k = next(i for i, t in enumerate(tickets) if out[i] is None and int(t[0]) == traj.seed
                     and (t[1] is None or t[1] == traj.family))
            out[k] = traj
            if progress:
                progress(traj)
        return out

    # -- one slot
    def _start(self, slot: _Slot, ticket: Ticket) -> None:
        seed, family = ticket
        slot.t0 = time.perf_counter()
        obs, info = slot.env.reset(seed=int(seed), options={"family": family} if family else None)
        slot.obs, slot.info, slot.feedback = obs, info, None
        slot.traj = Trajectory(seed=int(seed), family=info["family"], instruction=info["instruction"],
                               version=self.version, worker=self.worker,
                               start_progress=float(info.get("progress", 0.0)))
        slot.memory = Memory(**self.memory_kw)
        slot.prompt = build_prompt(info["instruction"], (self.platform,))
        slot.limit = self.max_steps or info.get("max_steps") or 10
        if hasattr(self.actor, "start_episode"):
            self.actor.start_episode()

    def _messages(self, slot: _Slot) -> list:
        return slot.memory.build_messages(slot.prompt, frame_of(slot.obs), space=slot.env.coords_space,
                                          feedback=slot.feedback)

    def _generate(self, chats: list, slots: list) -> list:
        if self.keyed:
            return self.actor.generate_batch(chats, greedy=self.greedy, slots=slots)
        if self.batched:
            return self.actor.generate_batch(chats, greedy=self.greedy)
        return [self.actor.generate(c, greedy=self.greedy) for c in chats]

    def _send(self, slot: _Slot, messages: list, gen) -> tuple:
        """Hand the reply to the slot's env (its step may run in the env's own process)."""
        from agent.grammar import parse_normalized

        env = slot.env
        frame = frame_of(slot.obs)
        ask = getattr(env, "expert_click", None)  # before the step: the state the reply answers
        expert = ask() if ask else None
        w, h = frame.size
        parsed = parse_normalized(gen.text, env.coords_space, w, h)
        hit = None
        if self.trace and parsed:
            from trainer.sandbox.rollout import clicked_element

            _, hit = clicked_element(env, list(parsed.actions))
        if hasattr(env, "send_step"):
            env.send_step(gen.text)
            result = None
        else:
            result = env.step(gen.text)
        return messages, gen, frame, parsed, expert, hit, result

    def _receive(self, slot: _Slot, messages, gen, frame, parsed, expert, hit, result) -> bool:
        """Record the turn from the env's answer; True when the episode ended."""
        env, traj = slot.env, slot.traj
        obs, reward, terminated, truncated, info = result if result is not None else env.recv_step()
        turn = Turn(messages, list(gen.ids), list(gen.logprobs), gen.text, float(reward), info.get("parse_error"),
                    float(info.get("progress", 0.0)), action_error=info.get("action_error"), expert_point=expert, changed=info.get("screen_changed"),
                    hit=hit, version=self.version, space=env.coords_space, t=(self._asked, monotonic()),
                    pointer=getattr(gen, "pointer", None))
        traj.turns.append(turn)
        _carry_prompt(traj, turn, messages, gen)
        if info.get("parse_error"):
            if self.end_on_parse_error:
                terminated = True
            slot.feedback = _reask(info["parse_error"])
        else:
            slot.feedback = None
            if parsed:
                slot.memory.add(MemoryStep(parsed.thought, list(parsed.actions), frame))
                first = parsed.actions[0] if parsed.actions else None
                turn.action = first.name if first else ""
                box = first.args.get("start_box") if first else None
                turn.point = tuple(box[:2]) if box else None
        if not (terminated or truncated) and len(traj.turns) >= slot.limit:
            truncated = True
        slot.obs, slot.info = obs, info
        if terminated or truncated:
            traj.terminated, traj.truncated = bool(terminated), bool(truncated and not terminated)
            return True
        return False

    def _finish(self, slot: _Slot) -> Trajectory:
        traj, info = slot.traj, slot.info
        traj.success, traj.progress = bool(info.get("success")), float(info.get("progress", 0.0))
        traj.status, traj.level = str(info.get("status", "")), info.get("level")
        if traj.truncated:  # a time-limit cut is bootstrapped from the value of the next state
            traj.final_messages = self._messages(slot)
        traj.seconds = time.perf_counter() - slot.t0
        if hasattr(self.actor, "slipped"):
            traj.slipped = list(self.actor.slipped)
        slot.traj = slot.memory = None
        return traj


def _carry_prompt(traj: Trajectory, turn: Turn, messages: list, gen) -> None:
    """The prompt ids the actor generated from, and its screenshots once each in traj.images (keys
    from the actor, or hashed here for an actor that gives ids but no keys)."""
    ids = getattr(gen, "prompt_ids", None)
    if ids is None:
        return
    from agent.vlm_batch import image_key
    from agent.vlm_inputs import _to_pil

    parts = [p for m in messages if isinstance(m.get("content"), list) for p in m["content"] if p.get("type") == "image"]
    keys = getattr(gen, "image_keys", None)
    if keys is not None and len(keys) != len(parts):
        raise ValueError(f"the actor named {len(keys)} images for a prompt with {len(parts)}")
    out = []
    for j, part in enumerate(parts):
        key = keys[j] if keys is not None else None
        if key is None or key not in traj.images:
            pil = _to_pil(part, f"turn {len(traj.turns) - 1} image {j}")
            key = key or image_key(pil)
            traj.images.setdefault(key, pil)
        out.append(key)
    turn.prompt_ids, turn.image_keys = list(ids), out


def _reask(reason: str) -> str:
    from agent.loop import reask_feedback

    return reask_feedback(reason)


def run_episode(actor, env, seed: int, *, family: str | None = None, memory_kw: dict | None = None,
                platform: str = "desktop", greedy: bool = False, version: int = 0, worker: int = -1,
                max_steps: int | None = None, end_on_parse_error: bool = False, trace: bool = False) -> Trajectory:
    """One episode in one env: the runner with one slot (see EpisodeRunner for the rules)."""
    runner = EpisodeRunner(actor, [env], memory_kw=memory_kw, platform=platform, greedy=greedy, max_steps=max_steps,
                           end_on_parse_error=end_on_parse_error, version=version, worker=worker, trace=trace)
    return runner.run_all([(seed, family)])[0]


def play(actor, tickets: list[Ticket], *, envs: list, greedy: bool = True, memory_kw: dict | None = None,
         progress: Callable[[Trajectory], None] | None = None, **kw) -> list[Trajectory]:
    """Every ticket played over `envs` (batched when the actor can), in ticket order."""
    return EpisodeRunner(actor, envs, memory_kw=memory_kw, greedy=greedy, **kw).run_all(tickets, progress)


def evaluate(actor, families: list[str], seeds_per_family: int, *, env_kw: dict | None = None, n_envs: int = 16,
             memory_kw: dict | None = None, seed_start: int | None = None, progress=None, max_steps: int | None = None) -> dict:
    """Greedy episodes on the same seeds for every model (the held-out split by default), played
    over `n_envs` envs with batched replies. Per family and overall: the success rate with its
    episode count and Wilson 95% interval, the verifier's mean progress and steps; the share of
    replies that parsed; and every episode's outcome ("outcomes": [family, seed, success]) so two
    models can be compared pair by pair (trainer.stats.paired_difference). progress() per episode."""
    from trainer.sandbox.env_process import make_envs
    from trainer.sandbox.task import HELDOUT_START

    if seeds_per_family < 1:
        raise ValueError(f"seeds_per_family must be at least 1, got {seeds_per_family}")
    start = HELDOUT_START if seed_start is None else seed_start
    tickets = [(start + k, fam) for fam in families for k in range(seeds_per_family)]
    envs = make_envs(max(1, min(n_envs, len(tickets))), **(env_kw or {}))
    try:
        trajs = play(actor, tickets, envs=envs, greedy=True, memory_kw=memory_kw, max_steps=max_steps,
                     progress=(lambda _t: progress()) if progress else None)
    finally:
        for env in envs:
            env.close()
    return summarize(trajs, families)


def summarize(trajs: list[Trajectory], families: list[str]) -> dict:
    """evaluate()'s numbers from played trajectories: per family (each must have episodes) the
    success rate with its episode count and Wilson 95% interval, mean progress and steps; overall
    the same, the mean over families, the share of replies that parsed, and every outcome."""
    from trainer.stats import rate

    out: dict = {"families": {}}
    for fam in families:
        mine = [t for t in trajs if t.family == fam]
        if not mine:
            raise ValueError(f"no episodes of {fam!r} to summarize")
        out["families"][fam] = {**rate([t.success for t in mine]),
                                "progress": sum(t.progress for t in mine) / len(mine),
                                "mean_steps": sum(len(t.turns) for t in mine) / len(mine)}
    overall = rate([t.success for t in trajs])
    turns = [turn for t in trajs for turn in t.turns]
    out.update(overall=overall, mean_success=sum(f["success"] for f in out["families"].values()) / len(families),
               mean_progress=sum(f["progress"] for f in out["families"].values()) / len(families),
               format_rate=sum(turn.parse_error is None for turn in turns) / max(1, len(turns)),
               outcomes=[[t.family, t.seed, bool(t.success)] for t in trajs])
    return out
