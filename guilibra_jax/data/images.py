"""Image loading and Qwen-VL preprocessing in numpy/PIL (no torch).

Equal to transformers' ``Qwen2VLImageProcessorPil`` (the PIL backend that transformers
uses for both Qwen2.5-VL and Qwen3-VL when torchvision is absent):

    smart_resize -> PIL bicubic resize of the uint8 image -> float64 * 1/255 -> float32
    -> (x - mean) / std -> patches laid out (gh/m, gw/m, m, m, C, t, p, p)

Qwen2.5-VL: patch 14, merge 2, CLIP mean/std, pixels in [56*56, 28*28*1280].
Qwen3-VL:   patch 16, merge 2, mean/std 0.5, pixels in [65536, 16777216] (its
preprocessor_config.json); real runs usually lower ``max_pixels``.

Note: transformers' torchvision backend (used when torchvision is installed) resizes
with torch's antialiased bicubic, which differs from PIL's by a few 1e-3 after
normalisation; this module follows the PIL backend exactly.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import os
from typing import Any, Sequence

import numpy as np
from PIL import Image

from guilibra_jax import actions as A

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclasses.dataclass(frozen=True)
class ImageProcessorConfig:
    """Preprocessing knobs; :func:`processor_config` gives each family's defaults."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size


_FAMILY_DEFAULTS: dict[str, ImageProcessorConfig] = {
    "qwen2_5_vl": ImageProcessorConfig(),
    "qwen3_vl": ImageProcessorConfig(patch_size=16, min_pixels=65536, max_pixels=16777216,
                                     image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5)),
}


def processor_config(family: str, *, min_pixels: int | None = None, max_pixels: int | None = None,
                     model_config: Any = None) -> ImageProcessorConfig:
    """Defaults of ``family`` ("qwen2_5_vl" | "qwen3_vl"), with optional pixel bounds.
    ``model_config`` (a models.ModelConfig) overrides patch / temporal / merge sizes."""
    if family not in _FAMILY_DEFAULTS:
        raise ValueError(f"unknown model family {family!r}; expected one of {sorted(_FAMILY_DEFAULTS)}")
    cfg = _FAMILY_DEFAULTS[family]
    kw: dict[str, Any] = {}
    if min_pixels is not None:
        kw["min_pixels"] = int(min_pixels)
    if max_pixels is not None:
        kw["max_pixels"] = int(max_pixels)
    if model_config is not None:
        v = model_config.vision
        kw.update(patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
                  merge_size=v.spatial_merge_size)
    return dataclasses.replace(cfg, **kw)


@dataclasses.dataclass(frozen=True)
class PixelBudgets:
    """Pixel bounds of the image processor per platform. Both releases resize by platform
    (UI-MOPD's data prep: mobile 40,768..548,800, desktop 3,136..13,107,200 pixels), so
    training, RL prompts and the evaluation agent ask :meth:`bounds` for each record.

    per_platform: ((platform, (min, max)), ...); a 0 inside a pair (or a platform not
    listed) falls back to ``min_pixels`` / ``max_pixels``, and None there means the model
    family's own default (:func:`processor_config`).
    """

    min_pixels: int | None = None
    max_pixels: int | None = None
    per_platform: tuple[tuple[str, tuple[int, int]], ...] = ()

    @classmethod
    def from_config(cls, min_pixels: int | None = None, max_pixels: int | None = None,
                    pixels: Any = None) -> "PixelBudgets":
        """From ``data.min_pixels`` / ``data.max_pixels`` (0 or None: family default) and
        ``data.pixels`` (a mapping platform -> (min, max), or pairs of those)."""
        items = pixels.items() if hasattr(pixels, "items") else (pixels or ())
        per = []
        for platform, pair in items:
            lo, hi = (int(v) for v in pair)
            if lo < 0 or hi < 0 or (lo and hi and lo > hi):
                raise ValueError(f"data.pixels.{platform} = {tuple(pair)} is invalid: expected (min, max) "
                                 f"with 0 <= min <= max (0: data.min_pixels / data.max_pixels)")
            per.append((str(platform), (lo, hi)))
        return cls(int(min_pixels) if min_pixels else None, int(max_pixels) if max_pixels else None,
                   tuple(sorted(per)))

    def bounds(self, platform: str | None) -> tuple[int | None, int | None]:
        """(min_pixels, max_pixels) for images of ``platform`` (None: the family default)."""
        lo, hi = dict(self.per_platform).get(platform, (0, 0)) if platform is not None else (0, 0)
        return (lo or self.min_pixels), (hi or self.max_pixels)

    def processor_config(self, family: str, platform: str | None, model_config: Any = None
                         ) -> ImageProcessorConfig:
        lo, hi = self.bounds(platform)
        return processor_config(family, min_pixels=lo, max_pixels=hi, model_config=model_config)

    def for_family(self, family: str, model_config: Any = None) -> "PlatformImageConfigs":
        return PlatformImageConfigs(self, family, model_config)


class PlatformImageConfigs:
    """The :class:`ImageProcessorConfig` of each platform under one :class:`PixelBudgets`
    (picklable: grain workers get it with the map function)."""

    def __init__(self, budgets: PixelBudgets, family: str, model_config: Any = None):
        self.budgets, self.family, self.model_config = budgets, family, model_config
        self.default = budgets.processor_config(family, None, model_config)

    def for_platform(self, platform: str | None) -> ImageProcessorConfig:
        return self.budgets.processor_config(self.family, platform, self.model_config)


def config_for(img_cfg: "ImageProcessorConfig | PlatformImageConfigs", platform: str | None) -> ImageProcessorConfig:
    """The processor config of ``platform``'s images (one config serves every platform)."""
    return img_cfg.for_platform(platform) if isinstance(img_cfg, PlatformImageConfigs) else img_cfg


