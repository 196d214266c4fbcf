"""The one episode runner: a policy plays sandbox tasks over N environments at once.

The scripted expert, the random policy and every model play through `EpisodeRunner` (expert and
random as actors, trainer.rollout.actors), and so do PPO's rollouts, `sandbox eval`, `sandbox generate`,
the recipe's demonstrations and the flywheel's rollouts and evaluations, so every number they
report is measured under the same rules: the same prompt and hierarchical memory as the agent
(agent.policies, agent.policies.memory); each reply parsed once, here, where it arrives
(agent.grammar.parse_reply: the env's platform, the env's coordinate space or the actor's own
extent), and the parsed actions handed to the env (`TaskEnv.send_step`), which never sees text;
and agent.run.reask's rule for a reply that does not parse, the agent loop's own: it is not executed,
the agent is asked again with feedback, and the turn counts toward the step limit
(`ReaskRule(charge_step=True)`); with `end_on_parse_error` the episode ends there instead (an RL
policy cannot buy retries).

The runner keeps N slots, each an env playing one episode. Each round it asks the actor for the
replies of every slot at once (`actor.generate_batch`: one batched generation for a model),
steps each env, and when an episode ends it hands the finished `Trajectory` out and starts the
next ticket in that slot, so no slot idles while long episodes run. `run_episode` is the
one-slot case; `demonstrate` is the one path of expert demonstrations.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from agent.executors.base import Frame, encode_pixels
from agent.grammar import parse_reply
from agent.policies.base import build_prompt
from agent.policies.memory import Memory, MemoryStep
from agent.run.reask import ReaskRule
from agent.schema import Action, Episode, Observation, Outcome, Provenance, ScreenGeometry, Step, monotonic
from agent.vlm.batch import image_key
from agent.vlm.inputs import _to_pil
from trainer.rollout.actors import Actor, ExpertActor
from trainer.sandbox.env_process import make_envs
from trainer.sandbox.families import FAMILIES, family_class
from trainer.sandbox.task import HELDOUT_START, split_of
from trainer.stats import rate


@dataclass
class Turn:
    messages: list | None  # the chat the model saw (agent.policies.memory's neutral form, images as Frames); None: dropped
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
    pointer: list[int] | None = None  # per click site, the element-list entry the pointer chose (agent.vlm.pointer)
    # the prompt as the actor tokenized it (its ids, its screenshots' keys into Trajectory.images, in
    # order): the learner scores the turn from them without the chat (None: the actor did not say)
    prompt_ids: list[int] | None = None
    image_keys: list[str] | None = None
    thought: str = ""  # the reply's thought and actions as parsed (once, by the runner); empty when it did not parse
    actions: list[Action] = field(default_factory=list)
    # what the previous turn's tool action gave back, seen with this turn's frame (the env's
    # obs["tool_output"]: agent.schema.Observation.tool_output's dict); None when no tool ran
    tool_output: dict | None = None

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
    # each distinct screenshot its turns' prompts show, by content key (agent.vlm.batch.image_key): the
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
    element list with its source ("sandbox", MiniWoB's "dom", or why there is none), and the output
    of the tool action before it (obs["tool_output"]), which the next prompt shows first
    (agent.policies.memory, as the agent loop's frames carry it)."""
    elements = obs.get("elements")
    source = obs.get("elements_source") or ("sandbox" if elements is not None else None)
    return Frame(geometry=obs["geometry"], pixels=obs["screenshot"], elements=elements, elements_source=source,
                 tool_output=obs.get("tool_output"))


def platforms_of(env) -> tuple[str, ...]:
    """The action platforms an env performs: its GUI's, and the terminal's where it has the tools."""
    return tuple(getattr(env, "platforms", None) or (env.platform,))


class TaskEnv(Protocol):
    """What the runner plays: a Gymnasium-style task env (trainer.sandbox's SandboxEnv, MiniWoBEnv,
    EnvProcess) that takes parsed actions, never text. `send_step` starts a step and `recv_step`
    returns its (obs, reward, terminated, truncated, info), so envs in processes of their own step
    at once. `platform`: the action platform it performs (agent.actions), what a reply is parsed for;
    an env with the terminal and file tools also has `platforms` (its GUI's and "terminal", see
    platforms_of), and its observations carry "tool_output"."""

    width: int
    height: int
    coords_space: str
    platform: str

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]: ...

    def send_step(self, actions: list[Action]) -> None: ...

    def recv_step(self) -> tuple: ...

    def expert_click(self) -> tuple[float, float] | None: ...

    def labelled_targets(self) -> list: ...

    def close(self) -> None: ...


