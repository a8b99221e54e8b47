"""The stage-2 trainer shared by GUI-Libra's conservative GRPO and UI-MOPD.

setup.py      the run's fixed parts (policy, frozen models, jitted update): ``Stage2``
layout.py     host rows -> global arrays on the mesh, per-call row chunks and copies
phases.py     rollout -> reward -> (group filter) -> score -> update, and their metrics
trainer.py    the trainer object the run harness drives
rollout.py    rollout rows, rewards, and the model batches built from them
advantages.py group-relative advantages, SNGS, the MOPD pass-rate floor and KL mask
frozen.py     reference and teacher models that only score
online.py     live-world prompts (``rl.world``)
step.py       the jitted RL update (clipped policy gradient + KL terms)
plan.py       the memory plan of a stage-2 run's programs
"""
