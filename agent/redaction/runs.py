"""Which agent runs need their personal data taken out before they leave the machine, and how.

A supervised or autonomous run acts on a real screen (this desktop, a phone, a terminal): its
screenshots, the model's replies and the focused window's title hold whatever was on that screen.
A sandbox rollout's screens are synthetic (the sandbox draws them), so it is sent as it is.

The team's setting `privacy.runs` says how a real run is cleared:
    auto     (default) the same recognizers as the privacy review blur the frames and mask the
             text, decided by AUTOMATIC, when the run is first uploaded or exported
    review   like a recording: not sent until a person approved its privacy review
"""
from __future__ import annotations

from agent.redaction import RedactionError

RUNS_KEY = "privacy.runs"
RUN_MODES = ("auto", "review")
AUTOMATIC = "automatic redaction"  # who decided, in the plan and the upload's record
RUN_KINDS = ("supervised", "autonomous")
SYNTHETIC_PLATFORMS = ("sandbox",)


def real_run(ep) -> bool:
    """A supervised or autonomous run on a real screen (not the sandbox's synthetic one)."""
    return ep.kind in RUN_KINDS and ep.platform not in SYNTHETIC_PLATFORMS


def runs_mode(store) -> str:
    """The store's `privacy.runs` setting; RedactionError naming the value when it is neither mode."""
    mode = store.get_setting(RUNS_KEY, "auto")
    if mode not in RUN_MODES:
        raise RedactionError(f"setting {RUNS_KEY} must be one of {', '.join(RUN_MODES)}, got {str(mode)[:40]!r}")
    return mode
