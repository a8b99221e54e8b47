"""A model behind an OpenAI-compatible chat endpoint as an evaluation agent, registered
as ``"endpoint"`` (vLLM ``serve``, SGLang, a hosted model).

    make_agent("endpoint", url="http://localhost:8000/v1", export="runs/demo/export")
    make_agent("endpoint", url="https://api.example.com/v1", model="m", api_key_env="MY_KEY",
               family="qwen3_vl", method="mopd")

The prompt is the training pipeline's text (``data.samples.prompt_turns``: the run's
system turn and user text) with the screenshot as a PNG ``data:`` URL in the user turn,
where the training prompt has its image. The screenshot is resized on the client to
the run's pixel budget for its platform (``train.export.pixel_budgets``;
``smart_resize`` + PIL bicubic, the pipeline's resize), so the server's image processor
(the export's ``preprocessor_config.json``, whose bounds contain every platform's) leaves
it unchanged and the model sees the frame it was trained in.

Settings come from ``export`` (a folder of our trainer's export: its
``run_config.json`` and ``config.json``), or ``run_config`` (a training workdir or its
config.json) plus ``family``, or the keywords alone (``family``, ``method``,
``system_prompt``, ``min_pixels``, ``max_pixels``) for a model we did not train.

Requests go through :class:`guilibra_jax.chat_endpoint.ChatEndpoint` (timeouts, retries
with backoff, ``concurrency`` requests at a time in ``respond_batch``). A request that
fails after its retries answers "" (scored as a format failure) and is counted:
``stats()`` gives the counts by reason, and ``eval.run`` writes them into the entry's
offline results. Nothing an endpoint does is fatal to an evaluation.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Sequence

from guilibra_jax import actions as A
from guilibra_jax.chat_endpoint import ChatEndpoint, image_part, text_part
from guilibra_jax.data import images as I
from guilibra_jax.data import native as N
from guilibra_jax.data import prompts as P
from guilibra_jax.data import samples as S
from guilibra_jax.envs.env import Observation
from guilibra_jax.errors import UserError
from guilibra_jax.eval.agents import register_agent
from guilibra_jax.train import config as RC
from guilibra_jax.train import export as E

log = logging.getLogger(__name__)

KEY = "agent_kwargs.endpoint"
METHOD_FORMAT = {"guilibra": "guilibra", "mopd": "tool_call"}
HF_FAMILY = {"qwen2_5_vl": "qwen2_5_vl", "qwen3_vl": "qwen3_vl"}


def _export_family(folder: str) -> str:
    path = os.path.join(folder, "config.json")
    if not os.path.exists(path):
        raise UserError(f"{KEY}.export: no config.json in {folder!r} (a Hugging Face export of our trainer)")
    with open(path) as f:
        model_type = json.load(f).get("model_type", "")
    if model_type not in HF_FAMILY:
        raise UserError(f"{KEY}.export: {path} has model_type {model_type!r}; expected one of {sorted(HF_FAMILY)}")
    return HF_FAMILY[model_type]


def _run_config(export: str, run_config: str):
    if export and run_config:
        raise UserError(f"{KEY}: set export or run_config, not both (export={export!r}, run_config={run_config!r})")
    path = os.path.join(export, E.RUN_CONFIG_FILE) if export else run_config
    if not path:
        return RC.base_config()
    try:
        return RC.load_run_config(path)
    except FileNotFoundError as e:
        raise UserError(f"{KEY}.{'export' if export else 'run_config'}: {e}") from None


def _record(obs: Observation) -> N.StepRecord:
    """The fields of a record that the prompt reads (no image, no label)."""
    return N.StepRecord(trajectory_id=obs.task_id, step=obs.step, platform=obs.platform,
                        instruction=obs.instruction, history=tuple(obs.history), image={"bytes": b""},
                        image_size=tuple(obs.screen_size), target=N.StepTarget("Terminate", "prompt only", "success"),
                        split="test")


class EndpointAgent:
    """Responses of a served model, prompted as in training (module docstring)."""

    needs_world = False

    def __init__(self, endpoint: ChatEndpoint, config, family: str, *, temperature: float = 0.0,
                 max_tokens: int = 256):
        self.endpoint, self.config, self.family = endpoint, config, family
        d = config.data
        if d.method not in METHOD_FORMAT:
            raise UserError(f"{KEY}.method = {d.method!r} is invalid: expected one of {sorted(METHOD_FORMAT)}")
        self.spec = S.SampleSpec(d.method, family, system_prompt=d.system_prompt or None)
        self.budgets = E.pixel_budgets(config, family)
        self.fmt = METHOD_FORMAT[d.method]
        self.coord_space = A.FAMILY_COORD_SPACE[family]
        lo, hi = E.budget_for(self.budgets, E.DEFAULT_PLATFORM)
        self.resized_size = lambda size: A.resized_size_for(size, family, min_pixels=lo, max_pixels=hi)
        self.params = {"temperature": float(temperature), "max_tokens": int(max_tokens)}
        self.batch_size = endpoint.concurrency

    def reset(self, env) -> None:
        pass

    def image_config(self, platform: str) -> I.ImageProcessorConfig:
        lo, hi = E.budget_for(self.budgets, platform)
        return I.processor_config(self.family, min_pixels=lo, max_pixels=hi)

    def request(self, obs: Observation) -> dict:
        """The chat request of ``obs``: the training prompt's text, the screenshot resized
        to the platform's budget where the prompt has its image."""
        image = obs.screenshot.convert("RGB")
        h, w = I.resized_hw(image.height, image.width, self.image_config(obs.platform))
        if (w, h) != image.size:
            from PIL import Image
            image = image.resize((w, h), resample=Image.Resampling.BICUBIC)
        system, user = S.prompt_turns(_record(obs), self.spec, (w, h))
        before, _, after = user.partition(P.IMAGE_PLACEHOLDER)
        content = ([text_part(before)] if before else []) + [image_part(image)] + ([text_part(after)] if after else [])
        return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": content}],
                **self.params}

    def __call__(self, obs: Observation) -> str:
        return self.respond_batch([obs])[0]

    def respond_batch(self, observations: Sequence[Observation]) -> list[str]:
        results = self.endpoint.chat_many([self.request(o) for o in observations])
        for obs, r in zip(observations, results):
            if not r.ok:
                log.warning("endpoint agent: no response for %s step %d after %d attempts: %s", obs.task_id,
                            obs.step, r.attempts, r.error)
        return [r.text if r.ok else "" for r in results]

    def stats(self) -> dict[str, int]:
        """Requests by outcome: ok, timeout, connection, http_<code>, malformed, failed."""
        return self.endpoint.summary()


