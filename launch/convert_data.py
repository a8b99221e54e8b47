"""Convert trajectory data between formats; every format goes through native records.

    python -m launch.convert_data --input=DIR_OR_FILE --format=uni_gui --output=out.jsonl
    python -m launch.convert_data --input=out.jsonl --format=native --to=guilibra_sft --output=sft.json
    python -m launch.convert_data --input=rl.parquet --format=guilibra_rl --to=guilibra_rl \\
        --output=rl_small_groups.parquet --row_group_mb=8

--format: guilibra_sft | guilibra_rl | uni_gui | native (the input's format).
--to: native (default) | guilibra_sft | guilibra_rl (the output's format).
Bad records are skipped and counted by reason; the run fails (and removes the output)
when their fraction passes --bad_record_threshold. Records stream through: memory
does not grow with the data. The output appears whole or not at all: it is written as
``<output>.tmp-<pid>`` and renamed when complete, so a kill leaves the older output or none.

guilibra_rl -> guilibra_rl copies the rows unchanged and only rewrites the row groups
(about --row_group_mb MB each), which readers need to read one row at a time; it
holds about twice the largest parquet page of the input in memory.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Iterator

from absl import flags

from guilibra_jax.data import bad_records as B
from guilibra_jax.data import readers as R
from guilibra_jax.data import writers as W
from guilibra_jax.data.file_errors import DataFileError
from guilibra_jax.errors import UserError
from launch import cli, recipes

__doc__ += recipes.index_text()   # --help lists the recipes in configs/


def _kept(src: R.StepSource, log: B.BadRecordLog) -> Iterator:
    for i in range(len(src)):
        r = src[i]
        if isinstance(r, B.Dropped):
            log.add(r)
        else:
            log.kept += 1
            yield r


def convert(inputs, fmt: str, output: str, to: str = "native", *, image_root: str | None = None,
            include_unused: bool = False, bad_record_threshold: float = 0.05,
            row_group_mb: float = W.DEFAULT_ROW_GROUP_MB) -> dict:
    """Convert and return {"written": n, "bad": {reason: count}, "skipped": {...}}
    (guilibra_rl -> guilibra_rl: {"written": n, "row_groups": groups})."""
    if to not in W.WRITERS:
        raise UserError(f"unknown output format --to={to!r}; expected one of {sorted(W.WRITERS)}")
    if fmt == to == "guilibra_rl":
        return W.rewrite_parquet_row_groups(R.expand_paths(inputs, (".parquet",)), output,
                                            row_group_mb=row_group_mb)
    src = R.open_source(inputs, fmt, image_root=image_root, include_unused=include_unused)
    log = B.BadRecordLog(threshold=bad_record_threshold, min_seen=0)
    kwargs = {"row_group_mb": row_group_mb} if to == "guilibra_rl" else {}
    n = None
    try:
        n = W.WRITERS[to](_kept(src, log), output, **kwargs)   # appears whole or not at all (writers.py)
        log.check(final=True)
    except BaseException:
        if n is not None and os.path.isfile(output):   # complete, with too many bad records; an older
            os.unlink(output)                          # output stays when the writer itself failed
        raise
    out = {"written": n, "bad": dict(log.counts)}
    if isinstance(src, R.UniGuiSource):
        out["skipped"] = dict(src.skipped)
    return out


_INPUT = flags.DEFINE_multi_string("input", None, "Files, folders or globs (repeat the flag for several).")
_FORMAT = flags.DEFINE_enum("format", None, list(R.FORMATS), "The input's format.")
_OUTPUT = flags.DEFINE_string("output", None, "Output file.")
_TO = flags.DEFINE_enum("to", "native", sorted(W.WRITERS), "The output's format.")
_IMAGE_ROOT = flags.DEFINE_string("image_root", None, "Folder relative image paths start from (guilibra_sft).")
_INCLUDE_UNUSED = flags.DEFINE_bool("include_unused", False, "uni_gui: keep is_use=false steps.")
_THRESHOLD = flags.DEFINE_float("bad_record_threshold", 0.05, "Fail when the fraction of bad records passes this.")
_ROW_GROUP_MB = flags.DEFINE_float("row_group_mb", W.DEFAULT_ROW_GROUP_MB,
                                   "--to=guilibra_rl: parquet row groups of about this many MB (screenshots included).")
flags.mark_flags_as_required(["input", "format", "output"])


def run(argv) -> None:
    """absl main: convert, print the counts as JSON; too many bad records is a user error."""
    del argv
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    if _ROW_GROUP_MB.value <= 0:
        raise UserError(f"--row_group_mb must be > 0, got {_ROW_GROUP_MB.value}")
    try:
        result = convert(_INPUT.value, _FORMAT.value, _OUTPUT.value, _TO.value, image_root=_IMAGE_ROOT.value,
                         include_unused=_INCLUDE_UNUSED.value, bad_record_threshold=_THRESHOLD.value,
                         row_group_mb=_ROW_GROUP_MB.value)
    except B.TooManyBadRecords as e:
        raise UserError(str(e)) from None
    except (FileNotFoundError, DataFileError) as e:
        raise UserError(f"--input={','.join(_INPUT.value)}: {e}") from None
    print(json.dumps(result))


def main(argv=None) -> int:
    """Run with ``argv`` (flags only, as on the command line) in this process; returns
    the exit status (0, or 2 for a user error). For tests and scripts."""
    try:
        flags.FLAGS.unparse_flags()
        flags.FLAGS([sys.argv[0] if sys.argv else "convert_data", *(argv or [])])
        run([])
    except (UserError, flags.Error) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    cli.run(run)
