"""Whole GRPO training steps, ours against tunix's: guilibra_jax's stage-2 phases (rollout,
reward + advantages + scoring, update; as benchmarks/trainers.py drives them) and tunix's
``GRPOLearner`` (pip ``google-tunix``: its RLCluster with the vanilla rollout, the reference's
log-probs, its advantages, and its actor trainer's update), side by side on a text-only
Qwen2.5-shaped model (tunix has no Qwen-VL).

The weights: one random tiny Qwen2.5-VL that transformers builds and saves (trainers.py's
``make_model_folder``; ours loads it through ``model.hf_path``), and a text-only Qwen2 folder
(``Qwen2ForCausalLM``, Hugging Face safetensors naming) holding the same language-model
weights, which tunix's qwen2 model reads with its safetensors loader. ``text_model_check`` in
the JSON: the two folders' logits in transformers on our text-only prompts (text-only M-RoPE
positions are plain RoPE's), largest absolute difference.

The prompts: the synthetic world's RL batches as our loader draws them, with the screenshot
span (``<|vision_start|> ... <|vision_end|>``) cut out of each prompt and the rest re-tokenised
as one text (the cut joins the newlines around the span): ours gets those token ids laid out as
our collate does (left-padded to the batch's bucket, text-only positions, no pixels); tunix gets
each prompt's text, which its sampler tokenises (``prompts_match``: whether the ids it fed its
model equal ours, every round). The
same group size, response limit, prompt slots (tunix's ``max_prompt_length`` = our bucket, its KV
cache prompt + response), prompts per step, one optimizer update per step (AdamW constant
learning rate, global-norm clip 1 before it), beta, clip epsilon, temperature 1, no top-p / top-k,
the same stop id, and the same reward: (first response token id mod 3) / 2 (trainers.py's;
tunix's reward function reads the sampled token ids of the rollout it just scored).

The objective: ours rl.aggregation=token_mean, k3 KL unclamped (rl.kl_clamp=0), SNGS off,
advantages (r - mean) / (sample std + 1e-6); tunix GRPOConfig(loss_agg_mode="token-mean",
kl_loss_mode="low_var_kl" (k3), num_iterations=1), whose "grpo" advantage estimator is the same
(sample std, + 1e-6). Our policy never samples the vision placeholder ids (they leave its softmax);
tunix's Qwen2 gets the same through a constant -1e4 logit bias at those ids (a subclass of its
Qwen2, for policy and reference: sampling, scoring and loss). ``objective`` in the JSON feeds both
loss computations identical inputs (our first rollout's prompt + response ids, random advantages,
old log-probs = the sampler's + noise so that the ratio clips, ``clipped_fraction``, a reference =
the sampler's + noise so that the KL term is not zero) at the same weights and reports the
relative difference of loss, KL and gradient norm (tolerances trainers.LOSS_RTOL, GRAD_RTOL) and
the largest difference of the two models' log-probs of our sampled tokens; the arrays cross the
two virtual environments as a .npz file. Not matched: ``not_matched`` in the JSON.

tunix pins its own dependencies, so its side runs from its own virtual environment, created by
this benchmark on first use (--tunix_venv, default ~/.cache/guilibra_jax/tunix-0.1.7): ``pip
install google-tunix==0.1.7`` with our jax / jaxlib / flax versions when they resolve (else
tunix's own), started as ``python -m benchmarks.trainers_tunix --tunix_worker`` and driven over a
local socket; ``tunix`` in the JSON records its versions and whether they are ours.
--no_create_venv refuses to create it (exit status 2 naming the command that would).

Each side runs in its own process (peak RSS per side, ``ru_maxrss``); the parent steps them
round by round, alternating which goes first; round 0 (compiling / warm-up) is untimed. Phases
per step: generation (ours: sampling and decoding; tunix: ``RLCluster.generate``, which also
tokenises the prompt strings and decodes the texts), scoring (ours: rewards, advantages, the
reference pass; tunix: the rest of ``_generate_and_compute_advantage``: the reference's log-probs,
rewards and advantages, waited for so that JAX's asynchronous dispatch does not move them into
update), update (ours: forward, backward, optimizer; tunix: its actor trainer's step and the
learner's loop between steps, up to its request for the next batch, the updated weights waited
for; ``actor_update_s``: its actor trainer's call alone). ``tunix_over_ours``: tunix's time / ours.

  python -m benchmarks.trainers_tunix --size=tiny --steps=1        # creates the tunix venv on first use
  python -m benchmarks.trainers_tunix                              # tiny, 2 prompts x G=4, 32 tokens, 3 timed steps
  python -m benchmarks.trainers_tunix --size=bench35m --prompts=4 --group=8 --max_new_tokens=32 --steps=3

Writes benchmarks/results/trainers-tunix-<size>-<machine>.json (see --out_dir) and prints it.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from importlib import metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import trainers as T  # noqa: E402  (stdlib + numpy at import: the tunix venv imports it too)

import numpy as np  # noqa: E402

TUNIX_VERSION = "0.1.7"
DEFAULT_VENV = os.path.join(os.path.expanduser("~"), ".cache", "guilibra_jax", f"tunix-{TUNIX_VERSION}")
PINNED = ("jax", "jaxlib", "flax")           # ours, asked of the tunix venv (tunix's own if they do not resolve)
VENV_PACKAGES = ("google-tunix", "jax", "jaxlib", "flax", "optax", "qwix", "transformers", "numpy", "safetensors")
BAN_BIAS = -1e4                              # exp(-1e4 + x) is 0 in float32: the id leaves the softmax
NOT_MATCHED = [
    "prefill: ours prefills each prompt once for its G rows (rl.share_prefill) and scores / updates in the "
    "shared-prompt layout (LM head at response positions only); tunix repeats each prompt G times, prefills every "
    "row, and its scoring and loss run the LM head over the whole prompt + response (its design, timed as is)",
    "stop token: tunix's sampler cuts each response before its stop token (<|im_end|> is not in completion_ids: no "
    "loss, not counted in response_tokens); ours keeps it as the response's last token, with its loss",
    "pad id: tunix treats every <|endoftext|> (the pad id) as padding (its sampler's attention mask, its scoring "
    "positions and attention, its loss mask), also one its policy samples inside a response; ours treats a sampled "
    "pad id as a response token (the objective check uses a rollout without one inside a response: "
    "objective.rollout_key)",
    "vision ids: ours leaves <|vision_start|>, <|vision_end|>, <|image_pad|>, <|video_pad|> out of its softmax; "
    "tunix's Qwen2 (policy and reference) gets a constant -1e4 logit bias there (a subclass of its Qwen2 whose "
    "__call__ adds it): one more add over the logits in its sampler, scoring and loss",
    "random streams: each side samples its own responses (same distribution, same weights at round 0); tunix's "
    "vanilla rollout seeds every generate call with PRNGKey(0) (RolloutConfig.seed None), ours folds the round in",
    "old log-probs: at num_iterations=1 tunix takes the old policy as stop_gradient of the current log-probs (ratio "
    "exactly 1), ours reuses the sampler's log-probs (ratio 1 up to float rounding): the same objective and gradient "
    "up to rounding; the objective check gives both the same perturbed old log-probs",
    "prompt preparation: ours gets its token-id batches pre-drawn (our loader runs in its own threads, outside the "
    "step); tunix tokenises its prompt strings inside the step (in generation)",
    "tunix also computes each response token's entropy over the vocabulary in its loss (a logged metric) and clips "
    "the log-ratio to [-20, 20] before exp (inactive here); ours computes neither in the update",
]


def our_pinned_versions() -> dict:
    """Our side's versions of the packages the tunix venv is asked to share."""
    return {k: metadata.version(k) for k in PINNED}


