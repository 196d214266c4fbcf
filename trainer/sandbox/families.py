"""The task families, easiest first, and how a seed picks one."""
from __future__ import annotations

import random

from trainer.sandbox.families_apps import ContextMenu, DialogAnswer, DragDrop, Form, MenuChoice, ScrollFind, Tabs
from trainer.sandbox.families_basic import CheckBoxes, ClickButton, Dropdown, ListPick, RadioChoice, Slider, TypeText
from trainer.sandbox.families_chain import SearchChain, SettingsChain
from trainer.sandbox.screen import SandboxError
from trainer.sandbox.task import Task

_ALL = [ClickButton, CheckBoxes, RadioChoice, Dropdown, ListPick, TypeText, Slider, Form, ScrollFind, MenuChoice,
        DialogAnswer, Tabs, ContextMenu, DragDrop, SettingsChain, SearchChain]
FAMILIES: dict[str, type[Task]] = {cls.family: cls for cls in sorted(_ALL, key=lambda c: c.level)}


def family_class(name: str) -> type[Task]:
    try:
        return FAMILIES[name]
    except KeyError:
        raise SandboxError(f"unknown task family {name!r}; known: {', '.join(FAMILIES)}") from None


def parse_families(text: str | None) -> list[str] | None:
    """'radio, tabs' -> ['radio', 'tabs'] (None when empty); SandboxError names every unknown one."""
    if not text:
        return None
    names = [f.strip() for f in text.split(",") if f.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise SandboxError(f"unknown sandbox families: {', '.join(unknown)}; known: {', '.join(FAMILIES)}")
    return names or None


def family_for_seed(seed: int, families: list[str] | None = None) -> str:
    """The family a seed gives when none is asked for (deterministic, roughly uniform)."""
    names = list(families or FAMILIES)
    return random.Random(f"family:{seed}").choice(names)
