"""The re-ask rule: what happens after a model reply that does not parse, stated once for the agent
loop (agent.run.loop) and the trainer's episode runner (trainer.rollout.runner), so an agent's run and a
measured or trained rollout follow the same rule.

A reply that does not parse is never executed (no action is performed, no environment is
stepped). The policy is asked again for the same screen, told why (`feedback`). After
`max_reasks` re-asks in a row the episode ends (None: no limit but the step limit). With
`charge_step` the unparsed reply uses up one of the episode's steps, as the episode runner
counts them (an RL policy cannot buy retries); the agent loop counts executed steps only.
"""
from __future__ import annotations

from dataclasses import dataclass


def reask_feedback(reason: str) -> str:
    """What the policy is told when its reply did not parse."""
    return (f"Your previous output could not be used: {reason}. Answer again in the required format:\n"
            "Thought: ...\nAction: ...")


@dataclass(frozen=True)
class ReaskRule:
    max_reasks: int | None = 2  # re-asks in a row after unparseable replies; None: until the step limit
    charge_step: bool = False  # an unparsed reply counts toward the episode's step limit

    def __post_init__(self):
        if self.max_reasks is not None and (isinstance(self.max_reasks, bool) or not isinstance(self.max_reasks, int)
                                            or self.max_reasks < 0):
            raise ValueError(f"ReaskRule.max_reasks must be None or an integer >= 0, got {self.max_reasks!r}")

    def feedback(self, reason: str) -> str:
        return reask_feedback(reason)

    def gives_up(self, failures: int) -> bool:
        """True when `failures` unparsed replies in a row end the episode."""
        return self.max_reasks is not None and failures > self.max_reasks