# ----------------------------------------------------------------------------- the tunix venv
def venv_python(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def venv_versions(venv: str) -> dict | None:
    """The venv's Python and package versions, or None when it cannot import tunix's GRPO learner."""
    py = venv_python(venv)
    if not os.path.exists(py):
        return None
    code = ("import json, platform; from importlib import metadata; import tunix.rl.grpo.grpo_learner; "
            f"v = {{k: metadata.version(k) for k in {VENV_PACKAGES!r}}}; v['python'] = platform.python_version(); "
            "print(json.dumps(v))")
    try:
        proc = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def venv_ready(venv: str = DEFAULT_VENV) -> bool:
    """Whether ``venv`` holds google-tunix at TUNIX_VERSION (no network, nothing created)."""
    v = venv_versions(venv)
    return bool(v) and v.get("google-tunix") == TUNIX_VERSION


def ensure_venv(venv: str, create: bool = True) -> dict:
    """The tunix venv's versions, creating it first when absent: ``python -m venv`` from this
    interpreter, ``pip install google-tunix==TUNIX_VERSION`` with our jax / jaxlib / flax pins
    (jax[cuda12] when ours has the CUDA plugin), and tunix's own resolution when that fails.
    ``pinned_to_ours``: whether its jax / jaxlib / flax equal ours."""
    v = venv_versions(venv)
    if not (v and v.get("google-tunix") == TUNIX_VERSION):
        cmd = f"python -m benchmarks.trainers_tunix --tunix_venv={venv}"
        if not create:
            print(f"[trainers_tunix] no tunix {TUNIX_VERSION} venv at {venv}; `{cmd}` creates it", file=sys.stderr)
            raise SystemExit(2)
        if os.path.isdir(venv) and os.listdir(venv) and not os.path.exists(os.path.join(venv, "pyvenv.cfg")):
            raise SystemExit(f"--tunix_venv={venv} exists and is not a virtual environment: name a new folder")
        if sys.version_info < (3, 11):
            raise SystemExit(f"google-tunix {TUNIX_VERSION} needs Python >= 3.11; this is {sys.version.split()[0]}")
        print(f"[trainers_tunix] creating the tunix venv at {venv} (pip install google-tunix=={TUNIX_VERSION})",
              file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
        ours = our_pinned_versions()
        try:
            cuda = bool(metadata.version("jax-cuda12-plugin"))
        except metadata.PackageNotFoundError:
            cuda = False
        jax_req = f"jax[cuda12]=={ours['jax']}" if cuda else f"jax=={ours['jax']}"
        pip = [venv_python(venv), "-m", "pip", "install", "-q", f"google-tunix=={TUNIX_VERSION}"]
        if subprocess.run(pip + [jax_req, f"jaxlib=={ours['jaxlib']}", f"flax=={ours['flax']}"]).returncode != 0:
            print("[trainers_tunix] our jax / jaxlib / flax pins do not resolve with tunix's; installing its own",
                  file=sys.stderr, flush=True)
            subprocess.run(pip + (["jax[cuda12]"] if cuda else []), check=True)
        v = venv_versions(venv)
        if not (v and v.get("google-tunix") == TUNIX_VERSION):
            raise SystemExit(f"the venv at {venv} does not import tunix {TUNIX_VERSION} after installing it")
    ours = our_pinned_versions()
    return {"venv": venv, "versions": v, "pinned_to_ours": all(v.get(k) == ours[k] for k in PINNED)}


# ----------------------------------------------------------------------------- shared setup
def write_text_folder(model_dir: str, text_dir: str) -> int:
    """A Qwen2ForCausalLM folder (safetensors, Hugging Face naming) with the language-model
    weights of the Qwen2.5-VL in ``model_dir`` and its tokenizer. Returns its parameter count."""
    import torch
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration, Qwen2Config, Qwen2ForCausalLM

    vl = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    tc = vl.config.text_config
    cfg = Qwen2Config(vocab_size=tc.vocab_size, hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
                      num_hidden_layers=tc.num_hidden_layers, num_attention_heads=tc.num_attention_heads,
                      num_key_value_heads=tc.num_key_value_heads, hidden_act=tc.hidden_act,
                      max_position_embeddings=tc.max_position_embeddings, rms_norm_eps=tc.rms_norm_eps,
                      rope_parameters={"rope_type": "default", "rope_theta": tc.rope_parameters["rope_theta"]},
                      tie_word_embeddings=vl.config.tie_word_embeddings, bos_token_id=tc.bos_token_id,
                      eos_token_id=tc.eos_token_id, pad_token_id=tc.pad_token_id, dtype="float32")
    lm = Qwen2ForCausalLM(cfg)
    weights = {f"model.{k}": v for k, v in vl.model.language_model.state_dict().items()}
    if not cfg.tie_word_embeddings:
        weights["lm_head.weight"] = vl.lm_head.weight
    missing, unexpected = lm.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - ({"lm_head.weight"} if cfg.tie_word_embeddings else set()):
        raise SystemExit(f"text-only folder: missing {missing}, unexpected {unexpected}")
    lm.save_pretrained(text_dir)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(text_dir)
    return sum(p.numel() for p in lm.parameters())


def text_model_check(model_dir: str, text_dir: str, prompts: list[list[int]]) -> dict:
    """The Qwen2.5-VL's and the text-only Qwen2's logits (transformers, float32) on ``prompts``
    (each alone, unpadded): the largest absolute difference and the logit scale."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2ForCausalLM

    vl = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    lm = Qwen2ForCausalLM.from_pretrained(text_dir, dtype=torch.float32).eval()
    diff, scale = 0.0, 0.0
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            a = vl(input_ids=x, attention_mask=torch.ones_like(x), mm_token_type_ids=torch.zeros_like(x)).logits
            b = lm(input_ids=x, attention_mask=torch.ones_like(x)).logits
            diff, scale = max(diff, float((a - b).abs().max())), max(scale, float(a.abs().max()))
    return {"prompts": len(prompts), "logits_max_abs_diff": diff, "logits_max_abs": scale}


def decode(tokenizer, ids) -> str:
    return tokenizer.decode([int(i) for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def text_only(batch: dict, model_config, pad_id: int, tokenizer) -> dict:
    """An RL batch (``collate_rl``) with each prompt's screenshot span (vision start .. end)
    cut out, the rest re-tokenised as one text (``tokenizer.encode``, what tunix's sampler
    does with the prompt string: the cut joins the newlines around the span into one token),
    the rows left-padded to the same bucket, text-only positions, no pixels."""
    from guilibra_jax.models.rope_index import get_rope_index

    rows = []
    for r in range(batch["prompt_ids"].shape[0]):
        ids = batch["prompt_ids"][r][batch["prompt_mask"][r] > 0]
        start = np.nonzero(ids == model_config.vision_start_token_id)[0]
        end = np.nonzero(ids == model_config.vision_end_token_id)[0]
        cut = np.concatenate([ids[:start[0]], ids[end[0] + 1:]]) if len(start) and len(end) else ids
        rows.append(np.asarray(tokenizer.encode(decode(tokenizer, cut)), np.int32))
    width = batch["prompt_ids"].shape[1]
    ids = np.full((len(rows), width), pad_id, np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for r, x in enumerate(rows):
        ids[r, width - len(x):], mask[r, width - len(x):] = x, 1
    positions, deltas = get_rope_index(ids, mask, None, model_config)
    out = {k: v for k, v in batch.items() if k not in ("pixel_values", "image_grid_thw", "vision")}
    out.update(prompt_ids=ids, prompt_mask=mask, positions=positions, rope_deltas=deltas,
               image_grid_thw=np.zeros((0, 3), np.int64))
    return out


def prompt_rows(batch: dict) -> list[list[int]]:
    return [batch["prompt_ids"][r][batch["prompt_mask"][r] > 0].tolist() for r in range(batch["prompt_ids"].shape[0])]


def ours_text_objective(s, state, batch, seed: int) -> dict:
    """trainers.ours_objective on the first sampling key (7, 8, ...) whose responses hold no pad
    id (tunix reads any pad id as padding; see NOT_MATCHED)."""
    import jax

    from guilibra_jax.train.rl import phases as PH

    for key in range(7, 7 + 64):
        ro = PH.rollout(s, state["params"], batch, jax.random.PRNGKey(key))
        inside = np.arange(ro.tokens.shape[1])[None] < ro.lengths[:, None]
        if not (inside & (np.asarray(ro.tokens) == s.pad_id)).any():
            break
    out = T.ours_objective(s, state, batch, seed, key=key)
    out["rollout_key"] = key
    return out


# ----------------------------------------------------------------------------- tunix's side
def tunix_model_config(text_dir: str):
    """tunix's qwen2 ModelConfig of a Qwen2 folder's config.json (float32)."""
    import jax.numpy as jnp
    from tunix.models.qwen2 import model as qwen2

    with open(os.path.join(text_dir, "config.json")) as f:
        c = json.load(f)
    rope = (c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta"))
    return qwen2.ModelConfig(num_layers=c["num_hidden_layers"], vocab_size=c["vocab_size"],
                             embed_dim=c["hidden_size"], hidden_dim=c["intermediate_size"],
                             num_heads=c["num_attention_heads"],
                             head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                             num_kv_heads=c["num_key_value_heads"], rope_theta=rope, norm_eps=c["rms_norm_eps"],
                             use_tied_embedding=bool(c.get("tie_word_embeddings")), dtype=jnp.float32,
                             param_dtype=jnp.float32)


def tunix_model(text_dir: str, cfg, mesh, banned: tuple[int, ...]):
    """tunix's Qwen2 loaded from the folder by its safetensors loader, as a subclass whose
    logits get BAN_BIAS at the ``banned`` ids (our policy's vision ids: never sampled, out of
    every softmax); same parameters and graph otherwise."""
    import jax.numpy as jnp
    from flax import nnx
    from tunix.models.qwen2 import model as qwen2
    from tunix.models.qwen2 import params as qwen2_params

    class BannedQwen2(qwen2.Qwen2):
        def __call__(self, input_tokens, positions, cache, attention_mask=None, output_hidden_states=False,
                     segment_ids=None):
            logits, cache = super().__call__(input_tokens, positions, cache, attention_mask,
                                             output_hidden_states=output_hidden_states, segment_ids=segment_ids)
            bias = jnp.zeros((logits.shape[-1],), logits.dtype).at[jnp.asarray(banned)].set(BAN_BIAS)
            return logits + bias, cache

    loaded = qwen2_params.create_model_from_safe_tensors(text_dir, cfg, mesh)
    with mesh:
        abstract = nnx.eval_shape(lambda: BannedQwen2(cfg, rngs=nnx.Rngs(params=0)))
    graphdef, _ = nnx.split(abstract)
    return nnx.merge(graphdef, nnx.state(loaded))


def tunix_objective(cluster, learner, mesh, p: dict) -> dict:
    """tunix's GRPO loss (its registered "grpo" policy loss), KL and gradient norm at the
    current weights on our objective-check inputs, and the largest difference of its policy's
    log-probs of our sampled tokens from our sampler's."""
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from tunix.rl import common, function_registry
    from tunix.rl.grpo import grpo_learner

    pad, eos = cluster.rollout.pad_id(), cluster.rollout.eos_id()
    mask = jnp.asarray(p["completion_mask"], jnp.int32)
    completion = jnp.asarray(np.where(p["completion_mask"] > 0, p["completion_ids"], pad), jnp.int32)
    prompt = jnp.asarray(p["prompt_ids"], jnp.int32)
    example = grpo_learner.TrainExample(
        prompt_ids=prompt, prompt_mask=prompt != pad, completion_ids=completion, completion_mask=mask,
        advantages=jnp.asarray(p["advantages"], jnp.float32), ref_per_token_logps=jnp.asarray(p["ref_logp"]),
        old_per_token_logps=jnp.asarray(p["old_logp"]))
    loss_fn = function_registry.get_policy_loss_fn(learner.algo_config.policy_loss_fn)
    model = cluster.actor_trainer.model
    with mesh:
        (loss, aux), grads = nnx.value_and_grad(
            lambda m: loss_fn(m, example, algo_config=learner.algo_config, pad_id=pad, eos_id=eos), has_aux=True)(model)
        graphdef, state = nnx.split(model)
        logp = common.compute_per_token_logps(graphdef, state, prompt_tokens=prompt, completion_tokens=completion,
                                              pad_id=pad, eos_id=eos)
    on = p["completion_mask"] > 0
    diff = float(np.abs(np.asarray(logp) - p["policy_logp"])[on].max())
    return {"loss": float(loss), "kl": float(aux["kl"]), "grad_norm": float(optax.global_norm(grads)),
            "clipped_fraction": float(aux["pg_clipfrac"]), "logp_max_abs_diff": diff}


def tunix_side(conn, job: dict) -> None:
    """tunix's process: the RL cluster (policy, reference, vanilla rollout, actor trainer on one
    device), the GRPO learner, the objective check, then ``learner.train`` over a dataset whose
    every batch waits for the parent's "step" (and reports the step before it)."""
    t0 = time.perf_counter()
    import jax
    import optax
    from flax import nnx
    from transformers import AutoTokenizer
    from tunix.rl import rl_cluster as RC
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout

    a = job["args"]
    G, N, Tp = a["group"], a["max_new_tokens"], job["prompt_slots"]
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    cfg = tunix_model_config(job["text_dir"])
    banned = tuple(job["banned_ids"])
    policy = tunix_model(job["text_dir"], cfg, mesh, banned)
    reference = tunix_model(job["text_dir"], cfg, mesh, banned)
    params = sum(int(x.size) for x in jax.tree.leaves(nnx.state(policy, nnx.Param)))
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(a["lr"], b1=0.9, b2=0.999, eps=1e-8,
                                                                 weight_decay=0.0))
    rounds = job["rounds"]
    cluster = RC.RLCluster(
        actor=policy, reference=reference, tokenizer=AutoTokenizer.from_pretrained(job["text_dir"]),
        cluster_config=RC.ClusterConfig(
            role_to_mesh={RC.Role.ACTOR: mesh, RC.Role.REFERENCE: mesh, RC.Role.ROLLOUT: mesh},
            rollout_engine="vanilla", offload_to_cpu=False,
            # max_steps beyond the rounds: the dataset ends the loop (so every round reaches the gate)
            training_config=RC.RLTrainingConfig(actor_optimizer=tx, eval_every_n_steps=10 ** 9,
                                                max_steps=len(rounds) + 10 ** 6),
            rollout_config=base_rollout.RolloutConfig(
                max_tokens_to_generate=N, max_prompt_length=Tp, kv_cache_size=Tp + N, temperature=1.0, top_p=1.0,
                top_k=None, eos_tokens=list(job["stop_ids"]))))
    seen, got, clock = {}, {}, {}

    def reward(prompts, completions, **_):
        """(first response token id mod 3) / 2 of the rollout just generated, in its row order."""
        tokens = seen["tokens"]
        if len(tokens) != len(completions):
            raise RuntimeError(f"{len(completions)} completions for {len(tokens)} generated rows")
        seen["rewards"] = [T.first_token_reward([int(t) for t in x]) for x in tokens]
        return seen["rewards"]

    algo = grpo_learner.GRPOConfig(num_generations=G, num_iterations=1, beta=a["beta"], epsilon=a["epsilon"],
                                   loss_agg_mode="token-mean", kl_loss_mode="low_var_kl")
    learner = grpo_learner.GRPOLearner(rl_cluster=cluster, algo_config=algo, reward_fns=[reward])

    generate = cluster.generate

    def timed_generate(*args, **kw):
        t = time.perf_counter()
        out = generate(*args, **kw)         # (its tokens come back as host arrays: waited for)
        clock["gen"] += time.perf_counter() - t
        seen["tokens"], seen["prompt_tokens"] = list(out.tokens), np.asarray(out.left_padded_prompt_tokens)
        return out

    generate_and_score = learner._generate_and_compute_advantage

    def timed_generate_and_score(*args, **kw):
        t = time.perf_counter()
        example = jax.block_until_ready(generate_and_score(*args, **kw))
        clock["gen_score"] += time.perf_counter() - t
        return example

    trainer = cluster.actor_trainer
    buffer_metrics, post_process = trainer._buffer_metrics, trainer._post_process_train_step

    def kept_metrics(*args, **kw):
        got["loss"], got["grad_norm"] = kw["loss"], kw["additional_metrics"]["grad_norm"][0]
        return buffer_metrics(*args, **kw)

    def kept_aux(aux):
        got["kl"] = aux["kl"]
        return post_process(aux)

    update_actor = cluster.update_actor

    def timed_update_actor(*args, **kw):
        t = time.perf_counter()
        out = update_actor(*args, **kw)     # (its trainer waits for its in-flight steps before returning)
        clock["actor"] += time.perf_counter() - t
        return out

    cluster.generate, learner._generate_and_compute_advantage = timed_generate, timed_generate_and_score
    cluster.update_actor = timed_update_actor
    trainer._buffer_metrics, trainer._post_process_train_step = kept_metrics, kept_aux
    pad = cluster.rollout.pad_id()
    encoded = [[cluster.tokenizer.encode(text) for text in texts] for texts in rounds]
    conn.send({"setup_s": time.perf_counter() - t0, "params": params,
               "prompts_encode_identical": encoded == job["round_ids"]})
    conn.send(tunix_objective(cluster, learner, mesh, dict(np.load(conn.recv()))))

    def left_padded(ids: list[list[int]]) -> np.ndarray:
        out = np.full((len(ids), Tp), pad, np.int64)
        for r, x in enumerate(ids):
            out[r, Tp - len(x):] = x
        return out

    def report(r: int, step: float) -> dict:
        lengths = np.array([len(x) for x in seen["tokens"]])
        rewards = np.asarray(seen["rewards"], np.float64)
        fed = seen["prompt_tokens"][::G]              # (each prompt's G rows are copies)
        return {"generation_s": clock["gen"], "scoring_s": clock["gen_score"] - clock["gen"],
                "update_s": step - clock["gen_score"], "step_s": step, "actor_update_s": clock["actor"],
                "response_tokens": int(lengths.sum()),
                "reward_mean": float(rewards.mean()), "reward_group_std": float(rewards.reshape(-1, G).std(1).mean()),
                "kl": float(got["kl"]), "loss": float(got["loss"]), "grad_norm": float(got["grad_norm"]),
                "prompt_ids_identical": bool(np.array_equal(fed, left_padded(job["round_ids"][r])))}

    def batches():
        for r, texts in enumerate(rounds):
            if conn.recv() != "step":
                return
            clock.update(t0=time.perf_counter(), gen=0.0, gen_score=0.0, actor=0.0)
            yield {"prompts": np.array(texts)}      # (an array: the learner repeats its leaves G times)
            # the learner asks for the next batch: round r is done (its update waited for)
            jax.block_until_ready(nnx.state(cluster.actor_trainer.model))
            conn.send(report(r, time.perf_counter() - clock["t0"]))
        conn.recv()       # "stop": the dataset ends, and with it learner.train

    learner.train(batches())
    conn.send({"peak_rss_bytes": T.peak_rss_bytes()})


def tunix_worker_main(address: str) -> None:
    """``python -m benchmarks.trainers_tunix --tunix_worker ADDRESS`` in the tunix venv: connect
    to the parent (authkey from the environment) and run :func:`tunix_side`."""
    from multiprocessing.connection import Client

    conn = Client(address, authkey=bytes.fromhex(os.environ.pop("GUILIBRA_TUNIX_AUTHKEY")))
    try:
        tunix_side(conn, conn.recv())
    finally:
        conn.close()


# ----------------------------------------------------------------------------- the parent
class VenvProcess:
    """A subprocess in another interpreter, with the multiprocessing.Process methods that
    trainers.recv and the parent's clean-up use (name, is_alive, exitcode, join, terminate)."""

    def __init__(self, name: str, argv: list[str], env: dict, log_path: str):
        self.name, self.log_path = name, log_path
        self._log = open(log_path, "w")
        self.popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def exitcode(self):
        return self.popen.poll()

    def join(self, timeout=None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            self._log.flush()

    def terminate(self) -> None:
        self.popen.terminate()

    def tail(self, lines: int = 60) -> str:
        self._log.flush()
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])


