"""How many different first clicks a MiniWoB++ agent makes per task over its held-out seeds
(1 = the same point whatever the screen shows): the diagnostic behind docs/miniwob.md's
finding that the tiny Qwen2.5-VL-shaped model clicks from the instruction alone.

    python docs/study/miniwob/first_clicks.py EVAL_WORKDIR [AGENT] > first_clicks.json

EVAL_WORKDIR is a launch.eval folder (trajectories/AGENT/TASK-SEED/trajectory.json);
AGENT defaults to "checkpoint"."""
import collections
import glob
import json
import os
import sys


def first_clicks(eval_dir: str, agent: str = "checkpoint") -> dict:
    points, success = collections.defaultdict(list), collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(eval_dir, "trajectories", agent, "*", "trajectory.json"))):
        with open(path) as f:
            t = json.load(f)
        # the first step's first click, as the page received it (None: no click in that step)
        events = t["trajectory"][0]["events"] if t["trajectory"] else []
        point = next((tuple(e["point"]) for e in events if e["kind"] == "click"), None)
        points[t["task"]].append(point)
        success[t["task"]].append(bool(t["success"]))
    tasks = {task: {"episodes": len(p), "distinct_first_clicks": len({x for x in p if x is not None}),
                    "first_action_not_a_click": sum(x is None for x in p),
                    "success": sum(success[task]) / len(p)} for task, p in sorted(points.items())}
    one = [k for k, v in tasks.items() if v["distinct_first_clicks"] == 1 and v["first_action_not_a_click"] == 0]
    return {"eval_dir": eval_dir, "agent": agent, "tasks": tasks,
            "tasks_with_one_first_click_for_every_seed": one}


if __name__ == "__main__":
    out = first_clicks(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "checkpoint")
    json.dump(out, sys.stdout, indent=1)
    print()
