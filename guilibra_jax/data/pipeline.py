"""The grain pipeline and the loader entry points a trainer calls.

    MapDataset.source(SampleView(source, index))      # (record, variant) pairs
      .shuffle(seed).repeat(num_epochs)
      .map(EncodeSample)                              # image + prompt + tokens, or Dropped
      .batch(n, batch_fn=Collate)                     # fixed shapes per length bucket
      .to_iter_dataset(read_options)
      [.mp_prefetch(num_workers)]

The sample index is built up front (mix, rebalance), so batch composition depends only
on the seed: the same batches come out with 0 or N workers, and the iterator state is
grain's (JSON-able) plus the bad-record counts. With several processes each takes every
process_count-th batch of the shuffled stream (``batch_size`` rows per process), so the
processes' batches together are the batches of one process with their summed batch size.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping, Sequence

import grain
import numpy as np

from guilibra_jax.data import bad_records as B
from guilibra_jax.data import collate as C
from guilibra_jax.data import images as I
from guilibra_jax.data import mixing as M
from guilibra_jax.data import prompts as P
from guilibra_jax.data import readers as R
from guilibra_jax.data import samples as S
from guilibra_jax.data import tokenize as T

log = logging.getLogger(__name__)


@dataclasses.dataclass
class DataConfig:
    """Knobs of a loader. ``inputs``: files, folders or globs in ``format``."""

    inputs: Any = ()
    inputs_key: str | None = None          # the config key naming the inputs, for file errors
    format: str = "native"                 # native | guilibra_sft | guilibra_rl | uni_gui
    method: str = "guilibra"               # guilibra (<answer> JSON) | mopd (tool calls)
    image_root: str | None = None          # guilibra_sft: folder relative image paths start from
    batch_size: int = 8                    # rows per batch and process
    seq_buckets: tuple[int, ...] = C.DEFAULT_SEQ_BUCKETS
    max_length: int | None = 8192          # length filter (tokens); longer samples are filtered
    patch_bucket: int = 2048               # pixel_values rows rounded up to a multiple of this
    min_pixels: int | None = None          # image processor bounds (None: family default)
    max_pixels: int | None = None
    pixels: Any = None                     # platform -> (min, max) pixels; 0 / unlisted: the two above
    open_think: str = "auto"               # prompt ends with "<think>\n": auto (chat template) | on | off
    loss_weighting: str = "paper"          # loss.weighting; "release": segments carry the release's flags
    mix: Any = "both"                      # both | reasoning | direct | p (reasoning probability)
    include_action_target: bool = False
    system_prompt: str | None = None       # None: the method's own system turn; else a template
    pack: bool = False                     # several samples per row
    pack_samples: int | None = None        # samples per packed batch (default 4 x batch_size)
    pack_length: int | None = None         # row capacity when packing (default max(seq_buckets))
    rebalance_step_keep: Mapping[int, float] | None = None   # RL subset: keep prob per step
    rebalance_max_share: Mapping[str, float] | None = None   # RL subset: max share per domain
    rebalance_key: str = "platform"
    splits: tuple[str, ...] = ("train",)   # record splits kept (None / () keeps all)
    include_unused: bool = False           # uni_gui: keep is_use=false steps
    seed: int = 0
    shuffle: bool = True
    num_epochs: int | None = 1             # None: repeat forever
    drop_remainder: bool = True
    num_workers: int = 0
    worker_buffer_size: int = 2
    read_threads: int = 4
    read_buffer: int = 16
    bad_record_threshold: float = 0.05
    bad_record_min_seen: int = 100
    shard_index: int | None = None         # None: jax.process_index()
    shard_count: int | None = None         # None: jax.process_count()

    @classmethod
    def from_any(cls, cfg: Any) -> "DataConfig":
        """From a DataConfig, a dict or an ml_collections ConfigDict (unknown keys raise)."""
        if isinstance(cfg, cls):
            return cfg
        if hasattr(cfg, "to_dict"):
            cfg = cfg.to_dict()
        if not isinstance(cfg, Mapping):
            raise TypeError(f"data config must be a DataConfig or a mapping, got {type(cfg).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(cfg) - names)
        if unknown:
            raise ValueError(f"unknown data config keys {unknown}; known: {sorted(names)}")
        d = dict(cfg)
        if "seq_buckets" in d:
            d["seq_buckets"] = tuple(d["seq_buckets"])
        if "splits" in d and d["splits"] is not None:
            d["splits"] = tuple(d["splits"])
        return cls(**d)


class SampleView:
    """grain source: item i = (record or Dropped, variant, where) of sample-index row i."""

    def __init__(self, source: R.StepSource, index: np.ndarray):
        self.source = source
        self.index = np.asarray(index, np.int64).reshape(-1, 2)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int):
        j, variant = (int(x) for x in self.index[i])
        return self.source[j], variant, self.source.where(j)

    def __repr__(self) -> str:
        return f"SampleView({len(self)} samples)"


class EncodeSample:
    """grain map: (record, variant, where) -> Sample | Dropped."""

    def __init__(self, spec: S.SampleSpec, tokenizer: Any, img_cfg: "I.ImageProcessorConfig | I.PlatformImageConfigs",
                 max_length: int | None, splits: Sequence[str] | None, prompt_only_length: bool = False):
        self.spec, self.tokenizer, self.img_cfg = spec, tokenizer, img_cfg
        self.prompt_only_length = prompt_only_length   # RL: max_length bounds the prompt
        self.ids = T.SpecialIds.of(tokenizer)
        self.max_length = max_length
        self.splits = tuple(splits) if splits else None

    def __call__(self, item):
        record, variant, where = item
        if self.splits and not isinstance(record, B.Dropped) and record.split not in self.splits:
            return B.Dropped("other_split", where, record.split, bad=False)
        return S.make_sample(record, variant, self.spec, self.tokenizer, self.img_cfg, self.ids,
                             self.max_length, where, self.prompt_only_length)


class Collate:
    def __init__(self, cfg: C.CollateConfig, model_config: Any, rl: bool):
        self.cfg, self.model_config, self.rl = cfg, model_config, rl

    def __call__(self, items):
        fn = C.collate_rl if self.rl else C.collate_sft
        return fn(items, self.cfg, self.model_config)


class DataIterator(grain.DatasetIterator):
    """Iterator of batches; counts dropped records in ``bad_records`` (a
    :class:`BadRecordLog`) and raises :class:`TooManyBadRecords` past the threshold.
    ``get_state()`` is JSON-able (grain's checkpoint handler saves it)."""

    def __init__(self, parent: grain.DatasetIterator, bad_records: B.BadRecordLog, info: dict[str, Any]):
        super().__init__(parent)
        self.bad_records = bad_records
        self.info = info

    def __next__(self) -> dict[str, Any]:
        try:
            batch = next(self._parent)
        except StopIteration:
            self.bad_records.check(final=True)
            raise
        self.bad_records.update(batch["dropped"], batch["num_samples"])
        return batch

    def get_state(self) -> dict[str, Any]:
        return {"grain": self._parent.get_state(), "bad_records": self.bad_records.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["grain"])
        self.bad_records.set_state(state["bad_records"])

    def close(self) -> None:
        close = getattr(self._parent, "close", None)
        if close is not None:
            close()


def _load_tokenizer(tokenizer: Any) -> Any:
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(tokenizer)
    return tokenizer


def _shard_args(cfg: DataConfig, shard_index: int | None, shard_count: int | None) -> tuple[int, int]:
    si = shard_index if shard_index is not None else cfg.shard_index
    sc = shard_count if shard_count is not None else cfg.shard_count
    if si is None or sc is None:
        import jax
        si = jax.process_index() if si is None else si
        sc = jax.process_count() if sc is None else sc
    return int(si), int(sc)


def build_index(source: R.StepSource, cfg: DataConfig, rl: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """(sample index [S, 2], info) for a source: rebalance, then mix (RL: one direct
    sample per record). ``info['rebalance']`` holds distributions before / after;
    ``info['platforms']`` the platform labels of the records (MOPD: one teacher each)."""
    metas = [source.meta(i) for i in range(len(source))]
    info: dict[str, Any] = {"records": len(metas), "unreadable_meta": sum(m is None for m in metas),
                            "platforms": sorted({m.platform for m in metas if m is not None})}
    keep = np.arange(len(metas))
    if cfg.rebalance_step_keep or cfg.rebalance_max_share:
        keep, info["rebalance"] = M.rebalance(metas, step_keep=cfg.rebalance_step_keep,
                                              max_share=cfg.rebalance_max_share,
                                              domain_key=cfg.rebalance_key, seed=cfg.seed)
    sub = [metas[i] for i in keep]
    index = M.mix_index(sub, "direct" if rl else cfg.mix, seed=cfg.seed)
    index[:, 0] = keep[index[:, 0]] if len(index) else index[:, 0]
    info["samples"] = len(index)
    return index, info


def _make_loader(cfg: Any, tokenizer: Any, model_config: Any, rl: bool, shard_index: int | None,
                 shard_count: int | None, source: R.StepSource | None) -> DataIterator:
    cfg = DataConfig.from_any(cfg)
    tokenizer = _load_tokenizer(tokenizer)
    ids = T.SpecialIds.of(tokenizer)
    ids.check_model(model_config)
    family = model_config.family
    spec = S.SampleSpec(cfg.method, family, cfg.include_action_target, cfg.system_prompt or None,
                        generation_prefix=P.generation_prefix(cfg.open_think, tokenizer),
                        weighting=cfg.loss_weighting if not rl else "paper")
    img_cfg = I.PixelBudgets.from_config(cfg.min_pixels, cfg.max_pixels, cfg.pixels).for_family(family, model_config)
    if source is None:
        source = R.open_source(cfg.inputs, cfg.format, image_root=cfg.image_root,
                               include_unused=cfg.include_unused, config_key=cfg.inputs_key)
    index, info = build_index(source, cfg, rl)
    si, sc = _shard_args(cfg, shard_index, shard_count)
    if not 0 <= si < sc:
        raise ValueError(f"shard_index {si} must lie in [0, shard_count={sc})")
    info.update(shard_index=si, shard_count=sc, shard_samples=len(index) // sc)
    if cfg.pack and not rl:
        per_batch = cfg.pack_samples or 4 * cfg.batch_size
    else:
        per_batch = cfg.batch_size
    max_len = cfg.max_length
    if cfg.pack and not rl and cfg.pack_length:
        max_len = min(max_len or cfg.pack_length, cfg.pack_length)
    ccfg = C.CollateConfig(batch_rows=cfg.batch_size, pad_id=ids.pad, seq_buckets=tuple(cfg.seq_buckets),
                           patch_bucket=cfg.patch_bucket, pack=cfg.pack and not rl, pack_length=cfg.pack_length)
    ds = grain.MapDataset.source(SampleView(source, index))
    if cfg.shuffle:
        ds = ds.shuffle(seed=cfg.seed)
    if cfg.num_epochs is None or cfg.num_epochs > 1:
        ds = ds.repeat(cfg.num_epochs)
    ds = ds.map(EncodeSample(spec, tokenizer, img_cfg, max_len, None if rl else cfg.splits, rl))
    ds = ds.batch(per_batch, drop_remainder=cfg.drop_remainder, batch_fn=Collate(ccfg, model_config, rl))
    if sc > 1:
        # Shard by batch after the shuffle: process p takes batches p, p + sc, ...; batch k of
        # the processes together is batch k of one process with sc times the batch size,
        # rows in process order (as put_batch assembles them), so runs do not depend on the
        # process count. Every process gets the same number of batches.
        ds = ds[:len(ds) // sc * sc][si::sc]
    it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=cfg.read_threads,
                                                 prefetch_buffer_size=cfg.read_buffer))
    if cfg.num_workers > 0:
        _mark_flags_parsed()
        it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg.num_workers,
                                                               per_worker_buffer_size=cfg.worker_buffer_size))
    log_ = B.BadRecordLog(cfg.bad_record_threshold, cfg.bad_record_min_seen)
    if isinstance(source, R.UniGuiSource):
        info["uni_gui_skipped"] = dict(source.skipped)
    return DataIterator(iter(it_ds), log_, info)


def _mark_flags_parsed() -> None:
    """grain's worker processes read an absl flag; outside absl.app.run mark flags parsed."""
    from absl import flags
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def make_sft_loader(config: Any, tokenizer: Any, model_config: Any, *, shard_index: int | None = None,
                    shard_count: int | None = None, source: R.StepSource | None = None) -> DataIterator:
    """Iterator of SFT batches (``collate.collate_sft``) for ``config`` (DataConfig, dict
    or ConfigDict); ``tokenizer``: a HF tokenizer or its folder; ``model_config``: a
    models.ModelConfig. Each process reads only its shard (default: jax.process_index
    of jax.process_count)."""
    return _make_loader(config, tokenizer, model_config, False, shard_index, shard_count, source)


def make_rl_loader(config: Any, tokenizer: Any, model_config: Any, *, shard_index: int | None = None,
                   shard_count: int | None = None, source: R.StepSource | None = None) -> DataIterator:
    """Iterator of RL prompt batches (``collate.collate_rl``): left-padded prompts, the
    reward Targets and platform labels; one sample per record."""
    return _make_loader(config, tokenizer, model_config, True, shard_index, shard_count, source)