@register_agent("endpoint")
def make_endpoint_agent(url: str = "", model: str = "", api_key: str = "", api_key_env: str = "OPENAI_API_KEY",
                        export: str = "", run_config: str = "", family: str = "", method: str = "",
                        system_prompt: str = "", min_pixels: int = 0, max_pixels: int = 0, temperature: float = 0.0,
                        max_tokens: int = 256, timeout: float = 120.0, retries: int = 3, backoff: float = 1.0,
                        concurrency: int = 8, fmt: Any = None, coord_space: Any = None,
                        resized_size: Any = None) -> EndpointAgent:
    """The ``endpoint`` agent (module docstring). ``api_key`` or the environment
    variable ``api_key_env``; ``model`` "" takes the server's first listed model.
    ``family`` / ``method`` / ``system_prompt`` / ``min_pixels`` / ``max_pixels``
    override the run config's ("" / 0: keep). ``fmt``, ``coord_space``,
    ``resized_size`` (passed to every agent by eval.run) are ignored: the model answers
    in its training format and space."""
    del fmt, coord_space, resized_size
    if not url:
        raise UserError(f"{KEY}.url is empty: give the server's API base, e.g. http://localhost:8000/v1")
    config = _run_config(export, run_config)
    family = family or (_export_family(export) if export else config.model.tiny.family)
    if family not in HF_FAMILY:
        raise UserError(f"{KEY}.family = {family!r} is invalid: expected one of {sorted(HF_FAMILY)}")
    for key, value in (("method", method), ("system_prompt", system_prompt), ("min_pixels", min_pixels),
                       ("max_pixels", max_pixels)):
        if value:
            config.data[key] = value
    endpoint = ChatEndpoint(url, model, api_key or os.environ.get(api_key_env, ""), timeout=timeout,
                            retries=retries, backoff=backoff, concurrency=concurrency)
    return EndpointAgent(endpoint, config, family, temperature=temperature, max_tokens=max_tokens)
