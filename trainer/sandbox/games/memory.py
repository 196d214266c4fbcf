"""Memory (matching pairs): click two face-down cards; a matching pair stays up and scores.

The reference player plays like a human with a perfect memory: getState() shows only the cards face
up now and which are matched, so the player keeps its own record of every face it has seen and clicks
a known pair when it has one, else a card it has not seen yet.
"""
from __future__ import annotations

import random
from collections import OrderedDict

from agent.schema import Action
from trainer.sandbox.games import spec


def _center(card: dict) -> tuple[float, float]:
    return card["x"] + card["w"] / 2, card["y"] + card["h"] / 2


class MemoryPlayer:
    """The reference player: a callable (state, rng) -> Action that remembers the faces it has seen.

    Its memory is kept per game seed (so episodes with different seeds running side by side in one
    process do not mix) and forgotten when the state says a new game or a new board began: another
    level, or fewer flips than last seen (a reset).
    """

    MAX_GAMES = 64  # memories kept at once (oldest dropped): one per concurrent episode is enough

    def __init__(self) -> None:
        self._games: OrderedDict[int, dict] = OrderedDict()

    def _memory(self, state: dict) -> dict[int, int]:
        key = state["seed"]
        mem = self._games.get(key)
        if (mem is None or mem["game"] != state["game"] or mem["level"] != state["level"]
                or state["flips"] < mem["flips"]):
            mem = {"game": state["game"], "level": state["level"], "flips": state["flips"], "seen": {}}
            self._games[key] = mem
        self._games.move_to_end(key)
        while len(self._games) > self.MAX_GAMES:
            self._games.popitem(last=False)
        mem["flips"] = state["flips"]
        return mem["seen"]

    def __call__(self, state: dict, rng: random.Random) -> Action:
        cards = state["cards"]
        seen = self._memory(state)
        for i, c in enumerate(cards):
            if c["face"] is not None:
                seen[i] = c["face"]
        # a pending mismatch turns face down at the next click, so its cards count as face down
        open_now = [] if state["pending"] else [i for i, c in enumerate(cards) if c["face"] is not None
                                                 and not c["matched"]]
        hidden = [i for i, c in enumerate(cards) if not c["matched"] and i not in open_now]
        unseen = [i for i in hidden if i not in seen]
        if open_now:  # the second card of a pair: its known twin, else a card not seen yet
            face = cards[open_now[0]]["face"]
            twins = [i for i in hidden if seen.get(i) == face]
            pick = twins[0] if twins else (rng.choice(unseen) if unseen else rng.choice(hidden))
        else:  # the first card: half of a known pair, else a card not seen yet
            by_face: dict[int, list[int]] = {}
            for i in hidden:
                if i in seen:
                    by_face.setdefault(seen[i], []).append(i)
            pairs = [idx for idx in by_face.values() if len(idx) >= 2]
            if pairs:
                pick = pairs[0][0]
            elif unseen:
                pick = rng.choice(unseen)
            elif hidden:
                pick = rng.choice(hidden)
            else:  # board cleared (game over): any click is a no-op
                pick = 0
        return spec.click(*_center(cards[pick]))


GAME = spec.GameSpec(
    name="memory",
    title="Memory",
    kind="memory: matching pairs",
    instruction=("Play Memory: click a face-down card to turn it over, then another; a matching pair stays "
                 "face up and scores, a mismatch turns back. Remember the cards you have seen and find all "
                 "pairs; clearing a board opens a bigger one."),
    reference=MemoryPlayer(),
    reads="score (10 a pair, 50 a cleared board), level (board), over (all boards cleared)",
    clicks=True,
    step_ms=200,
)
