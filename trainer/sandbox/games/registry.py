"""The games there are: each module of GAME_MODULES (trainer/sandbox/games/<name>.py) that is
present defines GAME (a GameSpec) beside its page pages/<name>.html. A module that is not there
yet is skipped and named by `missing()`, so a checkout with some of the games works with those."""
from __future__ import annotations

import importlib
import json
from functools import lru_cache
from pathlib import Path

from trainer.errors import TrainerError
from trainer.sandbox.games.spec import GameSpec

GAME_MODULES = ("merge", "snake", "blocks", "mines", "lights", "memory", "dodge", "levels")
HERE = Path(__file__).resolve().parent
PAGES = HERE / "pages"
NORMS = HERE / "norms.json"
PREFIX = "games/"


class GameError(TrainerError, ValueError):
    """An unknown game, a game module that does not load, or a game page that is missing."""


@lru_cache(maxsize=1)
def _load() -> tuple[dict[str, GameSpec], dict[str, str]]:
    found: dict[str, GameSpec] = {}
    missing: dict[str, str] = {}
    for name in GAME_MODULES:
        if not (HERE / f"{name}.py").is_file():
            missing[name] = "not in this checkout"
            continue
        try:
            module = importlib.import_module(f"trainer.sandbox.games.{name}")
        except Exception as e:  # a broken game must not hide the others; it is named with why
            missing[name] = f"its module does not import: {type(e).__name__}: {e}"
            continue
        spec = getattr(module, "GAME", None)
        if not isinstance(spec, GameSpec) or spec.name != name:
            missing[name] = f"trainer/sandbox/games/{name}.py defines no GAME = GameSpec(name={name!r}, ...)"
        elif not (PAGES / spec.page).is_file():
            missing[name] = f"its page pages/{spec.page} is missing"
        else:
            found[name] = spec
    return found, missing


def games() -> dict[str, GameSpec]:
    """name -> GameSpec of every game present, in GAME_MODULES order."""
    return dict(_load()[0])


def missing() -> dict[str, str]:
    """name -> why, for each game of GAME_MODULES that cannot be played here."""
    return dict(_load()[1])


def game(name: str) -> GameSpec:
    """The GameSpec of 'snake' (or 'games/snake'); GameError listing the known games otherwise."""
    key = name[len(PREFIX):] if isinstance(name, str) and name.startswith(PREFIX) else name
    found, gone = _load()
    if key in found:
        return found[key]
    if key in gone:
        raise GameError(f"game {name!r} cannot be played here: {gone[key]} (known games: {', '.join(found) or 'none'})")
    raise GameError(f"unknown game {name!r}; known games: {', '.join(found) or 'none'}")


def parse_games(text: str | None) -> list[str]:
    """'snake,merge' -> the names (checked, in the order given); None or '' -> every game present."""
    if not text:
        names = list(games())
        if not names:
            raise GameError("no game can be played here: " + "; ".join(f"{k}: {v}" for k, v in missing().items()))
        return names
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise GameError(f"--games names no game: {text!r}")
    out = [game(n).name for n in names]
    dup = sorted({n for n in out if out.count(n) > 1})
    if dup:
        raise GameError(f"--games names {', '.join(dup)} more than once")
    return out


def page_url(spec: GameSpec) -> str:
    return (PAGES / spec.page).as_uri()


def norms() -> dict[str, dict]:
    """name -> {"reference": mean score at the step budget, "random": ..., ...} from norms.json ({} if none)."""
    try:
        data = json.loads(NORMS.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise GameError(f"{NORMS} is not valid JSON: {e}") from e
    return data.get("games", {})
