"""Policies behind one interface: propose(instruction, memory, observation, feedback) -> Proposal.

Back ends: ReplayPolicy (scripted responses), EndpointPolicy (an OpenAI-compatible server),
LocalVLMPolicy (a transformers Qwen2.5-VL-class model from a directory). Importing this package
loads no model and no torch."""
from agent.policies.base import Policy, PolicyError, Proposal, build_prompt
from agent.policies.endpoint import EndpointPolicy
from agent.policies.replay import ReplayPolicy, load_responses

__all__ = ["Policy", "PolicyError", "Proposal", "build_prompt", "EndpointPolicy", "ReplayPolicy", "load_responses",
           "LocalVLMPolicy"]


def __getattr__(name):  # LocalVLMPolicy pulls in torch/transformers: only on demand
    if name == "LocalVLMPolicy":
        from agent.policies.local import LocalVLMPolicy  # lazy: cycle with agent.policies.local

        return LocalVLMPolicy
    raise AttributeError(name)
