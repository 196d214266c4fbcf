"""Small pieces of wording shared by the CLI and the app: counts with the right plural and
hotkeys written the way keyboards label them."""
from __future__ import annotations

from agent import coords
from agent.actions import REGISTRY

_KEY_LABELS = {"ctrl": "Ctrl", "alt": "Alt", "shift": "Shift", "cmd": "Cmd", "super": "Super", "win": "Win",
               "enter": "Enter", "esc": "Esc", "space": "Space", "tab": "Tab"}


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 step', '2 steps', '0 steps'; `many` for irregular words ('1 reply', '2 replies')."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def hotkey_label(hotkey: str) -> str:
    """'<ctrl>+<alt>+<shift>+k' (pynput) or 'ctrl+alt+shift+k' -> 'Ctrl+Alt+Shift+K'."""
    parts = [p.strip().strip("<>").lower() for p in hotkey.split("+") if p.strip()]
    return "+".join(_KEY_LABELS.get(p, p.upper() if len(p) == 1 else p.capitalize()) for p in parts)


def stop_reason(reason: str | None, who: str = "the supervisor") -> str:
    """Why a run stopped, said once: a reason that already says who stopped it is kept as is
    ('stopped by Ana'), else it follows 'stopped by the supervisor: '."""
    reason = (reason or "").strip().rstrip(".")
    if not reason:
        return f"stopped by {who}"
    if "stop" in reason.lower():
        return reason
    return f"stopped by {who}: {reason}"


def end_reason_text(reason: str | None) -> str:
    """A run's end reason (agent.run.loop stores the ending action's name or a sentence) for people:
    'click' -> 'the task ended after the agent's click'."""
    if not reason:
        return "no reason given"
    if reason == "finished":
        return "the agent said the task is done"
    if reason == "call_user":
        return "the agent asked for help and the run ended"
    if reason in REGISTRY:
        return f"the task ended after the agent's {reason}"
    return reason


def visible_text(s: str, limit: int = 80) -> str:
    """Text as a label shows it: newlines and tabs made visible, long text cut."""
    s = s.replace("\n", "⏎").replace("\t", "⇥")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def action_summary(action, image_w: int, image_h: int) -> str:
    """One line for a step list: the action (an agent.schema.Action) and its points in
    screenshot pixels."""
    parts = []
    for k, v in action.args.items():
        if isinstance(v, tuple):
            x, y = coords.normalized_to_image(v, image_w, image_h)
            parts.append(f"{x:.0f},{y:.0f}")
        elif k == "direction":
            parts.append(str(v))
        else:
            parts.append(f"“{visible_text(str(v), 28)}”")
    if action.name == "drag" and len(parts) == 2:
        return f"drag {parts[0]} → {parts[1]}"
    return " ".join([action.name, *parts])


def outcome_name(success: bool | None) -> str:
    return {None: "unknown", True: "success", False: "failure"}[success]


def command_name() -> str:
    """How the person at this installation runs Tandem's commands: `tandem` from the package or
    the bundle, `python main.py` from a checkout."""
    import sys
    from pathlib import Path

    return "tandem" if getattr(sys, "frozen", False) or Path(sys.argv[0]).name.startswith("tandem") else "python main.py"