def start_tunix(venv: str, job: dict, log_path: str):
    """(connection, VenvProcess) of the tunix worker, sent ``job``."""
    from multiprocessing.connection import Listener

    authkey = secrets.token_bytes(32)
    folder = tempfile.mkdtemp(prefix="guilibra-tunix-")
    listener = Listener(os.path.join(folder, "socket"), "AF_UNIX", authkey=authkey)
    env = dict(os.environ, GUILIBRA_TUNIX_AUTHKEY=authkey.hex(), PYTHONPATH=ROOT)
    proc = VenvProcess("tunix", [venv_python(venv), "-m", "benchmarks.trainers_tunix", "--tunix_worker",
                                 listener.address], env, log_path)
    box = []
    accept = threading.Thread(target=lambda: box.append(listener.accept()), daemon=True)
    accept.start()
    try:
        while accept.is_alive():
            accept.join(1.0)
            if not proc.is_alive() and not box:
                raise SystemExit(f"the tunix worker exited with status {proc.exitcode} before connecting:\n"
                                 f"{proc.tail()}")
    finally:
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)
    box[0].send(job)
    return box[0], proc


def npz_inputs(check: dict, path: str, prompt_slots: int) -> str:
    """Our objective-check inputs as a .npz for the tunix venv (prompts left-padded to the slots)."""
    pad = int(check["pad_id"])
    prompts = np.full((len(check["prompt_ids"]), prompt_slots), pad, np.int64)
    for r, x in enumerate(check["prompt_ids"]):
        prompts[r, prompt_slots - len(x):] = x
    np.savez(path, prompt_ids=prompts, completion_ids=np.asarray(check["completion_ids"], np.int64),
             completion_mask=np.asarray(check["completion_mask"], np.int64), advantages=check["advantages"],
             old_logp=check["old_logp"], ref_logp=check["ref_logp"], policy_logp=check["policy_logp"])
    return path


