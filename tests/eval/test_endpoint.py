"""The chat endpoint client and the ``endpoint`` agent against a local fake server:
slow, failing and malformed replies are retried and counted, never fatal; requests run
concurrently up to the limit; the agent's prompt is the training pipeline's, with the
screenshot resized to the run's budget."""
import base64
import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from guilibra_jax.chat_endpoint import ChatEndpoint, image_data_url
from tests.eval.fake_chat_server import FakeChatServer


def _req(key):
    return {"messages": [{"role": "user", "content": f"request {key}"}], "max_tokens": 8}


def test_slow_failing_and_malformed_replies_are_retried_and_counted():
    # SLOW's first reply comes only when the server stops: it times out on any machine, while
    # every other reply (a millisecond) has 2 s, however loaded the machine.
    with FakeChatServer(reply="fine", slow_seconds=None) as server:
        server.script = {"A": [], "SLOW": ["slow"], "FIVE": ["500", "503"], "BAD": ["malformed", "empty"],
                         "DEAD": ["500"] * 10, "REJECT": ["400"], "BUSY": ["429"], "DROP": ["drop"]}
        ep = ChatEndpoint(server.url, timeout=2.0, retries=2, backoff=0.01, concurrency=4)
        keys = ["A", "SLOW", "FIVE", "BAD", "DEAD", "REJECT", "BUSY", "DROP"]
        results = dict(zip(keys, ep.chat_many([_req(k) for k in keys])))
    for k in ("A", "SLOW", "FIVE", "BAD", "BUSY", "DROP"):
        assert results[k].text == "fine", (k, results[k])
    assert [results[k].attempts for k in ("A", "SLOW", "FIVE", "BAD", "BUSY", "DROP")] == [1, 2, 3, 3, 2, 2]
    assert results["SLOW"].errors == ["timeout"] and results["FIVE"].errors == ["http_500", "http_503"]
    assert results["BAD"].errors == ["malformed", "malformed"]
    assert results["DEAD"].text is None and results["DEAD"].attempts == 3 and results["DEAD"].error == "http_500"
    assert results["REJECT"].text is None and results["REJECT"].attempts == 1    # a 4xx is not retried
    assert results["REJECT"].error.startswith("http_400")
    assert ep.summary() == {"ok": 6, "timeout": 1, "http_500": 4, "http_503": 1, "malformed": 2, "http_400": 1,
                            "http_429": 1, "connection": 1, "failed": 2}


def test_concurrency_is_bounded_and_used():
    # The server answers only once three requests were in flight at once: a client that never
    # overlaps them would time out (errors, not "x"); one that overlaps more shows in the count.
    with FakeChatServer(reply="x", together=3) as server:
        server.script = {"S": ["together"] * 12}
        ep = ChatEndpoint(server.url, model="m", timeout=30, retries=0, concurrency=3)
        results = ep.chat_many([_req(f"S{i}") for i in range(9)])
    assert [r.text for r in results] == ["x"] * 9, [r.errors for r in results]
    assert server.max_in_flight == 3 and len(server.requests) == 9


def test_model_name_is_listed_from_the_server_and_the_key_is_sent():
    with FakeChatServer(model="served/export") as server:
        ep = ChatEndpoint(server.url + "/chat/completions", api_key="sk-test", retries=0)
        ep.chat([{"role": "user", "content": "hi"}], temperature=0.0)
    body, headers = server.requests[0], server.headers[0]
    assert body["model"] == "served/export" and body["temperature"] == 0.0
    assert headers["Authorization"] == "Bearer sk-test"


def test_an_unreachable_server_is_counted_not_raised():
    with FakeChatServer() as server:
        url = server.url
    ep = ChatEndpoint(url, model="m", timeout=0.5, retries=1, backoff=0.01)
    r = ep.chat([{"role": "user", "content": "hi"}])
    assert r.text is None and r.error == "connection" and ep.summary() == {"connection": 2, "failed": 1}


def test_image_data_url_round_trips_the_pixels():
    arr = np.random.default_rng(0).integers(0, 255, (17, 23, 3), dtype=np.uint8)
    url = image_data_url(arr)
    assert url.startswith("data:image/png;base64,")
    back = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))))
    np.testing.assert_array_equal(back, arr)


