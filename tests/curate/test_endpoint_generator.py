"""The endpoint path: a local OpenAI-compatible server (tests/eval/fake_chat_server.py)
grounds targets and writes reasoning; slow, failing, malformed, unparseable and
contradicting replies are counted by reason and never stop the run."""
import json
import re
import zlib

from curate_fixtures import oracle_config, read_jsonl
from guilibra_jax.curate import prompts as CP
from guilibra_jax.curate import run as CRUN
from guilibra_jax.data import readers as RD
from tests.eval.fake_chat_server import FakeChatServer

# A "slow" reply hangs until the server stops, so the client's TIMEOUT always ends it first;
# every other reply takes a millisecond, far within TIMEOUT however loaded the machine.
TIMEOUT = 2.0


def _user_text(body) -> str:
    parts = body["messages"][1]["content"]
    return "".join(p.get("text", "") for p in parts if p["type"] == "text")


def category(text: str) -> str:
    """The fake server's behaviour for a reasoning request, fixed by its text."""
    return ("contradicts_label", "unparsed", "failed:timeout", "accepted", "accepted")[zlib.crc32(text.encode()) % 5]


def fake_reply(served: list, closing):
    def reply(body):
        text, system = _user_text(body), body["messages"][0]["content"]
        if system == "You are a helpful assistant.":                         # a box request
            w, h = map(int, re.search(r"this (\d+)x(\d+) image", text).groups())
            if zlib.crc32(text.encode()) % 7 == 0:
                return "I cannot find it."
            return json.dumps([{"bbox_2d": [0, 0, w, h]}])                    # the whole screen
        cat = category(text)
        served.append(cat)
        gold = json.loads(text.split("Correct next action: ")[1])
        if cat == "failed:timeout":
            closing.wait(60)   # set when the server stops
        if cat == "unparsed":
            return "Sure! I would tap it."
        if cat == "contradicts_label":
            gold = dict(gold, action_type="Wait" if gold["action_type"] != "Wait" else "NavigateBack")
        return f"<think>Because {gold['action_description']}.</think><answer>{json.dumps(gold)}</answer>"
    return reply


def test_endpoint_grounds_and_writes_reasoning_counting_every_failure(world, tmp_path):
    inputs = list(RD.open_source(world.input, "native"))
    with_target = [r for r in inputs if r.target.point is not None and CP.box_target_text(r) is not None]
    names = [CP.box_target_text(r) for r in with_target]
    unique = next(n for n in names if names.count(n) == 1)
    served: list = []
    with FakeChatServer() as server:
        server.reply_fn = fake_reply(served, server.closing)
        server.script = {json.dumps(f'element "{unique}"')[1:-1]: ["malformed", "malformed"],  # its box: fails
                         "Correct next action": ["500"]}                        # a reasoning request: retried
        cfg = oracle_config(world, stages=("box", "reasoning"))
        cfg.box.sampler = "endpoint"
        cfg.reasoning.sampler = "auto"
        cfg.generator.update(url=server.url, timeout=TIMEOUT, retries=1, backoff=0.01, concurrency=8)
        report = CRUN.run_curation(cfg, str(tmp_path))
    st = report["stages"]
    box_removed = st["box"]["removed_by_reason"]
    assert box_removed["no_response"] == 1 and box_removed["no_box"] >= 1
    assert st["box"]["in"] - st["box"]["out"] == box_removed["no_response"] + box_removed["no_box"]
    assert st["box"]["kept_by_reason"]["point_inside_box"] == len(with_target) - 1 - box_removed["no_box"]
    # every reasoning request got the verdict its reply deserved; a timed-out one is seen twice (one retry)
    v = st["reasoning"]["verdicts"]
    want = {c: served.count(c) for c in set(served)}
    want["failed:timeout"] = want.get("failed:timeout", 0) // 2
    assert v == {k: n for k, n in want.items() if n}, (v, want)
    assert all(v.get(k, 0) > 0 for k in ("accepted", "contradicts_label", "unparsed", "failed:timeout"))
    kept = st["reasoning"]["kept_by_reason"]
    assert kept.get("no_response", 0) == v["failed:timeout"] // 2          # both tries of such a step time out
    requests = report["endpoint_requests"]
    assert requests["http_500"] == 1 and requests["malformed"] == 2 and requests["failed"] >= 1 + kept["no_response"]
    # what was written: the whole-screen box, and the reasoning of accepted replies only
    out = read_jsonl(tmp_path / "curated" / "sft.jsonl")
    assert len(out) == st["box"]["out"]
    boxed = [d for d in out if d["target"]["bbox"] is not None]
    assert len(boxed) == st["box"]["boxes_set"] and all(d["target"]["bbox"] == [0.0, 0.0, 1.0, 1.0] for d in boxed)
    had = {(r.trajectory_id, r.step) for r in inputs if r.reasoning is not None}
    new = [d for d in out if (d["trajectory_id"], d["step"]) not in had and d["reasoning"] is not None]
    assert len(new) == kept["written"] and all(d["reasoning"].startswith("Because ") for d in new)
