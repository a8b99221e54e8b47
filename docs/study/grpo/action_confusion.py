"""Which action each GRPO study model answers on held-out offline steps when it answers the
wrong action type (label -> answer counts): the diagnostic behind the report's finding that
online GRPO taught on-path states the recovery actions of off-path ones.

    python docs/study/grpo/action_confusion.py WORKDIR sft grpo_online_warm ... > action_confusion.json

WORKDIR is the study's folder (launch.study --study=grpo); each model's held-out data is its
eval stage's (eval_<model>/data)."""
import collections
import json
import sys

from configs import study_grpo as S
from guilibra_jax.eval import agents as AG
from guilibra_jax.eval import offline as OFF
from guilibra_jax.eval import run as ER


def confusion(root: str, model: str) -> dict[str, int]:
    config = S.eval_config(f"{root}/{model}/export")
    records, data_dir = ER._dataset(config, f"{root}/eval_{model}")
    _, agent, _ = next(ER._agents(config))
    space, resize = ER._scoring_space(config, agent)
    counts = collections.Counter()
    for rec, resp in zip(records, AG.responses_for_records(agent, records, data_dir)):
        pred = OFF.parse_prediction(resp, rec.image_size, space,
                                    OFF.resized_size_of(resize, tuple(rec.image_size), rec.platform))
        got = pred.action.action_type if pred.action else "unparsed"
        if got != rec.target.action_type:
            counts[f"{rec.target.action_type} -> {got}"] += 1
    return dict(counts.most_common())


if __name__ == "__main__":
    root, models = sys.argv[1], sys.argv[2:]
    json.dump({"steps": "held-out offline steps of eval_<model>/data (test split)",
               "wrong_action_type": {m: confusion(root, m) for m in models}}, sys.stdout, indent=1)