@dataclass
class _Slot:
    env: TaskEnv
    index: int  # its place among the runner's slots: the key of its kept turn (trainer.rollout.actors)
    traj: Trajectory | None = None
    memory: Memory | None = None
    prompt: str = ""
    obs: dict | None = None
    info: dict | None = None
    feedback: str | None = None
    limit: int = 10
    t0: float = 0.0
    failures: int = 0  # replies in a row that did not parse


Ticket = tuple  # (seed, family or None)


class EpisodeRunner:
    """Plays tickets (seed, family) over `envs` (one slot each). `run(next_ticket)` yields each
    finished Trajectory as it ends; `next_ticket(block)` returns the next ticket or None (none now;
    with block=False the runner goes on with the slots it has, with block=True None means no more).
    `before_round()`, when set, runs before each batched generation (a worker loads new weights
    there and sets `version`). `reask`: the rule for replies that do not parse (agent.run.reask; by
    default re-asked until the step limit, each charged a step; `end_on_parse_error` is
    ReaskRule(max_reasks=0))."""

    def __init__(self, actor: Actor, envs: list[TaskEnv], *, memory_kw: dict | None = None, platform: str = "desktop",
                 greedy: bool = False, max_steps: int | None = None, end_on_parse_error: bool = False,
                 reask: ReaskRule | None = None, version: int = 0, worker: int = -1, trace: bool = False,
                 before_round: Callable[[], None] | None = None):
        if not envs:
            raise ValueError("EpisodeRunner needs at least one environment")
        if reask is not None and end_on_parse_error:
            raise ValueError("give EpisodeRunner either reask or end_on_parse_error, not both")
        if reask is None:
            reask = ReaskRule(max_reasks=0 if end_on_parse_error else None, charge_step=True)
        if reask.max_reasks is None and not reask.charge_step:
            raise ValueError("a ReaskRule with no max_reasks must charge a step per re-ask, or an episode may never end")
        self.actor, self.slots = actor, [_Slot(env, i) for i, env in enumerate(envs)]
        self.memory_kw, self.platform, self.greedy = dict(memory_kw or {}), platform, greedy
        self.max_steps, self.reask = max_steps, reask
        self.version, self.worker, self.trace = version, worker, trace
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
    def _key(self, slot: _Slot) -> tuple:
        return (self.worker, slot.index)

    def _start(self, slot: _Slot, ticket: Ticket) -> None:
        seed, family = ticket
        slot.t0 = time.perf_counter()
        obs, info = slot.env.reset(seed=int(seed), options={"family": family} if family else None)
        slot.obs, slot.info, slot.feedback, slot.failures = obs, info, None, 0
        slot.traj = Trajectory(seed=int(seed), family=info["family"], instruction=info["instruction"],
                               version=self.version, worker=self.worker,
                               start_progress=float(info.get("progress", 0.0)))
        slot.memory = Memory(**self.memory_kw)
        # the tools' actions join the prompt's action space where the env has them
        slot.prompt = build_prompt(info["instruction"], (self.platform,) + platforms_of(slot.env)[1:])
        slot.limit = self.max_steps or info.get("max_steps") or 10
        self.actor.start_episode(self._key(slot), int(seed))

    def _messages(self, slot: _Slot) -> list:
        return slot.memory.build_messages(slot.prompt, frame_of(slot.obs), space=slot.env.coords_space,
                                          feedback=slot.feedback)

    def _generate(self, chats: list, slots: list) -> list:
        return self.actor.generate_batch(chats, greedy=self.greedy, slots=slots)

    def _send(self, slot: _Slot, messages: list, gen) -> tuple:
        """Parse the reply (the one parse) and hand its actions to the slot's env (its step may run
        in the env's own process); a reply that does not parse is not sent (the re-ask rule)."""
        env = slot.env
        frame = frame_of(slot.obs)
        expert = env.expert_click()  # before the step: the state the reply answers
        w, h = frame.size
        parsed = parse_reply(gen.text, env.coords_space, w, h, platforms=platforms_of(env),
                             extent=self.actor.model_extent(w, h))
        hit = None
        if parsed:
            if self.trace:
                _, hit = clicked_element(env, list(parsed.actions))
            env.send_step(list(parsed.actions))
        return messages, gen, frame, parsed, expert, hit

    def _receive(self, slot: _Slot, messages, gen, frame, parsed, expert, hit) -> bool:
        """Record the turn from the env's answer; True when the episode ended."""
        env, traj = slot.env, slot.traj
        turn = Turn(messages, list(gen.ids), list(gen.logprobs), gen.text, expert_point=expert, hit=hit,
                    version=self.version, space=env.coords_space, pointer=gen.pointer,
                    tool_output=slot.obs.get("tool_output"))
        if parsed:
            obs, reward, terminated, truncated, info = env.recv_step()
            slot.failures, slot.feedback = 0, None
            first = parsed.actions[0]
            box = first.args.get("start_box")
            turn.reward, turn.progress, turn.changed = float(reward), float(info.get("progress", 0.0)), info.get("screen_changed")
            turn.action_error, turn.action, turn.point = info.get("action_error"), first.name, tuple(box[:2]) if box else None
            turn.thought, turn.actions = parsed.thought, list(parsed.actions)
            slot.memory.add(MemoryStep(parsed.thought, list(parsed.actions), frame))
        else:  # never executed: the env is not stepped, the agent is asked again (agent.run.reask)
            obs, info, truncated = slot.obs, slot.info, False
            slot.failures += 1
            turn.parse_error, turn.progress = parsed.reason, float(info.get("progress", 0.0))
            slot.feedback = self.reask.feedback(parsed.reason)
            terminated = self.reask.gives_up(slot.failures)  # the policy ended it: nothing to bootstrap
        turn.t = (self._asked, monotonic())
        traj.turns.append(turn)
        _carry_prompt(traj, turn, messages, gen)
        used = len(traj.turns) if self.reask.charge_step else sum(t.parse_error is None for t in traj.turns)
        if not (terminated or truncated) and used >= slot.limit:
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
        traj.slipped = list(self.actor.slipped(self._key(slot)))
        slot.traj = slot.memory = None
        return traj


