"""The MiniWoB++ oracle: the next action read off the page (its DOM and the task's own fields),
acted out through the adapter exactly as a model's reply would be.

It checks the adapter (clicks land where the element is, typing and keys reach the page,
episodes end as MiniWoB says), not a model: an oracle that fails points at the adapter. It knows
the tasks in ORACLES; `oracle_action` names them for any other.
"""
from __future__ import annotations

from agent.schema import Action
from trainer.sandbox.miniwob_browser import TASK_HEIGHT, TASK_WIDTH, MiniWoBError


def _num(v) -> float:
    return float(v[0]) if hasattr(v, "__len__") else float(v)


def element_box(e: dict) -> tuple[float, float, float, float]:
    """A DOM element's box (x0, y0, x1, y1), normalized to the task area."""
    x, y, w, h = _num(e["left"]), _num(e["top"]), _num(e["width"]), _num(e["height"])
    return x / TASK_WIDTH, y / TASK_HEIGHT, (x + w) / TASK_WIDTH, (y + h) / TASK_HEIGHT


def _click(e: dict, thought: str) -> tuple[str, Action]:
    x0, y0, x1, y1 = element_box(e)
    centre = (min(max((x0 + x1) / 2, 0.0), 1.0), min(max((y0 + y1) / 2, 0.0), 1.0))
    return thought, Action("click", {"start_box": centre})


def _field(raw: dict, key: str) -> str:
    for k, v in raw["fields"]:
        if k == key:
            return v
    raise MiniWoBError(f"the task's fields have no {key!r}: {list(raw['fields'])}")


def _one(raw: dict, what: str, pred) -> dict:
    for e in raw["dom_elements"]:
        if pred(e):
            return e
    raise MiniWoBError(f"no {what} on the page (utterance {raw['utterance']!r})")


def _by_id(raw: dict, id_: str) -> dict:
    return _one(raw, f"element #{id_}", lambda e: e["id"] == id_)


def _children(raw: dict, parent: dict) -> list[dict]:
    return [e for e in raw["dom_elements"] if int(e["parent"]) == int(parent["ref"])]


def _focused(e: dict) -> bool:
    return bool(e["flags"][0])


def _click_test(raw):
    return _click(_by_id(raw, "subbtn"), "The only button is the one to click.")


def _click_button(raw):
    target = _field(raw, "target")
    button = _one(raw, f"button {target!r}", lambda e: e["tag"] == "button" and e["text"] == target)
    return _click(button, f"Click the button labelled {target!r}.")


def _click_link(raw):
    target = _field(raw, "target")
    link = _one(raw, f"link {target!r}", lambda e: "alink" in e["classes"].split() and e["text"] == target)
    return _click(link, f"Click the link {target!r}.")


def _focus_text(raw):
    return _click(_by_id(raw, "tt"), "Click into the text box to focus it.")


def _enter_text(raw):
    target = _field(raw, "target")
    box = _by_id(raw, "tt")
    if box["value"] == target:
        return _click(_by_id(raw, "subbtn"), f"The field holds {target!r}; press Submit.")
    if not _focused(box):
        return _click(box, "Click into the text field first.")
    if box["value"]:
        return "Select what the field holds, to type over it.", Action("hotkey", {"key": "ctrl a"})
    return f"Type {target!r}.", Action("type", {"content": target})


def _select_and_submit(raw, kind: str, wanted: set[str]):
    """Tick exactly the labels in `wanted` among the page's `kind` inputs (checkbox or radio), then Submit."""
    for label in (e for e in raw["dom_elements"] if e["tag"] == "label"):
        kids = _children(raw, label)
        box = next((k for k in kids if k["tag"] == f"input_{kind}"), None)
        text = " ".join(k["text"] for k in kids if k["tag"] == "t").strip()
        if box is None:
            continue
        if (box["value"] == "True") != (text in wanted):
            return _click(box, f"{'Tick' if text in wanted else 'Untick'} {text!r}.")
    return _click(_by_id(raw, "subbtn"), "The right boxes are ticked; click Submit.")


def _click_checkboxes(raw):
    wanted = {v for k, v in raw["fields"] if k.startswith("target")}
    return _select_and_submit(raw, "checkbox", wanted)


def _click_option(raw):
    return _select_and_submit(raw, "radio", {_field(raw, "target")})


def _click_test_2(raw):
    target = _field(raw, "target")
    button = _one(raw, f"button {target!r}", lambda e: e["tag"] == "button" and e["text"] == target)
    return _click(button, f"Click button {target}.")


def _click_dialog(raw):
    close = _one(raw, "the dialog's close button", lambda e: "ui-dialog-titlebar-close" in e["classes"].split())
    return _click(close, "Close the dialog with its x.")


ORACLES = {"click-test": _click_test, "click-test-2": _click_test_2, "click-button": _click_button,
           "click-link": _click_link, "focus-text": _focus_text, "enter-text": _enter_text,
           "click-checkboxes": _click_checkboxes, "click-option": _click_option, "click-dialog": _click_dialog}


def oracle_action(task: str, raw: dict) -> tuple[str, Action]:
    """The next (thought, action) for `task` from miniwob's observation `raw`."""
    fn = ORACLES.get(task)
    if fn is None:
        raise MiniWoBError(f"the oracle does not know MiniWoB++ task {task!r}; it knows {', '.join(sorted(ORACLES))}")
    if not raw["dom_elements"]:
        raise MiniWoBError(f"{task}: the episode is over, there is no page to read")
    return fn(raw)