def run_sides(args, workdir: str, model_dir: str, text_dir: str, tunix_venv: str) -> dict:
    """Both sides in their own processes, stepped round by round (which goes first alternates)."""
    from transformers import AutoTokenizer

    from guilibra_jax.models.checkpoint import read_config
    from guilibra_jax.train.rl import rollout as RO
    from guilibra_jax.train.rl import setup as RS

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    mc = read_config(model_dir)
    pad_id, stop = RS.special_ids(tokenizer, mc)
    batches = [text_only(b, mc, pad_id, tokenizer) for b in T.draw_batches(args, workdir, model_dir, T.total_steps(args))]
    widths = {b["prompt_ids"].shape[1] for b in batches}
    if len(widths) != 1:
        raise SystemExit(f"prompt batches of several widths {sorted(widths)}: tunix's max_prompt_length is one")
    prompt_slots = widths.pop()
    round_ids = [prompt_rows(b) for b in batches]
    text_check = text_model_check(model_dir, text_dir, round_ids[0])
    job = {"text_dir": text_dir, "prompt_slots": prompt_slots, "stop_ids": list(stop), "pad_id": pad_id,
           "banned_ids": list(RO.vision_token_ids(mc)), "round_ids": round_ids,
           "rounds": [[decode(tokenizer, ids) for ids in rows] for rows in round_ids],
           "args": {k: getattr(args, k) for k in ("prompts", "group", "max_new_tokens", "beta", "epsilon", "lr",
                                                   "seed", "steps")}}
    ctx = multiprocessing.get_context("spawn")
    conns, procs, setup = {}, {}, {}
    ask = lambda name, message: (conns[name].send(message), T.recv(conns[name], procs[name]))[1]
    try:
        parent, child = ctx.Pipe()
        procs["guilibra_jax"] = ctx.Process(target=T.ours_side, args=(child, args, workdir, model_dir, batches),
                                            kwargs={"check": ours_text_objective}, name="guilibra_jax", daemon=True)
        procs["guilibra_jax"].start()
        conns["guilibra_jax"] = parent
        setup["guilibra_jax"] = T.recv(parent, procs["guilibra_jax"])      # one side builds at a time
        conns["tunix"], procs["tunix"] = start_tunix(tunix_venv, job, os.path.join(workdir, "tunix.log"))
        setup["tunix"] = T.recv(conns["tunix"], procs["tunix"])
        ours_check = ask("guilibra_jax", "check")
        path = npz_inputs(ours_check, os.path.join(workdir, "objective.npz"), prompt_slots)
        objective = T.objective_report(ours_check, ask("tunix", path), peer="tunix")
        objective["rollout_key"] = ours_check["rollout_key"]
        steps = T.interleaved_steps(ask, list(conns), args.steps, args.steps_per_turn)
        rss = {name: ask(name, "stop")["peak_rss_bytes"] for name in conns}
    except BaseException:
        if "tunix" in procs:
            procs["tunix"].join(timeout=10)
            print(f"[trainers_tunix] the tunix worker's log ({procs['tunix'].log_path}):\n{procs['tunix'].tail()}",
                  file=sys.stderr)
        raise
    finally:
        for proc in procs.values():
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
    n_rows = args.prompts * args.group
    sides = {name: T.side_summary(steps[name], setup[name]["setup_s"], rss[name], n_rows) for name in conns}
    ratio = {k: round(sides["tunix"][k] / sides["guilibra_jax"][k], 3) for k in ("step_s",) + T.PHASES}
    fed = [s.pop("prompt_ids_identical") for s in steps["tunix"]]
    # of tunix's update: its actor trainer's call (the rest: the learner's loop, queue and metrics)
    sides["tunix"]["actor_update_s"] = round(float(np.mean([s["actor_update_s"] for s in steps["tunix"][1:]])), 4)
    prompts_match = {"identical_ids": all(fed), "rounds": len(fed), "prompt_slots": prompt_slots,
                     "tokenizer_encode_identical": setup["tunix"]["prompts_encode_identical"]}
    return {"sides": sides, "tunix_over_ours": ratio, "objective": objective, "prompts_match": prompts_match,
            "text_model_check": text_check, "tunix_params": setup["tunix"]["params"],
            "prompt_lengths": [len(x) for rows in round_ids for x in rows], "per_round": steps}