def _carry_prompt(traj: Trajectory, turn: Turn, messages: list, gen) -> None:
    """The prompt ids the actor generated from, and its screenshots once each in traj.images (keys
    from the actor, or hashed here for an actor that gives ids but no keys)."""
    ids = getattr(gen, "prompt_ids", None)
    if ids is None:
        return

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


def plan(episodes: int, split: str = "train", families: list[str] | None = None, start: int = 0) -> list[Ticket]:
    """`episodes` (seed, family) tickets spread evenly over the families (default: all), seeds
    from the split's range, from `start` within it."""
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    names = list(families or FAMILIES)
    for n in names:
        family_class(n)
    base = (HELDOUT_START if split == "heldout" else 0) + start
    return [(base + i, names[i % len(names)]) for i in range(episodes)]


def demonstrate(tickets: list[Ticket], *, env_kw: dict | None = None, n_envs: int = 1, slip: float = 0.0,
                seed: int = 0, memory_kw: dict | None = None,
                progress: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
    """The one path of expert demonstrations (`sandbox generate`, the recipe's SFT data, the
    simulated flywheel's people): the sandbox's scripted expert (trainer.rollout.actors.ExpertActor, with
    `slip` its injected mistakes) plays `tickets` through the runner over `n_envs` sandbox envs
    (trainer.sandbox.env_process.make_envs; env_kw go to SandboxEnv), prompted, parsed and
    stepped exactly as a model's rollouts are. The trajectories in ticket order."""
    envs = make_envs(max(1, min(n_envs, len(tickets))), **(env_kw or {}))
    try:
        return play(ExpertActor(envs, slip=slip, seed=seed), tickets, envs=envs, greedy=True, memory_kw=memory_kw,
                    progress=progress)
    finally:
        for env in envs:
            env.close()


def clicked_element(env: TaskEnv, actions: list[Action]) -> tuple[tuple | None, str | None]:
    """The first action's click point and the text of the labelled element under it on the screen
    now ("" for none); (None, None) when the first action is no click."""
    a = actions[0] if actions else None
    box = a.args.get("start_box") if a is not None and a.name == "click" else None
    if not box:
        return None, None
    x, y = box[0], box[1]
    hit = next((text for text, _, (x0, y0, x1, y1) in env.labelled_targets() if x0 <= x <= x1 and y0 <= y <= y1), "")
    return (x, y), hit


def rates(trajs: list[Trajectory]) -> dict:
    """{"overall": rate, "families": {name: rate}, "counts": {name: n}} of played trajectories."""
    by: dict[str, list[bool]] = {}
    for t in trajs:
        by.setdefault(t.family, []).append(t.success)
    fams = {k: sum(v) / len(v) for k, v in by.items()}
    overall = sum(t.success for t in trajs) / len(trajs) if trajs else 0.0
    return {"overall": overall, "families": fams, "counts": {k: len(v) for k, v in by.items()}}


def trace_summary(trajs: list[Trajectory]) -> dict:
    """Per family, from trajectories played with trace=True: clicks per episode, the share of
    clicks on no labelled element ("missed"), the share of actions that left the screen as it was
    ("no_effect") and of replies that did not parse ("unparsed")."""
    by: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by.setdefault(t.family, []).append(t)
    out = {}
    for fam, ts in by.items():
        turns = [u for t in ts for u in t.turns]
        clicks = [u for u in turns if u.hit is not None]
        judged = [u for u in turns if u.changed is not None]
        out[fam] = {"episodes": len(ts), "clicks_per_episode": len(clicks) / len(ts),
                    "missed": sum(u.hit == "" for u in clicks) / len(clicks) if clicks else 0.0,
                    "no_effect": sum(u.changed is False for u in judged) / len(judged) if judged else 0.0,
                    "unparsed": sum(u.action == "" for u in turns) / len(turns) if turns else 0.0}
    return out


def trajectory_to_episode(traj: Trajectory, store, producer: str, policy_version: str | None = None,
                          meta: dict | None = None) -> Episode:
    """A played Trajectory as a stored rollout Episode (kind "rollout", outcome from the verifier):
    each turn's screenshot as a PNG blob with its element list, the thought and actions as the
    runner parsed them (a reply that did not parse: a wait, its error in the step's info), the
    reply itself as the raw response. `meta`: more of the episode's meta (a game's score)."""
    steps = []
    for i, turn in enumerate(traj.turns):
        frame = turn.frame
        w, h = frame.size
        acts = list(turn.actions) or [Action("wait", {})]
        listed = list(frame.elements) if frame.elements is not None else None
        obs = Observation(screenshot=store.put_blob(encode_pixels(frame.pixels, "image/png")), width=w, height=h,
                          geometry=ScreenGeometry.simple(w, h), time=turn.t[0], elements=listed,
                          elements_source=frame.elements_source if listed is not None else None,
                          tool_output=turn.tool_output)
        info: dict = {"progress": turn.progress}
        if len(acts) > 1:
            info["more_actions"] = [a.to_dict() for a in acts[1:]]
        error = turn.parse_error or turn.action_error
        if error:
            info["error"] = error
        last = i == len(traj.turns) - 1
        steps.append(Step(index=i, observation=obs, thought=turn.thought, action=acts[0],
                          provenance=Provenance(source="agent", policy_version=policy_version or producer),
                          t_start=turn.t[0], t_end=turn.t[1], reward=turn.reward, terminated=last and traj.terminated,
                          truncated=last and traj.truncated, raw_response=turn.text, info=info))
    ep = Episode(instruction=traj.instruction, kind="rollout", platform="sandbox", producer=producer,
                 policy_version=policy_version or producer,
                 outcome=Outcome(success=traj.success, reward=sum(t.reward for t in traj.turns), source="verifier"),
                 steps=steps,
                 meta={"family": traj.family, "seed": traj.seed, "level": traj.level, "split": split_of(traj.seed),
                       "progress": traj.progress, "status": traj.status, **(meta or {})})
    store.save_episode(ep)
    return ep
