"""Model folders named by a Hugging Face Hub id (``Qwen/Qwen2.5-VL-3B-Instruct``).

``resolve_model_path(value, key)`` returns a local folder: ``value`` itself when it is
one, else, for a Hub id, the snapshot ``huggingface_hub.snapshot_download`` fetches
(weights, configs, tokenizer and processor files; already cached snapshots are used
offline). Where no hub is reachable (``HF_HUB_OFFLINE=1``, no network) and the model is
not cached, a :class:`UserError` names the key, the id and ``HF_HUB_OFFLINE``.
"""

from __future__ import annotations

import os
import re

from guilibra_jax.errors import UserError

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# what a Qwen-VL model folder needs (no .bin / .pt / .msgpack weights, no README assets)
MODEL_FILES = ("*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken")


def is_hub_id(value: str) -> bool:
    """``owner/name`` that is not an existing path (``./runs/x``, ``/models/x``, ``~/x`` are paths)."""
    if not value or value.startswith((".", "/", "~")) or os.path.exists(value):
        return False
    return bool(HUB_ID.match(value)) and not value.endswith((".json", ".py"))


def resolve_model_path(value: str, key: str, *, cache_dir: str | None = None) -> str:
    """A local folder for config key ``key`` = ``value`` (module docstring). A
    half-written export or merge of ours (``guilibra_jax.atomic``) is a UserError."""
    from guilibra_jax import atomic
    atomic.check_complete(value, f"config key {key}")
    if not is_hub_id(value):
        return value
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled
    try:
        return snapshot_download(value, allow_patterns=list(MODEL_FILES), cache_dir=cache_dir)
    except (OfflineModeIsEnabled, LocalEntryNotFoundError) as e:
        offline = os.environ.get("HF_HUB_OFFLINE", "")
        why = f"HF_HUB_OFFLINE={offline} is set" if offline not in ("", "0", "false", "False") else \
            "the hub is not reachable (set HF_HUB_OFFLINE=1 to skip the attempt)"
        raise UserError(f"config key {key} = {value!r} is a Hugging Face Hub id that is not in the local cache and "
                        f"cannot be downloaded: {why}. Download it where a hub is reachable (huggingface-cli "
                        f"download {value}) and pass the folder, or unset HF_HUB_OFFLINE "
                        f"({type(e).__name__})") from None
    except Exception as e:  # noqa: BLE001 - repository not found, gated, bad token: the user's to fix
        raise UserError(f"config key {key} = {value!r}: cannot download from the Hugging Face Hub: "
                        f"{type(e).__name__}: {str(e)[:300]}") from None


def resolve_run_paths(config) -> None:
    """Resolve Hub ids in the run config's model folders in place: ``model.hf_path``,
    ``tokenizer.path``, ``rl.reference`` and ``rl.teachers.*``."""
    config.model.hf_path = resolve_model_path(config.model.hf_path, "model.hf_path")
    config.tokenizer.path = resolve_model_path(config.tokenizer.path, "tokenizer.path")
    config.rl.reference = resolve_model_path(config.rl.reference, "rl.reference")
    for label in list(config.rl.teachers.keys()):
        config.rl.teachers[label] = resolve_model_path(config.rl.teachers[label], f"rl.teachers.{label}")
