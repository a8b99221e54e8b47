"""GUI-Libra's data curation (docs/method.md) with our own sampler.

    python -m launch.curate --config=configs/curate.py[:arg] --workdir=DIR

Stages, each resumable (``stage_log``) and each over the records the previous one kept:

1. ``consistency`` (:mod:`.stages`): K sampled responses per step, match frequency
   against the label under the verifier's own rules, keep steps at or above a threshold.
2. ``box``: the model's box for the step's ``action_target``; keep the step when the
   label's point lies inside, and store the box as the record's ``bbox``.
3. ``reasoning``: a think block for steps without one, written by a generator that sees
   the gold action; responses that contradict the label are rejected and counted.
4. ``rebalance``: the RL subset, down-sampled by step and domain (``data.mixing``).

Samplers (:mod:`.samplers`) are pluggable per stage: our checkpoint over the mesh
(``model``), an OpenAI-compatible server (``endpoint``), or, for the synthetic demo and
tests, the world's own labels (``oracle``, :mod:`.oracle`). :mod:`.run` drives the
stages and writes the curated sets and ``curation_report.md`` / ``.json``.
"""