# ----------------------------------------------------------------------------- the agent

@pytest.fixture
def run_dir(tmp_path):
    from guilibra_jax.train import config as RC
    c = RC.base_config()
    c.data.system_prompt = "GUI agent on a {platform}. Actions: {actions}."
    c.data.min_pixels, c.data.max_pixels = 56 * 56, 112 * 112
    c.data.pixels = {"mobile": (56 * 56, 84 * 84)}
    with open(tmp_path / "config.json", "w") as f:
        json.dump(c.to_dict(), f)
    return str(tmp_path)


def test_agent_prompt_is_the_pipelines_with_the_image_resized_to_the_platform_budget(run_dir):
    from guilibra_jax import actions as A
    from guilibra_jax.data import prompts as P
    from guilibra_jax.data import samples as S
    from guilibra_jax.envs.env import make_env
    from guilibra_jax.eval import endpoint_agent  # noqa: F401 (registers "endpoint")
    from guilibra_jax.eval.agents import make_agent

    reply = A.render_response(A.Action("Click", "the button", None, (10, 20)), "Because.")
    with FakeChatServer(reply=reply) as server:
        server.script = {"desktop": ["500"]}
        agent = make_agent("endpoint", url=server.url, run_config=run_dir, family="qwen2_5_vl", backoff=0.01,
                           fmt="tool_call", coord_space="unit")
        observations = [make_env(p, 3).reset() for p in ("desktop", "mobile")]
        assert agent.respond_batch(observations) == [reply, reply]
    assert agent.fmt == "guilibra" and agent.coord_space == "resized_pixels"
    assert agent.stats() == {"http_500": 1, "ok": 2}
    for obs, budget in zip(observations, ((56 * 56, 112 * 112), (56 * 56, 84 * 84))):
        body = next(b for b in server.requests if obs.platform in json.dumps(b["messages"]))
        system, user = body["messages"][0]["content"], body["messages"][1]["content"]
        assert body["temperature"] == 0.0 and body["max_tokens"] == 256
        w, h = A.resized_size_for(obs.screen_size, "qwen2_5_vl", min_pixels=budget[0], max_pixels=budget[1])
        spec = S.SampleSpec("guilibra", "qwen2_5_vl", system_prompt="GUI agent on a {platform}. Actions: {actions}.")
        rec = type("R", (), dict(platform=obs.platform, instruction=obs.instruction, history=obs.history))
        want_system, want_user = S.prompt_turns(rec, spec, (w, h))
        assert system == want_system
        assert [part["type"] for part in user] == ["image_url", "text"]
        assert P.IMAGE_PLACEHOLDER + user[1]["text"] == want_user
        sent = Image.open(io.BytesIO(base64.b64decode(user[0]["image_url"]["url"].split(",", 1)[1])))
        want = obs.screenshot.convert("RGB").resize((w, h), resample=Image.Resampling.BICUBIC)
        np.testing.assert_array_equal(np.asarray(sent), np.asarray(want))


def test_eval_run_with_a_flaky_endpoint_finishes_and_reports_the_counts(tmp_path, run_dir):
    from configs.eval_demo import get_config
    from guilibra_jax.eval.run import run_eval

    c = get_config("smoke")
    c.online.episodes, c.online.save_trajectories = 2, False
    c.agents = ("endpoint",)
    with FakeChatServer(reply="not an action") as server:
        server.script = {"mobile": ["malformed", "500", "500", "500", "500", "drop"]}
        c.agent_kwargs.endpoint.update(url=server.url, run_config=run_dir, family="qwen2_5_vl", retries=1,
                                       backoff=0.01, timeout=5.0)
        out = run_eval(c, str(tmp_path / "eval"))
    with open(os.path.join(tmp_path, "eval", "offline_endpoint.json")) as f:
        offline = json.load(f)
    counts = offline["requests"]
    assert counts["malformed"] == 1 and counts["http_500"] == 4 and counts["connection"] == 1
    assert counts["failed"] >= 1 and counts["ok"] > 0
    assert out["summary"]["endpoint"]["offline_step_success"] == 0.0
