"""Training: the run harness (run.py), the ASFT trainer (sft/), the stage-2 trainer for
GRPO and UI-MOPD (rl/), and what they share (state, checkpoints, metrics, plans, export)."""