def devices_not_matched() -> list[str]:
    """A NOT_MATCHED line where this machine has several devices (tunix's side runs on one)."""
    import jax

    n = jax.local_device_count()
    return [f"devices: tunix's side runs on one device, ours on the run's mesh ({n} devices); run on a "
            f"one-device machine (or limit the visible devices) for a like-for-like step"] if n > 1 else []


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    T.add_step_args(ap, group_help="G responses per prompt (tunix: num_generations, >= 2)")
    ap.add_argument("--tunix_venv", default=os.environ.get("GUILIBRA_TUNIX_VENV", DEFAULT_VENV),
                    help="tunix's virtual environment (created on first use; env GUILIBRA_TUNIX_VENV)")
    ap.add_argument("--no_create_venv", action="store_true", help="exit (status 2) instead of creating the venv")
    from benchmarks import _common as C      # (imports JAX: not at module level, which the tunix venv imports)

    C.add_result_args(ap)
    args = ap.parse_args(argv)
    args.pair = "grpo"
    if args.steps < 1:
        raise SystemExit("--steps must be >= 1 (timed steps after the warm-up step)")
    if args.group < 2:
        raise SystemExit("--group must be >= 2 (tunix's GRPOConfig refuses num_generations <= 1)")
    start = C.run_start()
    tunix = ensure_venv(args.tunix_venv, create=not args.no_create_venv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir, model_dir, text_dir = (os.path.join(tmp, x) for x in ("run", "model", "text"))
        params = T.make_model_folder(args, workdir, model_dir)
        text_params = write_text_folder(model_dir, text_dir)
        res = run_sides(args, workdir, model_dir, text_dir, args.tunix_venv)
    row = {"benchmark": "trainers_tunix", "pair": "grpo", "size": args.size, "params": params,
           "text_params": text_params, "prompts": args.prompts, "group": args.group,
           "rows": args.prompts * args.group, "max_new_tokens": args.max_new_tokens, "steps_timed": args.steps,
           "steps_per_turn": args.steps_per_turn,
           "beta": args.beta, "epsilon": args.epsilon, "lr": args.lr, "dtype": "float32", "updates_per_step": 1,
           "reward": "tokens: (first response token id mod 3) / 2",
           "objective_settings": {
               "ours": "rl.aggregation=token_mean, rl.kl_kind=k3, rl.kl_clamp=0, rl.sngs.enabled=False, "
                       "rl.std_unbiased=True, rl.old_logprobs=auto, text-only prompts (no pixels)",
               "tunix": "GRPOConfig(loss_agg_mode='token-mean', kl_loss_mode='low_var_kl', num_iterations=1, "
                        "advantage_estimator='grpo', policy_loss_fn='grpo'), vanilla rollout, RolloutConfig("
                        "temperature=1, top_p=1, top_k=None, eos_tokens=<our stop ids>, max_prompt_length=<our "
                        "prompt slots>), vision ids banned (logit bias -1e4, policy and reference)"},
           "not_matched": NOT_MATCHED + devices_not_matched(), "tunix": tunix, **res}
    return C.report("trainers_tunix", f"trainers-tunix-{args.size}", row, args, start)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--tunix_worker":
        tunix_worker_main(sys.argv[2])
    else:
        from benchmarks._common import launcher_malloc
        launcher_malloc()
        main()
