"""The data flywheel (UI-TARS-2): score new episodes, route them (SFT / CT / rejected), retrain
CT -> SFT -> PPO from the current model, evaluate on held-out sandbox seeds, register the new
version and promote it only when it is better, then announce it to connected apps.

Modules, one job each: scoring (outcomes and rule checks), routing (pools, the decision table,
corrections), registry (model versions, lineage, the current pointer), evaluation (held-out
success), merge (parameter interpolation), iteration (one turn of the wheel), announce (tell the
backend), cli (`python main.py flywheel ...`). Importing any of them loads no model.
"""
from trainer.errors import TrainerError


class FlywheelError(TrainerError):
    """Bad input or state in the flywheel; the message names what was wrong, with the value."""
