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
