"""The RL update: GRPO / GiGPO advantages, the PPO loss, row packing, log-probs, the optimizer, the
jitted train step, and the trained weights (full or LoRA) the update and the sampler share."""