def resized_hw(height: int, width: int, cfg: ImageProcessorConfig) -> tuple[int, int]:
    """(height, width) the processor resizes an image to."""
    return A.smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)


def grid_thw(image_size: tuple[int, int], cfg: ImageProcessorConfig) -> tuple[int, int, int]:
    """(t, h, w) patch grid for an image of ``image_size`` = (width, height)."""
    h, w = resized_hw(int(image_size[1]), int(image_size[0]), cfg)
    return 1, h // cfg.patch_size, w // cfg.patch_size


def num_image_tokens(image_size: tuple[int, int], cfg: ImageProcessorConfig) -> int:
    """<|image_pad|> tokens an image of ``image_size`` = (width, height) takes in the text."""
    t, h, w = grid_thw(image_size, cfg)
    return t * h * w // (cfg.merge_size ** 2)


def preprocess_image(image: Image.Image | np.ndarray, cfg: ImageProcessorConfig
                     ) -> tuple[np.ndarray, np.ndarray]:
    """One image -> (pixel_values [gh*gw, 3*t*p*p] float32, image_grid_thw [3] int64)."""
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    if image.mode != "RGB":
        image = image.convert("RGB")
    width, height = image.size
    rh, rw = resized_hw(height, width, cfg)
    if (rw, rh) != (width, height):
        image = image.resize((rw, rh), resample=Image.Resampling.BICUBIC)
    x = np.asarray(image)                                   # [H, W, C] uint8
    x = (x.astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.asarray(cfg.image_mean, np.float32)
    std = np.asarray(cfg.image_std, np.float32)
    x = (x - mean) / std                                    # [H, W, C] float32
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gh, gw = rh // p, rw // p
    x = x.reshape(gh // m, m, p, gw // m, m, p, 3)          # (H/pm, m, p, W/pm, m, p, C)
    x = x.transpose(0, 3, 1, 4, 6, 2, 5)                    # (gh/m, gw/m, m, m, C, p, p)
    x = np.broadcast_to(x[:, :, :, :, :, None], x.shape[:5] + (t,) + x.shape[5:])
    return np.ascontiguousarray(x).reshape(gh * gw, 3 * t * p * p), np.array([1, gh, gw], np.int64)


def patches_to_image(pixel_values: np.ndarray, grid: Sequence[int], cfg: ImageProcessorConfig) -> np.ndarray:
    """The [H, W, 3] uint8 image :func:`preprocess_image` made ``pixel_values`` of (its
    inverse: first temporal copy, un-normalised, rounded), e.g. to send a server the
    screenshot exactly as resized here."""
    _, gh, gw = (int(g) for g in grid)
    p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    x = np.asarray(pixel_values, np.float32).reshape(gh // m, gw // m, m, m, 3, t, p, p)[:, :, :, :, :, 0]
    x = x.transpose(0, 2, 5, 1, 3, 6, 4).reshape(gh * p, gw * p, 3)      # preprocess_image's transpose, undone
    x = x * np.asarray(cfg.image_std, np.float32) + np.asarray(cfg.image_mean, np.float32)
    return np.clip(np.rint(x * 255), 0, 255).astype(np.uint8)


class ImageLoadError(ValueError):
    """An image that cannot be found or decoded."""


_SIBLING_EXTS = (".png", ".jpg", ".jpeg", ".webp")


def resolve_image_path(path: str, base_dir: str | None = None) -> str:
    """Absolute path of an image; when the named file is absent, a sibling with the
    same stem and another image extension (Uni-GUI names .png files stored as .jpg)."""
    if base_dir and not os.path.isabs(path):
        path = os.path.join(base_dir, path)
    if os.path.exists(path):
        return path
    stem, _ = os.path.splitext(path)
    for ext in _SIBLING_EXTS:
        if os.path.exists(stem + ext):
            return stem + ext
    return path


def load_image(spec: Any, base_dir: str | None = None) -> Image.Image:
    """Decode a native ``image`` field (path, or {"png_b64"|"jpeg_b64"|"b64": ...},
    or {"bytes": b"..."}) into an RGB PIL image; :class:`ImageLoadError` otherwise."""
    try:
        if isinstance(spec, str):
            path = resolve_image_path(spec, base_dir)
            with open(path, "rb") as f:
                data = f.read()
        elif isinstance(spec, dict):
            if isinstance(spec.get("bytes"), (bytes, bytearray)):
                data = bytes(spec["bytes"])
            else:
                key = next((k for k in ("png_b64", "jpeg_b64", "b64") if k in spec), None)
                if key is None:
                    raise ImageLoadError(f"image dict has none of png_b64/jpeg_b64/b64/bytes: {sorted(spec)[:5]}")
                data = base64.b64decode(spec[key], validate=True)
        else:
            raise ImageLoadError(f"image must be a path or an inline-bytes dict, got {type(spec).__name__}")
        img = Image.open(io.BytesIO(data))
        img.load()
        return img.convert("RGB") if img.mode != "RGB" else img
    except ImageLoadError:
        raise
    except Exception as e:  # noqa: BLE001 - any decode failure is one reason: unreadable image
        raise ImageLoadError(f"cannot read image {str(spec)[:80]!r}: {type(e).__name__}: {str(e)[:80]}") from e


def encode_png_b64(image: Image.Image | bytes) -> dict:
    """Inline native image field from a PIL image or PNG bytes."""
    if isinstance(image, Image.Image):
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        image = buf.getvalue()
    return {"png_b64": base64.b64encode(image).decode("ascii")}
