"""Whole GRPO training steps, ours against TRL's: guilibra_jax's stage-2 phases (rollout,
reward + advantages + scoring, update; as benchmarks/rl_step.py drives them) and TRL's
``GRPOTrainer`` (transformers ``generate``, its scoring and its update), side by side.

Both sides load one random tiny Qwen2.5-VL that transformers builds and ``save_pretrained``s
(with the synthetic world's tokenizer and a Qwen2-VL image processor): ours through
``model.hf_path``, TRL's from the folder. Both play the same prompts with their screenshots
(the bundled synthetic world's RL batches, as our loader draws them; TRL gets each prompt as one
chat message whose template reproduces our prompt text and the screenshot as we resized it, and
the JSON says whether its prompt ids equal ours), with the same group size, response limit,
prompts per step, one optimizer update per step (AdamW, constant learning rate, gradient clip 1),
beta and clip epsilon, and the same reward: (first response token id mod 3) / 2 (rl_step.py's
``tokens`` reward, which varies within a group for any policy).

The objective: ours rl.aggregation=token_mean, k3 KL unclamped (rl.kl_clamp=0), SNGS off,
advantages (r - mean) / (sample std + eps) (rl.std_unbiased); TRL loss_type="bnpo" (the token
mean of the micro-batch, here the whole step's batch), scale_rewards="group", the same epsilon
both ways, k3 KL with use_bias_correction_kl=False (TRL 1.16's default True multiplies the KL
by the ratio: another objective). Our policy never samples the vision placeholder ids (they
leave its softmax); TRL's policy and reference get the same through a frozen LM-head bias
(``ban_vision_tokens``). ``objective`` in the JSON feeds both loss computations identical
inputs (our first rollout's prompt + response ids and pixels, random advantages, old log-probs
= the sampler's + noise so that the ratio clips, ``clipped_fraction``, a reference = the
sampler's + noise so that the KL term is not zero) at the same weights and reports the
relative difference of loss, KL and gradient norm (tolerances LOSS_RTOL, GRAD_RTOL) and the
largest difference of the two models' log-probs. Not matched: ``not_matched`` in the JSON.

Each side runs in its own process (peak RSS per side, ``ru_maxrss``); the parent steps them
round by round, alternating which goes first; round 0 (compiling / warm-up) is untimed. Phases
per step: generation (sampling and decoding), scoring (rewards, advantages, log-prob passes),
update (forward, backward, optimizer; TRL's also its loop's batch fetch); TRL's are timed by
wrapping its ``_generate_single_turn`` and ``_generate_and_score_completions``. Gradient
checkpointing is off on both sides (TRL's default is on). ``trl_over_ours``: TRL's time / ours.

--pair=distill: on-policy distillation, our MOPD step with one teacher against TRL 1.16's
``DistillationTrainer`` (on-policy only: every completion is the student's sample; GKDTrainer
with lmbda is in trl.experimental). The teacher: a second random tiny Qwen2.5-VL of the same
shapes (init seed --seed + 1), saved by transformers; ours loads it as rl.teachers.* (on the
mesh). Objective, both sides the token mean of the exact reverse KL(student || teacher) over
the vocabulary: ours rl.mopd.estimator=full_kl, beta 1, rl.mopd.task_reward=False (advantages
0), KL mask off; TRL beta=1.0 (its generalized JSD's reverse-KL end). (Our default k3 and
logratio_advantage estimators read one sampled token per position: no TRL counterpart.) Its
``objective`` compares loss and gradient norm on our first rollout's rows (no perturbation:
neither loss reads old log-probs at advantage 0). TRL's DistillationTrainer takes images
(Qwen2.5-VL's pixel_values / image_grid_thw go to both models' backbones); it samples one
completion per row, so each prompt's row is repeated G times. Its teacher forward runs in its
loss (update); ours too (full_kl). Not matched: ``not_matched``. Writes
trainers-distill-<size>-<machine>.json.

  pip install -e ".[bench]"                                 # trl (not in the default install)
  python -m benchmarks.trainers                             # tiny, 2 prompts x G=4, 32 tokens, 3 timed steps
  python -m benchmarks.trainers --size=bench35m --prompts=4 --group=8 --max_new_tokens=64 --steps=3
  python -m benchmarks.trainers --pair=distill --size=bench35m --prompts=4 --group=8 --max_new_tokens=64 --steps=3

Writes benchmarks/results/trainers-<size>-<machine>.json (see --out_dir) and prints it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from importlib import metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # on a GPU, the torch side needs memory too

import numpy as np  # noqa: E402

SIZES = ("tiny", "bench35m")                  # rl_step.SIZES presets
RECIPE = os.path.join(ROOT, "configs", "grpo_demo.py") + ":smoke"
RECIPES = {"grpo": RECIPE, "distill": os.path.join(ROOT, "configs", "mopd_demo.py") + ":smoke"}
PAIRS = ("grpo", "distill")
PHASES = ("generation_s", "scoring_s", "update_s")
LOSS_RTOL, GRAD_RTOL = 1e-4, 1e-3             # float32, JAX vs torch kernels
OLD_NOISE, REF_NOISE = 0.3, 0.5               # the objective check's log-prob perturbations
NOT_MATCHED = [
    "advantage eps: ours (r - mean) / (std + 1e-6), TRL (r - mean) / (std + 1e-4) (both the sample std)",
    "random streams: each side samples its own responses (same distribution, same weights at round 0)",
    "prompt preparation: ours gets its prompt batches pre-drawn (our loader tokenises and resizes in its own "
    "threads, outside the step); TRL tokenises and preprocesses its prompts inside the step (in scoring)",
    "phase boundaries: TRL's generation is transformers generate alone, its decoding of the texts falls in "
    "scoring; ours decodes in generation; both reuse the sampler's log-probs as the old policy's",
]
# One chat message whose parts are our prompt's text around the screenshot: the processor then
# expands <|image_pad|> to the image's tokens, as our pipeline does.
CHAT_TEMPLATE = ("{% for message in messages %}{% for part in message['content'] %}"
                 "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
                 "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endfor %}")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB


def first_token_reward(token_ids: list[int]) -> float:
    """rl_step.py's ``tokens`` reward of one response: (first token id mod 3) / 2."""
    return (token_ids[0] % 3) / 2.0 if len(token_ids) else 0.0


