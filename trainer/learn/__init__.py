"""Learning from episodes: SFT, DPO, PPO, LoRA, distributed training, memory plans, metrics,
checkpoints and the `train` command."""
