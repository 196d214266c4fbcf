"""One owner for an episode's route: the store the flywheel trains on.

The flywheel scores and routes the episodes of the store it trains on. With the backend built into
the app that is `<data>/backend` (what was synced to it), not the app's own store, so the app's
copy of an episode keeps route "unscored" however it was routed. Writing the routes back into the
app's store would make a second copy: each routed episode would change locally, count as changed
since sync and be sent back to the backend that decided its route, and an undone iteration would
leave the copy behind. So the training store stays the only owner and the app reads from it:

    FlywheelRoutes(store, training_dir).of(episodes)   {id: Routed(route, routing, outcome)}

`routing` is the flywheel's record (iteration, route, reasons), part of its judgement of the
episode's current content in that store (agent.storage.store.Store.judgement), never of the episode.
The outcome shown is a person's mark where this app's store has one (it is made here and
reaches the backend by sync), else the flywheel's judgement (a verifier's, the ORM's).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.schema import Episode, Outcome
from agent.storage.store import DB_NAME, Judgement, Store


@dataclass(frozen=True)
class Routed:
    route: str
    routing: dict  # {"iteration", "route", "why"}, empty when not routed
    outcome: Outcome


def routed(ep: Episode, judged: Judgement) -> Routed:
    """How `ep` shows with the judgement of a store: its route and reasons, and the person's
    outcome mark where `ep` has one, else the one judged."""
    shown = ep.outcome if ep.outcome.success is not None or judged.outcome is None else judged.outcome
    return Routed(judged.route, judged.routing, shown)


def routed_as_stored(store: Store, ep: Episode) -> Routed:
    """`ep` as `store`'s own flywheel judged it."""
    return routed(ep, store.judgement(ep.id))


class FlywheelRoutes:
    """Routes of the app's episodes as the flywheel left them. `training_dir` is where the
    flywheel trains (MainWindow.training_data_dir); None or the app's own folder: the app's store
    is the training store. The other store is opened once it exists, read only."""

    def __init__(self, store: Store, training_dir=None):
        self.store = store
        self.training_dir = Path(training_dir) if training_dir is not None else store.root
        self._training: Store | None = None

    @property
    def elsewhere(self) -> bool:
        return self.training_dir.resolve() != self.store.root.resolve()

    def training_store(self) -> Store | None:
        """The flywheel's store when it is not the app's and exists; else None."""
        if self._training is None and self.elsewhere and (self.training_dir / DB_NAME).exists():
            self._training = Store(self.training_dir)
        return self._training

    def change_token(self):
        """Changes when the flywheel's store does (None while it is the app's own or absent)."""
        t = self.training_store()
        return t.change_token() if t is not None else None

    def of(self, episodes: list[Episode]) -> dict[str, Routed]:
        """Each episode's route, routing record and outcome as shown to a person."""
        ids = [ep.id for ep in episodes]
        judged = self.store.judgements(ids)
        t = self.training_store()
        if t is not None:  # only the rows asked for: the step viewer asks for one episode at each selection
            judged.update(t.judgements(ids))
        return {ep.id: routed(ep, judged.get(ep.id, Judgement())) for ep in episodes}

    def close(self) -> None:
        if self._training is not None:
            self._training.close()
            self._training = None
