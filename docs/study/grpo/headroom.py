"""Where GRPO can learn and what it changed: per held-out offline step, whether each GRPO
study model's greedy answer succeeds and how many of K samples at the rollout temperature
succeed (a group whose samples all fail, or all pass, carries no advantage). Against the
first model (the SFT start): the steps each model fixed and broke, with the start's and the
model's sample pass counts, by label type.

    python docs/study/grpo/headroom.py WORKDIR K sft grpo_online_onpath ... > headroom.json

WORKDIR is the study's folder (launch.study --study=grpo); the held-out steps are the SFT
eval stage's (eval_<first model>/data, test split), the same for every model."""
import collections
import json
import sys

from configs import grpo_demo
from configs import study_grpo as S
from guilibra_jax.eval import agents as AG
from guilibra_jax.eval import model_agent as MA
from guilibra_jax.eval import offline as OFF
from guilibra_jax.eval import run as ER

TEMPERATURE = grpo_demo.get_config().rl.temperature
SEED = 1


def outcomes(root: str, model: str, records, data_dir: str, k: int) -> list[dict]:
    """Per record: greedy success, greedy answer type and the number of the K samples that succeed."""
    rows = [dict(label=r.target.action_type) for r in records]
    for temperature, reps in ((0.0, 1), (TEMPERATURE, k)):
        agent = MA.make_checkpoint_agent(hf_path=f"{root}/{model}/export", temperature=temperature,
                                         batch_size=64, seed=SEED)
        space, resize = agent.coord_space, agent.resized_size
        repeated = [r for r in records for _ in range(reps)]
        texts = AG.responses_for_records(agent, repeated, data_dir)
        for i, (rec, text) in enumerate(zip(repeated, texts)):
            out = OFF.score_step(rec, text, space,
                                 OFF.resized_size_of(resize, tuple(rec.image_size), rec.platform))
            row = rows[i // reps]
            if temperature == 0.0:
                row["greedy"] = out.step_success
                pred = OFF.parse_prediction(text, rec.image_size, space,
                                            OFF.resized_size_of(resize, tuple(rec.image_size), rec.platform))
                row["greedy_type"] = pred.action.action_type if pred.action else "unparsed"
            else:
                row["passes"] = row.get("passes", 0) + int(out.step_success)
    return rows


def summary(rows: list[dict], k: int) -> dict:
    wrong = [r for r in rows if not r["greedy"]]
    return {"steps": len(rows), "greedy_success": round(sum(r["greedy"] for r in rows) / len(rows), 3),
            "sample_success": round(sum(r["passes"] for r in rows) / (len(rows) * k), 3),
            "pass_at_k": round(sum(r["passes"] > 0 for r in rows) / len(rows), 3),
            "greedy_wrong": len(wrong),
            "greedy_wrong_with_a_passing_sample": sum(r["passes"] > 0 for r in wrong),
            "all_samples_pass": sum(r["passes"] == k for r in rows),
            "no_sample_passes": sum(r["passes"] == 0 for r in rows)}


def changes(start: list[dict], rows: list[dict]) -> dict:
    """Steps whose greedy success flipped, as "label: start passes -> model passes (answer type)"."""
    def line(a, b):
        return f"{a['label']}: {a['passes']} -> {b['passes']} ({b['greedy_type']})"
    fixed = [line(a, b) for a, b in zip(start, rows) if not a["greedy"] and b["greedy"]]
    broken = [line(a, b) for a, b in zip(start, rows) if a["greedy"] and not b["greedy"]]
    by_label = collections.Counter(a["label"] for a, b in zip(start, rows) if a["greedy"] and not b["greedy"])
    return {"fixed": len(fixed), "broken": len(broken), "broken_by_label": dict(by_label.most_common()),
            "fixed_steps": fixed, "broken_steps": broken}


if __name__ == "__main__":
    root, k, models = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    config = S.eval_config(f"{root}/{models[0]}/export")
    records, data_dir = ER._dataset(config, f"{root}/eval_{models[0]}")
    per = {m: outcomes(root, m, records, data_dir, k) for m in models}
    start = per[models[0]]
    out = {"steps": f"held-out offline steps of eval_{models[0]}/data (test split)",
           "samples_per_step": k, "temperature": TEMPERATURE, "start": models[0],
           "models": {m: {**summary(rows, k), **({} if m == models[0] else changes(start, rows))}
                      for m, rows in per.items()},
           "start_by_label": {lab: {"steps": sum(r["label"] == lab for r in start),
                                    "greedy_right": sum(r["greedy"] for r in start if r["label"] == lab),
                                    "greedy_wrong_with_a_passing_sample":
                                        sum(r["passes"] > 0 for r in start if r["label"] == lab and not r["greedy"])}
                              for lab in sorted({r["label"] for r in start})}}
    json.dump(out, sys.stdout, indent=1)
