"""A Policy from a person's choice: the one place the agent CLI, the app's run form and the
sandbox's eval turn "replay / endpoint / local / default" plus their inputs into a policy.

Each caller names the inputs its own way (`--base-url` on a command line, "a base URL" on a
form), so a `Spelling` says how; the rules and the checks are the same for all. Nothing heavy
happens here: a local model loads on its first proposal. Errors are PolicyError, naming the
missing or unusable input as the caller spells it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent import coords
from agent.policies.base import Policy, PolicyError
from agent.policies.endpoint import EndpointPolicy
from agent.policies.local import LocalVLMPolicy
from agent.policies.replay import ReplayPolicy
from agent.storage.model_files import DEFAULT_MODEL_DIR
from agent.vlm.model import VLMError, lora_adapter_base
from agent.wording import command_name

POLICY_CHOICES = ("replay", "endpoint", "local", "default")


@dataclass(frozen=True)
class Spelling:
    """How a caller names the choice and each input in its error messages."""

    policy: str  # with {choice}: "--policy {choice}", "the {choice} policy"
    responses: str
    base_url: str
    model: str
    model_dir: str


FORM = Spelling("the {choice} policy", "a responses file (one JSON string per line)", "a base URL", "a model name",
                "a model directory")
CLI = Spelling("--policy {choice}", "--responses FILE.jsonl", "--base-url", "--model", "--model-dir DIR")


def make_policy(choice: str, *, responses=None, base_url: str | None = None, model: str | None = None,
                api_key: str | None = None, model_dir=None, platform: str = "desktop", space: str | None = None,
                tools: bool = False, max_images: int | None = None, spelling: Spelling = FORM) -> Policy:
    """The Policy for `choice` (POLICY_CHOICES). "default" is the shipped small model unless
    `model_dir` names another; "local" needs `model_dir`: a whole model or a LoRA adapter naming
    its base. PolicyError names what is missing or unusable."""
    if choice not in POLICY_CHOICES:
        raise PolicyError(f"policy must be one of {', '.join(POLICY_CHOICES)}, got {choice!r}")
    who = spelling.policy.format(choice=choice)
    kw = {"platform": platform, "space": space or coords.SMART_RESIZE, "tools": tools}
    try:
        if choice == "replay":
            if not responses:
                raise PolicyError(f"{who} needs {spelling.responses}")
            return ReplayPolicy(responses, **kw)
        if choice == "endpoint":
            if not (base_url and model):
                raise PolicyError(f"{who} needs {spelling.base_url} and {spelling.model}")
            extra = {} if max_images is None else {"max_images": max_images}
            return EndpointPolicy(base_url, model, api_key or None, **extra, **kw)
        if choice == "local" and not model_dir:
            raise PolicyError(f"{who} needs {spelling.model_dir}")
        d = Path(model_dir) if model_dir else DEFAULT_MODEL_DIR
        check_model_dir(d, who=who, default=choice == "default")

        return LocalVLMPolicy(str(d), **kw)
    except ValueError as e:  # a constructor's refusal (an unknown coordinate space, ...)
        raise PolicyError(str(e)) from None


def check_model_dir(d: Path, *, who: str = "a local policy", default: bool = False) -> None:
    """PolicyError unless `d` holds a whole model (config.json) or a LoRA adapter naming its base."""
    hint = f"; train the default model with `{command_name()} train default`" if default else ""
    if not d.is_dir():
        raise PolicyError(f"{who} needs a model directory; {str(d)!r} does not exist{hint}")
    try:  # a whole model, or a LoRA adapter (`train sft|ppo --lora`) naming its base
        adapter = lora_adapter_base(d) is not None
    except VLMError as e:
        raise PolicyError(f"{who}: {e}") from None
    if not ((d / "config.json").exists() or adapter):
        raise PolicyError(f"{who}: no model in {d} (config.json is missing, and it is no LoRA adapter either){hint}")
