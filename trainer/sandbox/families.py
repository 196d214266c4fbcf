"""The task families, easiest first, and how a seed picks one.

FAMILIES are the GUI-only families, the default of every training run and evaluation;
HYBRID_FAMILIES (trainer.sandbox.families_hybrid and _bulk: GUI and terminal/file tools over one workspace)
are played only when named (`--families`), so a default run is what it was before them."""
from __future__ import annotations

import random

from trainer.sandbox.families_apps import ContextMenu, DialogAnswer, DragDrop, Form, MenuChoice, ScrollFind, Tabs
from trainer.sandbox.families_basic import CheckBoxes, ClickButton, Dropdown, ListPick, RadioChoice, Slider, TypeText
from trainer.sandbox.families_chain import SearchChain, SettingsChain
from trainer.sandbox.families_hybrid import ConfigToForm, ExportCount, FormToFile, HybridTask
from trainer.sandbox.families_hybrid_bulk import BulkRename, OutputDecides, ToolTrap
from trainer.sandbox.screen import SandboxError
from trainer.sandbox.task import Task

_ALL = [ClickButton, CheckBoxes, RadioChoice, Dropdown, ListPick, TypeText, Slider, Form, ScrollFind, MenuChoice,
        DialogAnswer, Tabs, ContextMenu, DragDrop, SettingsChain, SearchChain]
FAMILIES: dict[str, type[Task]] = {cls.family: cls for cls in sorted(_ALL, key=lambda c: c.level)}
_HYBRID = [ExportCount, ConfigToForm, FormToFile, BulkRename, OutputDecides, ToolTrap]
HYBRID_FAMILIES: dict[str, type[HybridTask]] = {cls.family: cls for cls in _HYBRID}


def family_class(name: str) -> type[Task]:
    try:
        return FAMILIES.get(name) or HYBRID_FAMILIES[name]
    except KeyError:
        raise SandboxError(f"unknown task family {name!r}; known: {', '.join([*FAMILIES, *HYBRID_FAMILIES])}") from None


def is_hybrid(name: str) -> bool:
    """Whether family `name` is one of the hybrid (GUI and tools) families."""
    return name in HYBRID_FAMILIES


def parse_families(text: str | None) -> list[str] | None:
    """'radio, tabs' -> ['radio', 'tabs'] (None when empty); SandboxError names every unknown one."""
    if not text:
        return None
    names = [f.strip() for f in text.split(",") if f.strip()]
    if names == ["hybrid"]:  # shorthand for every hybrid family
        return list(HYBRID_FAMILIES)
    unknown = [n for n in names if n not in FAMILIES and n not in HYBRID_FAMILIES]
    if unknown:
        raise SandboxError(f"unknown sandbox families: {', '.join(unknown)}; known: "
                           f"{', '.join([*FAMILIES, *HYBRID_FAMILIES])} (or 'hybrid' for all of the hybrid ones)")
    return names or None


def family_for_seed(seed: int, families: list[str] | None = None) -> str:
    """The family a seed gives when none is asked for (deterministic, roughly uniform)."""
    names = list(families or FAMILIES)
    return random.Random(f"family:{seed}").choice(names)
