"""Running an agent: the loop, the gate and its remote side, the terminal supervisor, decision
statistics and the `agent` command."""
