"""Who answers the curation prompts: a pluggable :class:`Sampler` per stage.

* :class:`ModelSampler` ("model"): our checkpoint, batched and sharded over the mesh
  exactly like RL sampling (``train.rl.phases.rollout``: G copies of each prompt row,
  prompts widened to the width every process agrees on, images joined across processes,
  results back per process). A collective: with several processes every process calls
  :meth:`ModelSampler.sample` together, with the same number of rows.
* :class:`EndpointSampler` ("endpoint"): any OpenAI-compatible chat server
  (:class:`guilibra_jax.chat_endpoint.ChatEndpoint`: concurrency, timeouts, retries);
  a request that fails is a :class:`Reply` with its reason, never an exception.
* ``oracle`` (:mod:`.oracle`): the synthetic world's clean labels (demo and tests).

Every sampler shows a record's image in a :class:`prompts.Frame` (coordinate space and
resized size) and says which training format it answers in (``spec.method``), so that a
stage scores its answers with the verifier's own rules.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Protocol, Sequence

import jax
import numpy as np
from PIL import Image

from guilibra_jax import actions as A
from guilibra_jax import generate as G
from guilibra_jax import sharding as SH
from guilibra_jax.chat_endpoint import ChatEndpoint, image_part, text_part
from guilibra_jax.curate.prompts import Frame, Prompt
from guilibra_jax.data import images as I
from guilibra_jax.data import prompts as P
from guilibra_jax.data import samples as S
from guilibra_jax.data import tokenize as T
from guilibra_jax.train.config import base_config
from guilibra_jax.train.rl import phases as PH
from guilibra_jax.train.rl import setup as RS
from guilibra_jax.train.rl import rollout as RO


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """n responses per prompt; temperature 0 = greedy."""

    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256


@dataclasses.dataclass(frozen=True)
class Reply:
    """One response: ``text`` None when it could not be had, with the reason in ``error``."""

    text: str | None
    error: str | None = None


class Sampler(Protocol):
    name: str
    collective: bool          # every process must call sample() together
    spec: S.SampleSpec        # the training format it answers in (method, family, system turn)

    def frame(self, record) -> Frame: ...

    def sample(self, prompts: Sequence[Prompt], params: SamplingParams, seed: int) -> list[list[Reply]]: ...


def family_frame(record, family: str, img_cfg: I.ImageProcessorConfig) -> Frame:
    """How ``family``'s image processor shows ``record``'s screenshot."""
    h, w = I.resized_hw(int(record.image_size[1]), int(record.image_size[0]), img_cfg)
    return Frame(A.FAMILY_COORD_SPACE[family], (w, h))


# ----------------------------------------------------------------------------- our model

class ModelSampler:
    """Our checkpoint (``graphdef``, ``params`` sharded on ``mesh``) prompted as in its
    training run (``run_config.data``: method, system turn, pixel bounds, length buckets).
    ``rows``: prompts per call and process (padded to it: one compiled shape per prompt
    bucket); prompts longer than ``max_prompt_tokens`` are answered ``too_long``."""

    name = "model"
    collective = True

    def __init__(self, run_config, tokenizer, model_config, graphdef, params, mesh, *, rows: int = 8,
                 max_prompt_tokens: int = 0):
        d = run_config.data
        self.tokenizer, self.model_config, self.graphdef, self.params, self.mesh = (
            tokenizer, model_config, graphdef, params, mesh)
        self.family = model_config.family
        self.spec = S.SampleSpec(d.method, self.family, system_prompt=d.system_prompt or None)
        self.img_cfg = I.processor_config(self.family, min_pixels=d.min_pixels or None,
                                          max_pixels=d.max_pixels or None, model_config=model_config)
        self.ids = T.SpecialIds.of(tokenizer)
        self.ids.check_model(model_config)
        self.pad_id, self.stop = RS.special_ids(tokenizer, model_config)
        self.banned = RO.vision_token_ids(model_config)
        self.patch_bucket = int(d.patch_bucket)
        self.max_prompt = int(max_prompt_tokens or d.max_length)
        buckets = sorted({int(b) for b in (tuple(d.seq_buckets) or (d.max_length,)) if b <= self.max_prompt})
        self.buckets = tuple(buckets + ([self.max_prompt] if not buckets or buckets[-1] < self.max_prompt else []))
        dp = int(np.prod([mesh.shape[a] for a in SH.BATCH_AXES]))
        self.row_multiple = max(1, dp // jax.process_count())
        self.rows = int(rows)

    def frame(self, record) -> Frame:
        return family_frame(record, self.family, self.img_cfg)

    def rows_for(self, n: int) -> int:
        """Prompt rows per call for n responses each: ``rows`` rounded up so that the
        rollout rows (rows * n) divide over this process's data-parallel devices."""
        step = self.row_multiple // math.gcd(n, self.row_multiple)
        return -(-self.rows // step) * step

    def _encode(self, p: Prompt):
        """(ids, grid [1, 3], pixel rows) of a prompt, or the reason it has none."""
        try:
            image = I.load_image(p.record.image)
        except I.ImageLoadError:
            return "unreadable_image"
        return self._encode_image(p.system, p.user, image)

    def _encode_image(self, system: str, user: str, image: Image.Image):
        pixels, grid = I.preprocess_image(image, self.img_cfg)
        n_img = int(np.prod(grid)) // self.img_cfg.merge_size ** 2
        ids = T.encode_prompt(self.tokenizer, system, user, [n_img], self.ids)
        if len(ids) > self.max_prompt:
            return "too_long"
        return ids, grid[None], pixels

    @functools.cached_property
    def _blank(self):
        """A filler row for a process whose prompts all failed (never read back)."""
        side = self.img_cfg.factor * 2
        return self._encode_image("", P.IMAGE_PLACEHOLDER + "\n.", Image.new("RGB", (side, side), "white"))

    @functools.lru_cache(maxsize=16)
    def _stage2(self, params: SamplingParams) -> RS.Stage2:
        """The RL loop's sampling context for n responses per prompt (no update, no frozen models)."""
        cfg = base_config()
        cfg.method, cfg.rl.group_size, cfg.data.patch_bucket = self.spec.method, params.n, self.patch_bucket
        sampling = G.SamplingConfig(temperature=params.temperature, top_p=params.top_p,
                                    max_new_tokens=params.max_new_tokens, stop_token_ids=self.stop,
                                    pad_token_id=self.pad_id, banned_token_ids=self.banned)
        return RS.Stage2(cfg, self.mesh, self.graphdef, self.model_config, self.tokenizer, sampling, {}, None,
                         self.pad_id, self.stop, self.banned, self.row_multiple)

    def sample(self, prompts: Sequence[Prompt], params: SamplingParams, seed: int) -> list[list[Reply]]:
        rows = self.rows_for(params.n)
        if len(prompts) > rows:
            raise ValueError(f"ModelSampler.sample: {len(prompts)} prompts > {rows} rows per call")
        encoded = [self._encode(p) for p in prompts]
        ok = [not isinstance(e, str) for e in encoded]
        filler = next((e for e, good in zip(encoded, ok) if good), None) or self._blank
        row_inputs = [e if good else filler for e, good in zip(encoded, ok)] + [filler] * (rows - len(prompts))
        batch = G.prepare_prompts(row_inputs, self.model_config, self.pad_id, bucket_len=self.buckets)
        row_valid = np.array(ok + [False] * (rows - len(prompts)), bool)
        if not row_valid.any():      # fillers only: sample one so that the rollout has a prompt; dropped below
            row_valid[0] = True
        batch.update(row_valid=row_valid,
                     reward_targets=[None] * rows, platform=[""] * rows, resized_size=[(0, 0)] * rows)
        ro = PH.rollout(self._stage2(params), self.params, batch, jax.random.PRNGKey(seed % (2 ** 31)))
        out = []
        for j, e in enumerate(encoded):
            if isinstance(e, str):
                out.append([Reply(None, e)] * params.n)
            else:
                out.append([Reply(ro.texts[j * params.n + k]) for k in range(params.n)])
        return out


# ----------------------------------------------------------------------------- a served model

class EndpointSampler:
    """An OpenAI-compatible server. The screenshot is resized on the client to the
    frame of ``family`` with the given pixel bounds (so the coordinates the prompt names
    are those of the image sent) and sent as a PNG ``data:`` URL where the prompt has
    its image; each of the n responses is its own request (``seed`` sent when
    ``send_seed``, for servers that honour it)."""

    name = "endpoint"
    collective = False

    def __init__(self, endpoint: ChatEndpoint, family: str, method: str = "guilibra", *, min_pixels: int = 0,
                 max_pixels: int = 0, system_prompt: str = "", send_seed: bool = False):
        self.endpoint, self.family, self.send_seed = endpoint, family, send_seed
        self.spec = S.SampleSpec(method, family, system_prompt=system_prompt or None)
        self.img_cfg = I.processor_config(family, min_pixels=min_pixels or None, max_pixels=max_pixels or None)

    def frame(self, record) -> Frame:
        return family_frame(record, self.family, self.img_cfg)

    def stats(self) -> dict[str, int]:
        """Requests by outcome so far (ok, timeout, http_<code>, malformed, failed, ...)."""
        return self.endpoint.summary()

    def request(self, p: Prompt, params: SamplingParams) -> dict:
        """The chat body of a prompt (raises ImageLoadError for an unreadable screenshot)."""
        image = I.load_image(p.record.image)
        if image.size != tuple(p.frame.resized):
            image = image.resize(tuple(p.frame.resized), resample=Image.Resampling.BICUBIC)
        before, _, after = p.user.partition(P.IMAGE_PLACEHOLDER)
        content = ([text_part(before)] if before.strip() else []) + [image_part(image)] + (
            [text_part(after)] if after.strip() else [])
        return {"messages": [{"role": "system", "content": p.system}, {"role": "user", "content": content}],
                "temperature": params.temperature, "top_p": params.top_p, "max_tokens": params.max_new_tokens}

    def sample(self, prompts: Sequence[Prompt], params: SamplingParams, seed: int) -> list[list[Reply]]:
        bodies: list[dict | None] = []
        for p in prompts:
            try:
                bodies.append(self.request(p, params))
            except I.ImageLoadError:
                bodies.append(None)
        requests, where = [], []
        for j, body in enumerate(bodies):
            for k in range(params.n if body is not None else 0):
                requests.append(dict(body, seed=(seed + 7919 * j + k) % (2 ** 31)) if self.send_seed else body)
                where.append(j)
        out: list[list[Reply]] = [[] if b is not None else [Reply(None, "unreadable_image")] * params.n
                                  for b in bodies]
        for j, r in zip(where, self.endpoint.chat_many(requests)):
            out[j].append(Reply(r.text, None) if r.ok else Reply(None, (r.error or "failed").split(":")[0]))
        return out
