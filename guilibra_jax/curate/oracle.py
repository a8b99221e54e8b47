"""The ``oracle`` sampler: answers from the synthetic world's clean labels.

For the synthetic demo and the tests, where the records' true labels are known (the
clean export that the curated input was corrupted from): a stand-in for a model that is
right with probability ``accuracy`` per response and for a perfect grounder. It looks up
each prompt's step by (trajectory, step, platform) in the clean records, never at the
(possibly corrupted) label of the record being curated, and answers in the frame's
coordinate space like a model:

* action prompts: the clean action (``accuracy``), else a wrong one (another action
  type, or the point moved far away);
* box prompts: the clean element box (``bbox_2d``), or "not found" when it has none;
* reasoning prompts: a think block and the clean action (``accuracy``), else the wrong one.

It is not a model of anything: it makes the filter's decisions checkable against known
truth in seconds. Its random draws depend on the seed of the block only, so a resumed
run answers as an uninterrupted one.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from guilibra_jax import actions as A
from guilibra_jax.curate.prompts import Frame, Prompt, render_box
from guilibra_jax.curate.samplers import Reply, SamplingParams, family_frame
from guilibra_jax.data import images as I
from guilibra_jax.data import samples as S
from guilibra_jax.data.native import StepRecord


def step_key(r: StepRecord) -> tuple[str, int, str]:
    return (r.trajectory_id, r.step, r.platform)


def wrong_action(action: A.Action, rng: np.random.Generator) -> A.Action:
    """An action that the verifier does not credit for ``action``'s label."""
    if action.point_2d is not None and rng.random() < 0.5:
        x, y = action.point_2d
        return A.Action(action.action_type, action.action_description, action.value, (-x - 1000.0, -y - 1000.0),
                        action.action_target)
    other = "Wait" if action.action_type != "Wait" else "NavigateBack"
    return A.Action(other, "wrong", None, None)


class OracleSampler:
    """Answers from ``clean`` records (module doc), shown as ``family`` would see them."""

    name = "oracle"
    collective = False

    def __init__(self, clean: Sequence[StepRecord], family: str = "qwen2_5_vl", method: str = "guilibra", *,
                 accuracy: float = 0.8, min_pixels: int = 0, max_pixels: int = 0, delay_s: float = 0.0):
        if method != "guilibra":
            raise ValueError("the oracle sampler answers GUI-Libra actions only (method 'guilibra')")
        self.clean = {step_key(r): r for r in clean}
        self.family, self.accuracy, self.delay_s = family, float(accuracy), float(delay_s)
        self.spec = S.SampleSpec(method, family)
        self.img_cfg = I.processor_config(family, min_pixels=min_pixels or None, max_pixels=max_pixels or None)

    def frame(self, record) -> Frame:
        return family_frame(record, self.family, self.img_cfg)

    def _action(self, clean: StepRecord, frame: Frame) -> A.Action:
        return clean.target.action(frame.coord_space, image_size=clean.image_size, resized_size=frame.resized)

    def _answer(self, p: Prompt, clean: StepRecord, rng: np.random.Generator) -> str:
        if p.kind == "box":
            box = clean.target.bbox
            return render_box(box, p.frame) if box is not None else "I cannot find that element."
        action = self._action(clean, p.frame)
        right = rng.random() < self.accuracy
        if not right:
            action = wrong_action(action, rng)
        reasoning = f"The task is: {clean.instruction}. Next I {action.action_description or action.action_type}."
        return A.render_response(action, reasoning if p.kind == "reasoning" else None, self.family)

    def sample(self, prompts: Sequence[Prompt], params: SamplingParams, seed: int) -> list[list[Reply]]:
        if self.delay_s and prompts:
            time.sleep(self.delay_s)
        rng = np.random.default_rng(seed)
        out = []
        for p in prompts:
            clean = self.clean.get(step_key(p.record))
            if clean is None:
                out.append([Reply(None, "oracle_unknown_step")] * params.n)
            else:
                out.append([Reply(self._answer(p, clean, rng)) for _ in range(params.n)])
        return out
