"""Playing episodes: the episode runner, the actors, the local and Ray rollout pools, grounding and
MiniWoB evaluation, and the `sandbox` command."""