# ----------------------------------------------------------------------------- shared setup
def build_config(args, model_dir: str = "", teacher_dir: str = ""):
    """grpo_demo's smoke recipe with this comparison's settings (what TRL's GRPOConfig mirrors);
    --pair=distill: mopd_demo's smoke recipe, one teacher for every platform (rl.teachers.* =
    ``teacher_dir``), the exact reverse KL (rl.mopd.estimator=full_kl, beta 1), no task reward
    (rl.mopd.task_reward=False: every advantage 0), KL mask off: distillation alone."""
    from benchmarks import rl_step

    pair = getattr(args, "pair", "grpo")
    c = rl_step.load_config(RECIPES[pair])
    c.model.tiny.update(rl_step.SIZES[args.size])
    c.model.hf_path = model_dir
    c.model.dtype = "float32"
    c.data.batch_size = args.prompts
    c.rl.update(group_size=args.group, max_new_tokens=args.max_new_tokens, minibatches=1, ppo_epochs=1,
                aggregation="token_mean", kl_beta=args.beta, kl_kind="k3", kl_clamp=0.0, clip_low=args.epsilon,
                clip_high=args.epsilon, dual_clip=0.0, normalize_std=True, std_unbiased=True, temperature=1.0,
                top_p=1.0, top_k=0, old_logprobs="auto")
    c.rl.sngs.enabled = False
    if pair == "distill":
        c.rl.teachers = {"*": teacher_dir or "random:1"}     # (random:1 until the teacher folder exists)
        c.rl.mopd.update(estimator="full_kl", beta=1.0, task_reward=False, kl_mask="off")
        c.rl.kl_beta = 0.0
        c.train.memory_plan = False
    c.optim.update(lr=args.lr, schedule="constant", warmup_steps=0, weight_decay=0.0, b1=0.9, b2=0.999, eps=1e-8,
                   clip_norm=1.0)
    c.train.update(steps=total_steps(args), export=False, progress=False, tensorboard=False, eval_every=0)
    return c


def make_model_folder(args, workdir: str, model_dir: str, seed: int | None = None) -> int:
    """The synthetic world's export and tokenizer (in workdir), then a random Qwen2.5-VL built by
    transformers from our tiny config (init seed ``seed``, default --seed), saved with the
    tokenizer and an image processor whose pixel bounds are the recipe's. Returns the parameter
    count. (--pair=distill calls it twice: the student, then the teacher at another seed.)"""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from guilibra_jax.models import param_count
    from guilibra_jax.train import data_source, export, model_factory

    config = build_config(args)
    data_source.train_files(config, workdir)
    tokenizer = data_source.prepare_tokenizer(config, workdir)
    mc = model_factory.tiny_model_config(config.model.tiny, tokenizer)
    torch.manual_seed(args.seed if seed is None else seed)
    model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**mc.to_hf()))
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    bounds = (int(config.data.min_pixels), int(config.data.max_pixels))
    with open(os.path.join(model_dir, "preprocessor_config.json"), "w") as f:
        json.dump(export.preprocessor_config("qwen2_5_vl", bounds, model_config=mc), f, indent=1)
    return param_count(mc)


def draw_batches(args, workdir: str, model_dir: str, n: int) -> list[dict]:
    """``n`` RL prompt batches of the synthetic world, as our loader draws them."""
    from guilibra_jax.data.pipeline import make_rl_loader
    from guilibra_jax.models.checkpoint import read_config
    from guilibra_jax.train import data_source
    from guilibra_jax.train.rl.trainer import Prompts

    config = build_config(args, model_dir)
    tokenizer = data_source.prepare_tokenizer(config, workdir)
    files = data_source.train_files(config, workdir)
    prompts = Prompts(make_rl_loader(data_source.data_config(config, files), tokenizer, read_config(model_dir),
                                     shard_index=0, shard_count=1))
    try:
        batches = [next(prompts) for _ in range(n)]
    finally:
        prompts.close()
    for b in batches:
        if not np.all(b["row_valid"]):
            raise SystemExit("a prompt batch holds a dropped record: both sides need the same prompts")
        b.pop("dropped", None)
    return batches


