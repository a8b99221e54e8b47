"""The ASFT trainer: the jitted step (step.py) and the trainer the run harness drives (trainer.py)."""
