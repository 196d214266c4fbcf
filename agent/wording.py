"""Small pieces of wording shared by the CLI and the app: counts with the right plural and
hotkeys written the way keyboards label them."""
from __future__ import annotations

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
    """A run's end reason (agent.loop stores the ending action's name or a sentence) for people:
    'click' -> 'the task ended after the agent's click'."""
    from agent.actions import REGISTRY

    if not reason:
        return "no reason given"
    if reason == "finished":
        return "the agent said the task is done"
    if reason == "call_user":
        return "the agent asked for help and the run ended"
    if reason in REGISTRY:
        return f"the task ended after the agent's {reason}"
    return reason