def trl_rows(batches: list[dict], model_dir: str) -> list[dict]:
    """TRL's dataset rows of our prompts, in order: ``prompt`` (one user message: our prompt's
    text before the screenshot, the image, the text after), ``image`` (the screenshot as our
    pipeline resized it) and ``ours`` (our prompt ids and pixel values, to check TRL's)."""
    from PIL import Image
    from transformers import AutoTokenizer

    from guilibra_jax.data import images as I
    from guilibra_jax.models.checkpoint import read_config
    from guilibra_jax.train.rl import rollout as RO

    mc = read_config(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    img_cfg = I.processor_config("qwen2_5_vl", model_config=mc)
    decode = lambda ids: tok.decode([int(i) for i in ids], skip_special_tokens=False,
                                    clean_up_tokenization_spaces=False)
    rows = []
    for batch in batches:
        ro = RO.expand_groups(batch, 1)
        for r in range(ro.rows):
            ids = ro.prompt_ids[r][ro.prompt_mask[r] > 0]
            start = int(np.nonzero(ids == mc.vision_start_token_id)[0][0])
            end = int(np.nonzero(ids == mc.vision_end_token_id)[0][0])
            prompt = [{"role": "user", "content": [{"type": "text", "text": decode(ids[:start])}, {"type": "image"},
                                                   {"type": "text", "text": decode(ids[end + 1:])}]}]
            image = Image.fromarray(I.patches_to_image(ro.pixels[r], ro.grids[r], img_cfg))
            rows.append({"prompt": prompt, "image": image, "ours": (ids.tolist(), ro.pixels[r])})
    return rows


# ----------------------------------------------------------------------------- our side
def ours_side(conn, args, workdir: str, model_dir: str, batches: list[dict], check=None) -> None:
    """Our process: setup, the objective check on batch 0, then one GRPO step per "step".
    ``check``: the objective check ``(s, state, batch, seed) -> dict`` (default: the pair's)."""
    from guilibra_jax.train import distributed

    distributed.apply_gpu_xla_flags()
    import jax

    from guilibra_jax.train import config as run_config
    from guilibra_jax.train import data_source
    from guilibra_jax.train import multihost as MH
    from guilibra_jax.train.rl import setup as RS

    t0 = time.perf_counter()
    config = build_config(args, model_dir, getattr(args, "teacher_dir", ""))
    run_config.validate(config)
    s, state, _ = RS.setup(config, MH.run_mesh(config), data_source.prepare_tokenizer(config, workdir))
    conn.send({"setup_s": time.perf_counter() - t0})
    conn.recv()
    if check is None:
        check = ours_distill_objective if getattr(args, "pair", "grpo") == "distill" else ours_objective
    conn.send(check(s, state, batches[0], args.seed))
    for r, batch in enumerate(batches):
        conn.recv()
        state, out = ours_step(s, state, batch, jax.random.PRNGKey(1000 + r))
        conn.send(out)
    conn.recv()
    conn.send({"peak_rss_bytes": peak_rss_bytes()})


def ours_step(s, state, batch, key):
    """One step, its phases timed (and named in a profiler trace: benchmarks/op_profile.py)."""
    from jax.profiler import TraceAnnotation

    from benchmarks.rl_step import group_std_mean, token_reward
    from guilibra_jax.train.rl import advantages as ADV
    from guilibra_jax.train.rl import phases as PH

    t0 = time.perf_counter()
    with TraceAnnotation("generation"):
        ro = PH.rollout(s, state["params"], batch, key)
    t1 = time.perf_counter()
    with TraceAnnotation("scoring"):
        sc = token_reward(s, ro)
        adv = ADV.compute(sc.reward, sc.success & ro.valid, s.rl.group_size, s.method, s.rl)
        scores = PH.score(s, state["params"], ro)
    t2 = time.perf_counter()
    with TraceAnnotation("update"):
        state, metrics, _ = PH.update(s, state, ro, adv, scores)
    t3 = time.perf_counter()
    return state, {"generation_s": t1 - t0, "scoring_s": t2 - t1, "update_s": t3 - t2, "step_s": t3 - t0,
                   "response_tokens": int(ro.lengths[ro.valid].sum()), "reward_mean": float(sc.reward.mean()),
                   "reward_group_std": group_std_mean(sc.reward, s.rl.group_size), "kl": float(metrics["kl"]),
                   "loss": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"])}


def ours_objective(s, state, batch, seed: int, key: int = 7) -> dict:
    """Our loss, KL and gradient norm on a rollout of ``batch`` (sampling key ``key``) with
    perturbed old / reference log-probs and random advantages (an update on a copy of the
    state), and those inputs (pixel_values / image_grid_thw only when the prompts have images)."""
    import jax

    from guilibra_jax.train.rl import phases as PH

    ro = PH.rollout(s, state["params"], batch, jax.random.PRNGKey(key))
    scores = PH.score(s, state["params"], ro)
    if not scores.shared:
        raise SystemExit("the objective check reads the shared-prompt layout (rl.share_prefill=True)")
    on = scores.seq["response_mask"] > 0                     # [R, N'], column t = response token t
    rng = np.random.default_rng(seed)
    noisy = lambda scale: np.where(on, scores.old_logp + scale * rng.standard_normal(on.shape), 0).astype(np.float32)
    old, ref = noisy(OLD_NOISE), noisy(REF_NOISE)
    ones = np.ones(ro.rows, np.float32)
    adv = {"advantages": rng.standard_normal(ro.rows).astype(np.float32), "kl_mask": ones, "lambda": ones}
    copy = jax.tree.map(lambda x: x.copy(), state)
    _, metrics, _ = PH.update(s, copy, ro, adv, dataclasses.replace(scores, old_logp=old, ref_logp=ref))
    n = on.shape[1]
    out = {"prompt_ids": [ro.prompt_ids[r][ro.prompt_mask[r] > 0].tolist() for r in range(ro.rows)],
           "completion_ids": np.asarray(ro.tokens[:, :n]), "completion_mask": on.astype(np.int64),
           "policy_logp": np.where(on, scores.old_logp, 0).astype(np.float32), "old_logp": old, "ref_logp": ref,
           "advantages": adv["advantages"],
           "image_token_id": s.model_config.image_token_id, "pad_id": s.pad_id, "epsilon": s.rl.clip_high,
           "loss": float(metrics["loss"]), "kl": float(metrics["kl"]), "grad_norm": float(metrics["grad_norm"])}
    if any(p is not None for p in ro.pixels):
        out.update(pixel_values=np.concatenate(ro.pixels), image_grid_thw=np.stack(ro.grids))
    return out


def ours_distill_objective(s, state, batch, seed: int) -> dict:
    """--pair=distill: our MOPD loss (full_kl, advantages 0: the token mean of the exact reverse
    KL(student || teacher)) and gradient norm on a rollout of ``batch`` (an update on a copy of
    the state), and those inputs. Nothing to perturb: the loss reads no old or reference log-probs
    (the ratio is 1 and multiplies a 0 advantage)."""
    import jax

    from guilibra_jax.train.rl import advantages as ADV
    from guilibra_jax.train.rl import phases as PH

    ro = PH.rollout(s, state["params"], batch, jax.random.PRNGKey(7))
    scores = PH.score(s, state["params"], ro)
    if not scores.shared:
        raise SystemExit("the objective check reads the shared-prompt layout (rl.share_prefill=True)")
    on = scores.seq["response_mask"] > 0
    zeros = np.zeros(ro.rows, np.float32)
    adv = ADV.compute(zeros, np.zeros(ro.rows, bool), s.rl.group_size, s.method, s.rl)
    copy = jax.tree.map(lambda x: x.copy(), state)
    _, metrics, _ = PH.update(s, copy, ro, adv, scores)
    n = on.shape[1]
    return {"prompt_ids": [ro.prompt_ids[r][ro.prompt_mask[r] > 0].tolist() for r in range(ro.rows)],
            "completion_ids": np.asarray(ro.tokens[:, :n]), "completion_mask": on.astype(np.int64),
            "policy_logp": np.where(on, scores.old_logp, 0).astype(np.float32),
            "advantages": np.asarray(adv["advantages"], np.float32),
            "pixel_values": np.concatenate(ro.pixels), "image_grid_thw": np.stack(ro.grids),
            "image_token_id": s.model_config.image_token_id, "pad_id": s.pad_id,
            "loss": float(metrics["loss"]), "kl": float(metrics["kl"]), "grad_norm": float(metrics["grad_norm"])}


# ----------------------------------------------------------------------------- TRL's side
def grpo_args(args, out_dir: str):
    """TRL's GRPOConfig mirroring build_config."""
    from trl import GRPOConfig

    rows = args.prompts * args.group
    return GRPOConfig(
        output_dir=out_dir, max_steps=total_steps(args), per_device_train_batch_size=rows, gradient_accumulation_steps=1,
        steps_per_generation=1, num_iterations=1, num_generations=args.group, max_completion_length=args.max_new_tokens,
        temperature=1.0, top_p=1.0, top_k=0, beta=args.beta, epsilon=args.epsilon, epsilon_high=args.epsilon,
        loss_type="bnpo", scale_rewards="group", mask_truncated_completions=False, learning_rate=args.lr,
        use_bias_correction_kl=False, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta1=0.9,
        adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0, shuffle_dataset=False, gradient_checkpointing=False,
        bf16=False, fp16=False, seed=args.seed, logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True)


def distill_args(args, out_dir: str):
    """--pair=distill: TRL's DistillationConfig mirroring build_config (beta 1.0: the reverse KL
    KL(student || teacher) over the vocabulary; TRL 1.16's DistillationTrainer is on-policy only:
    every completion is the student's own sample, no lmbda)."""
    from trl import DistillationConfig

    rows = args.prompts * args.group
    return DistillationConfig(
        output_dir=out_dir, max_steps=total_steps(args), per_device_train_batch_size=rows, gradient_accumulation_steps=1,
        max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, beta=1.0,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta1=0.9,
        adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0, shuffle_dataset=False, gradient_checkpointing=False,
        bf16=False, fp16=False, seed=args.seed, logging_steps=1, save_strategy="no", report_to="none",
        disable_tqdm=True)


def trl_processor(model_dir: str):
    """Qwen2_5_VLProcessor from the folder's image processor (PIL backend: our resize) and
    tokenizer, without a video processor: its class, and so AutoProcessor, needs torchvision."""
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2_5_VLProcessor

    class ImageOnlyProcessor(Qwen2_5_VLProcessor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")   # as TRL's own AutoProcessor call
    return ImageOnlyProcessor(image_processor=AutoImageProcessor.from_pretrained(model_dir, backend="pil"),
                              tokenizer=tokenizer, video_processor=None, chat_template=CHAT_TEMPLATE)


def ban_vision_tokens(model) -> None:
    """Our policy never samples the vision placeholder ids (rollout.vision_token_ids: excluded from
    its softmax when sampling and scoring); the same for a transformers model: a frozen LM-head bias
    of -1e4 at those ids (exp underflows to 0 in float32). Without it TRL samples <|image_pad|> now
    and then, and its next forward fails (image features and image tokens do not match)."""
    import torch

    cfg = model.config
    head = model.get_output_embeddings()
    bias = torch.zeros(head.weight.shape[0], dtype=head.weight.dtype, device=head.weight.device)
    bias[[cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id]] = -1e4
    head.bias = torch.nn.Parameter(bias, requires_grad=False)


def trl_reward(prompts, completions, completion_ids, **_):
    return [first_token_reward(ids) for ids in completion_ids]


def trl_side(conn, args, model_dir: str, out_dir: str, rows: list[dict]) -> None:
    """TRL's process: the trainer, the prompt agreement and objective checks, then train(),
    each step waiting for the parent's "step". --pair=distill: DistillationTrainer with the
    teacher folder; it samples one completion per dataset row, so each prompt's row is
    repeated ``group`` times in a row (our G responses per prompt)."""
    import datasets

    t0 = time.perf_counter()
    distill = getattr(args, "pair", "grpo") == "distill"
    repeat = args.group if distill else 1
    data = datasets.Dataset.from_dict({"prompt": [r["prompt"] for r in rows for _ in range(repeat)],
                                       "image": [r["image"] for r in rows for _ in range(repeat)]})
    if distill:
        from trl import DistillationTrainer

        trainer = DistillationTrainer(model=model_dir, teacher_model=args.teacher_dir, args=distill_args(args, out_dir),
                                      train_dataset=data, processing_class=trl_processor(model_dir))
        models = (trainer.model, trainer.teacher_model)
    else:
        from trl import GRPOTrainer

        trainer = GRPOTrainer(model=model_dir, reward_funcs=trl_reward, args=grpo_args(args, out_dir),
                              train_dataset=data, processing_class=trl_processor(model_dir))
        models = (trainer.model, trainer.ref_model)
    for model in filter(None, models):     # (no reference at beta 0)
        ban_vision_tokens(model)
    time_phases(trainer, conn, distill)
    conn.send({"setup_s": time.perf_counter() - t0, "prompts": prompt_agreement(trainer, data, rows, repeat)})
    conn.send((trl_distill_objective if distill else trl_objective)(trainer, conn.recv()))
    trainer.train()
    conn.recv()
    conn.send({"peak_rss_bytes": peak_rss_bytes()})


def time_phases(trainer, conn, distill: bool = False) -> None:
    """Gate each step on the parent's "step" (in get_batch_samples, the step's first call),
    time generation and generation + scoring, and send each step's times and metrics.
    (DistillationTrainer: no rewards, the loss is the KL, the teacher's forward is in update.)"""
    from transformers import TrainerCallback

    clock = {}

    def wrap(name, key):
        inner = getattr(trainer, name)

        def timed(*a, **k):
            t = time.perf_counter()
            out = inner(*a, **k)
            clock[key] += time.perf_counter() - t
            return out
        setattr(trainer, name, timed)

    gate_inner = trainer.get_batch_samples

    def gate(*a, **k):
        conn.recv()
        clock.update(t0=time.perf_counter(), gen=0.0, gen_score=0.0)
        return gate_inner(*a, **k)

    def keep(name, key):
        inner = getattr(trainer, name)

        def kept(*a, **k):
            out = inner(*a, **k)
            clock[key] = float(out)
            return out
        setattr(trainer, name, kept)

    trainer.get_batch_samples = gate
    wrap("_generate_single_turn", "gen")
    wrap("_generate_and_score_completions", "gen_score")
    keep("compute_loss", "loss")
    keep("_clip_grad_norm", "grad_norm")       # the norm before clipping, as ours reports

    class Report(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            step = time.perf_counter() - clock["t0"]
            m = {k: v[-1] for k, v in trainer._metrics["train"].items() if v}
            rows = args.per_device_train_batch_size
            conn.send({"generation_s": clock["gen"], "scoring_s": clock["gen_score"] - clock["gen"],
                       "update_s": step - clock["gen_score"], "step_s": step,
                       "response_tokens": int(round(m["completions/mean_length"] * rows)),
                       "reward_mean": m.get("reward", 0.0), "reward_group_std": m.get("reward_std", 0.0),
                       "kl": clock["loss"] if distill else m.get("kl", 0.0),
                       "loss": clock["loss"], "grad_norm": clock["grad_norm"]})

    trainer.add_callback(Report())


def prompt_agreement(trainer, data, rows: list[dict], repeat: int = 1) -> dict:
    """TRL's own tokenisation of the dataset prompts (``_tokenize_prompts``) against ours
    (every ``repeat``-th dataset row: the distill pair's rows repeat each prompt)."""
    from trl.data_utils import prepare_multimodal_messages

    messages = [prepare_multimodal_messages(x["prompt"], images=[x["image"]]) for x in data.select(
        range(0, len(data), repeat))]
    ids, _, fields = trainer._tokenize_prompts(messages)
    theirs = np.asarray(fields["pixel_values"], np.float32)
    ours = np.concatenate([r["ours"][1] for r in rows])
    return {"identical_ids": all(list(a) == b for a, b in zip(ids, [r["ours"][0] for r in rows])),
            "pixel_max_abs_diff": float(np.abs(theirs - ours).max()) if theirs.shape == ours.shape else None}


def trl_inputs(trainer, p: dict) -> dict:
    """Our objective-check rows as TRL's batch (left-padded prompts, our completions, pixels)."""
    import torch

    prompts = [torch.tensor(x) for x in p["prompt_ids"]]
    width = max(len(x) for x in prompts)
    prompt_ids = torch.stack([torch.cat([torch.full((width - len(x),), p["pad_id"]), x]) for x in prompts])
    prompt_mask = torch.stack([torch.cat([torch.zeros(width - len(x)), torch.ones(len(x))]).long() for x in prompts])
    completion_ids = torch.tensor(p["completion_ids"]).long()
    mm = torch.cat([(prompt_ids == p["image_token_id"]).long(), torch.zeros_like(completion_ids)], 1)
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
              "completion_mask": torch.tensor(p["completion_mask"]), "advantages": torch.tensor(p["advantages"]),
              "pixel_values": torch.tensor(p["pixel_values"]), "image_grid_thw": torch.tensor(p["image_grid_thw"]),
              "num_images": [1] * len(prompts), "mm_token_type_ids": mm}
    if "old_logp" in p:
        inputs.update(old_per_token_logps=torch.tensor(p["old_logp"]), ref_per_token_logps=torch.tensor(p["ref_logp"]))
    device = trainer.model.device
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def trl_objective(trainer, p: dict) -> dict:
    """TRL's loss (``_compute_loss``), KL and gradient norm on our objective-check inputs."""
    import torch

    inputs, model = trl_inputs(trainer, p), trainer.model
    completion_ids = inputs["completion_ids"]
    model.train()
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(
            model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), completion_ids.shape[1],
            **{k: inputs[k] for k in ("pixel_values", "image_grid_thw", "num_images", "mm_token_type_ids")})
    on = inputs["completion_mask"] > 0
    logp_diff = float((logp - torch.tensor(p["policy_logp"]).to(logp.device))[on].abs().max())
    model.zero_grad()
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    grad_norm = torch.nn.utils.get_total_norm([w.grad for w in model.parameters() if w.grad is not None])
    model.zero_grad()
    kl = (trainer._metrics["train"].get("kl") or [0.0])[-1]       # (no KL term at beta 0)
    trainer._metrics["train"].clear()
    return {"loss": float(loss), "kl": float(kl), "grad_norm": float(grad_norm), "logp_max_abs_diff": logp_diff}


def trl_distill_objective(trainer, p: dict) -> dict:
    """--pair=distill: DistillationTrainer's loss (``_compute_loss``, beta 1: the token mean of the
    exact reverse KL over the vocabulary, which is also its KL) and gradient norm on our rows, and
    the largest difference of the student's log-probs of our sampled tokens from ours."""
    import torch

    inputs, model = trl_inputs(trainer, p), trainer.model
    n = inputs["completion_ids"].shape[1]
    mm = {k: inputs[k] for k in ("pixel_values", "image_grid_thw", "mm_token_type_ids")}
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    model.train()
    with torch.no_grad():
        hidden = trainer._get_last_hidden_state(model, ids, mask, n, **mm)
        logp = torch.log_softmax(model.get_output_embeddings()(hidden), -1)
        logp = logp.gather(-1, inputs["completion_ids"][..., None])[..., 0]
    on = inputs["completion_mask"] > 0
    logp_diff = float((logp - torch.tensor(p["policy_logp"]).to(logp.device))[on].abs().max())
    model.zero_grad()
    loss, _, _ = trainer._compute_loss(model, inputs, None)
    loss.backward()
    grad_norm = torch.nn.utils.get_total_norm([w.grad for w in model.parameters() if w.grad is not None])
    model.zero_grad()
    return {"loss": float(loss), "kl": float(loss), "grad_norm": float(grad_norm), "logp_max_abs_diff": logp_diff}


# ----------------------------------------------------------------------------- the parent
def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def objective_report(ours: dict, trl: dict, peer: str = "trl") -> dict:
    """Both sides' loss, KL and gradient norm on the check's inputs, their relative differences
    and ``ok`` (within LOSS_RTOL / GRAD_RTOL); the peer's figures under ``peer``."""
    out = {"ours": {k: ours[k] for k in ("loss", "kl", "grad_norm")}, peer: trl,
           "rows": len(ours["prompt_ids"]), "response_tokens": int(ours["completion_mask"].sum()),
           "loss_rtol": LOSS_RTOL, "grad_rtol": GRAD_RTOL}
    if "old_logp" in ours:     # (the GRPO pair's perturbed inputs; the distill pair reads none)
        out.update(old_logp_noise=OLD_NOISE, ref_logp_noise=REF_NOISE)
    else:
        out["rel_diff"] = {k: rel(trl[k], ours[k]) for k in ("loss", "kl", "grad_norm")}
        out["ok"] = out["rel_diff"]["loss"] <= LOSS_RTOL and out["rel_diff"]["grad_norm"] <= GRAD_RTOL
        return out
    on = ours["completion_mask"] > 0
    ratio, adv = np.exp(ours["policy_logp"] - ours["old_logp"]), ours["advantages"][:, None]
    eps = ours["epsilon"]
    clipped = ((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))
    out["clipped_fraction"] = round(float(clipped[on].mean()), 3)     # tokens on the clipped branch
    out["rel_diff"] = {k: rel(trl[k], ours[k]) for k in ("loss", "kl", "grad_norm")}
    out["ok"] = (out["rel_diff"]["loss"] <= LOSS_RTOL and out["rel_diff"]["kl"] <= LOSS_RTOL
                 and out["rel_diff"]["grad_norm"] <= GRAD_RTOL)
    return out


def total_steps(args) -> int:
    """The steps each side takes: one untimed, then --steps rounds of --steps_per_turn."""
    return args.steps * getattr(args, "steps_per_turn", 1) + 1


def side_summary(steps: list[dict], setup_s: float, rss: int, rows: int) -> dict:
    """Means over the timed steps (round 0 left out; with --steps_per_turn > 1 each turn's
    first step too, reported apart as turn_first_step_s) and the rates."""
    timed = [s for s in steps[1:] if not s.get("turn_first")]
    firsts = [s["step_s"] for s in steps[1:] if s.get("turn_first")]
    mean = lambda k: float(np.mean([s[k] for s in timed]))
    tokens = mean("response_tokens")
    out = {"setup_s": round(setup_s, 2), "first_step_s": round(steps[0]["step_s"], 3),
           "step_s": round(mean("step_s"), 4), "step_s_each": [round(s["step_s"], 3) for s in timed],
           **{k: round(mean(k), 4) for k in PHASES}, "response_tokens_per_step": round(tokens, 1),
           "response_length": round(tokens / rows, 2), "response_tokens_per_s": round(tokens / mean("step_s"), 1),
           "generation_tokens_per_s": round(tokens / mean("generation_s"), 1), "peak_rss_bytes": rss,
           "peak_rss_gib": round(rss / 2 ** 30, 3)}
    for k in ("reward_mean", "reward_group_std", "kl", "loss", "grad_norm"):
        out[k] = round(mean(k), 5)
    if firsts:
        out.update(turn_first_step_s=round(float(np.mean(firsts)), 4), turn_first_each=[round(x, 3) for x in firsts])
    return out


def recv(conn, proc):
    """The side's next message; SystemExit if its process ended without sending one."""
    while not conn.poll(1.0):
        if not proc.is_alive():
            raise SystemExit(f"{proc.name} exited with status {proc.exitcode} (its traceback is above)")
    return conn.recv()


def interleaved_steps(ask, names: list[str], timed: int, per_turn: int = 1) -> dict[str, list[dict]]:
    """{side: [its step results]} from ``_common.interleaved_steps`` (``ask(side, "step")``), each
    marked ``turn_first``; the first is round 0's untimed step."""
    from benchmarks import _common as C      # (imports JAX: not at module level)
    rows = C.interleaved_steps(lambda name: ask(name, "step"), names, timed, per_turn)
    return {name: [dict(x.out, turn_first=x.turn_first) for x in rs] for name, rs in rows.items()}


def run_sides(args, workdir: str, model_dir: str) -> dict:
    """Both sides in their own processes, stepped round by round (which goes first alternates)."""
    batches = draw_batches(args, workdir, model_dir, total_steps(args))
    rows = trl_rows(batches, model_dir)
    ctx = multiprocessing.get_context("spawn")
    conns, procs, setup = {}, {}, {}
    ask = lambda name, message: (conns[name].send(message), recv(conns[name], procs[name]))[1]
    try:
        for name, target, extra in (("guilibra_jax", ours_side, (workdir, model_dir, batches)),
                                    ("trl", trl_side, (model_dir, os.path.join(workdir, "trl"), rows))):
            parent, child = ctx.Pipe()
            procs[name] = ctx.Process(target=target, args=(child, args, *extra), name=name, daemon=True)
            procs[name].start()
            conns[name] = parent
            setup[name] = recv(parent, procs[name])          # one side builds at a time
        ours_check = ask("guilibra_jax", "check")
        objective = objective_report(ours_check, ask("trl", ours_check))
        steps = interleaved_steps(ask, list(conns), args.steps, args.steps_per_turn)
        rss = {name: ask(name, "stop")["peak_rss_bytes"] for name in conns}
    finally:
        for proc in procs.values():
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
    n_rows = args.prompts * args.group
    sides = {name: side_summary(steps[name], setup[name]["setup_s"], rss[name], n_rows) for name in conns}
    ratio = {k: round(sides["trl"][k] / sides["guilibra_jax"][k], 3) for k in ("step_s",) + PHASES}
    return {"sides": sides, "trl_over_ours": ratio, "objective": objective, "prompts_match": setup["trl"]["prompts"],
            "per_round": steps}


DISTILL_NOT_MATCHED = [
    "random streams: each side samples its own responses (same distribution, same weights at round 0)",
    "prompt preparation: ours gets its prompt batches pre-drawn; TRL tokenises and preprocesses inside the step",
    "groups: TRL's DistillationTrainer samples one completion per dataset row (no num_generations): each prompt's "
    "row is repeated G times, consecutively, shuffling off; ours samples G per prompt with a shared prefill",
    "phase boundaries: TRL's teacher forward runs inside its loss (update); ours, with rl.mopd.estimator=full_kl, "
    "also runs the teacher inside the update (the exact KL needs both models' logits); our scoring still computes "
    "the student's sampling log-probs (and the task reward, which the zero advantages then ignore); TRL's scoring "
    "is decoding and bookkeeping",
    "vision ids: ours leaves them out of both softmaxes; TRL's student and teacher get a frozen LM-head bias of "
    "-1e4 there (ban_vision_tokens), which its chunked divergence reads (TRL alone suppresses only <|image_pad|>)",
    "estimators: the per-token k3 or logratio_advantage estimators of MOPD (one sampled token per position) have "
    "no TRL counterpart; only full_kl (exact reverse KL over the vocabulary) is the same math as TRL's beta=1",
]


def distill_row(args, params: int, res: dict) -> dict:
    for side in res["sides"].values():     # (no task reward in this pair: TRL's trainer has none)
        side.pop("reward_mean", None), side.pop("reward_group_std", None)
    return {"benchmark": "trainers", "pair": "distill", "size": args.size, "params": params,
            "teacher": f"random tiny Qwen2.5-VL, the same shapes, init seed {args.seed + 1}", "prompts": args.prompts,
            "group": args.group, "rows": args.prompts * args.group, "max_new_tokens": args.max_new_tokens,
            "steps_timed": args.steps, "steps_per_turn": args.steps_per_turn, "lr": args.lr, "dtype": "float32",
            "updates_per_step": 1,
            "objective_settings": {
                "ours": "method=mopd, rl.teachers.*=<teacher folder>, rl.mopd.estimator=full_kl, rl.mopd.beta=1, "
                        "rl.mopd.task_reward=False (advantages 0: the clipped surrogate is 0, its gradient 0), "
                        "rl.mopd.kl_mask=off, rl.aggregation=token_mean, rl.kl_beta=0: loss = token mean of the "
                        "exact KL(student || teacher) over the vocabulary",
                "trl": "DistillationTrainer (on-policy only in TRL 1.16: no lmbda; GKDTrainer lives in "
                       "trl.experimental), beta=1.0 (reverse KL of its generalized JSD), temperature 1, "
                       "loss = token mean of KL(student || teacher) over the vocabulary (chunked)"},
            "not_matched": DISTILL_NOT_MATCHED,
            "trl_versions": {k: metadata.version(k) for k in ("trl", "accelerate", "datasets")}, **res}


def add_step_args(ap, group_help: str = "G responses per prompt") -> None:
    """The step's shape and optimisation flags, shared with benchmarks/trainers_tunix.py."""
    ap.add_argument("--size", default="tiny", choices=SIZES, help="model.tiny.* preset (benchmarks/rl_step.py)")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step")
    ap.add_argument("--group", type=int, default=4, help=group_help)
    ap.add_argument("--max_new_tokens", type=int, default=32, help="response length limit")
    ap.add_argument("--steps", type=int, default=3, help="timed rounds per side (after one untimed warm-up step)")
    ap.add_argument("--steps_per_turn", type=int, default=1,
                    help="consecutive steps per side per round; > 1: the means leave each turn's first out "
                         "(reported as turn_first_step_s)")
    ap.add_argument("--beta", type=float, default=0.1, help="KL coefficient (grpo_demo's rl.kl_beta)")
    ap.add_argument("--epsilon", type=float, default=0.2, help="PPO clip, both ways")
    ap.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate, constant")
    ap.add_argument("--seed", type=int, default=0, help="the model's init and the objective check's noise")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="grpo", choices=PAIRS,
                    help="grpo: our GRPO step vs GRPOTrainer | distill: our MOPD step (one teacher, full_kl, no task "
                         "reward) vs DistillationTrainer (beta 1: reverse KL)")
    add_step_args(ap)
    from benchmarks import _common as C      # (imports JAX: not at module level, which TRL's process imports)

    C.add_result_args(ap)
    args = ap.parse_args(argv)
    if args.steps < 1:
        raise SystemExit("--steps must be >= 1 (timed steps after the warm-up step)")
    if args.steps_per_turn < 1:
        raise SystemExit("--steps_per_turn must be >= 1")
    start = C.run_start()
    with tempfile.TemporaryDirectory() as tmp:
        workdir, model_dir = os.path.join(tmp, "run"), os.path.join(tmp, "model")
        params = make_model_folder(args, workdir, model_dir)
        args.teacher_dir = ""
        if args.pair == "distill":      # the teacher: the same shapes, another init seed
            args.teacher_dir = os.path.join(tmp, "teacher")
            make_model_folder(args, workdir, args.teacher_dir, seed=args.seed + 1)
        res = run_sides(args, workdir, model_dir)
    if args.pair == "distill":
        return C.report("trainers", f"trainers-distill-{args.size}", distill_row(args, params, res), args, start)
    row = {"benchmark": "trainers", "size": args.size, "params": params, "prompts": args.prompts,
           "group": args.group, "rows": args.prompts * args.group, "max_new_tokens": args.max_new_tokens,
           "steps_timed": args.steps, "steps_per_turn": args.steps_per_turn, "beta": args.beta, "epsilon": args.epsilon,
           "lr": args.lr, "dtype": "float32",
           "updates_per_step": 1, "reward": "tokens: (first response token id mod 3) / 2",
           "objective_settings": {"ours": "rl.aggregation=token_mean, rl.kl_kind=k3, rl.kl_clamp=0, "
                                          "rl.sngs.enabled=False, rl.std_unbiased=True, rl.old_logprobs=auto",
                                  "trl": "loss_type=bnpo, scale_rewards=group, use_bias_correction_kl=False, "
                                         "num_iterations=1, mask_truncated_completions=False, vision ids banned "
                                         "(LM-head bias -1e4, policy and reference)"},
           "not_matched": NOT_MATCHED,
           "trl_versions": {k: metadata.version(k) for k in ("trl", "accelerate", "datasets")}, **res}
    return C.report("trainers", f"trainers-{args.size}", row, args, start)


if __name__ == "__main__":
    from benchmarks._common import launcher_malloc
    launcher_malloc()
    main()
