"""Convert trajectory data between formats; every format goes through native records.

    python -m launch.convert_data --input=DIR_OR_FILE --format=uni_gui --output=out.jsonl
    python -m launch.convert_data --input=out.jsonl --format=native --to=guilibra_sft --output=sft.json
    python -m launch.convert_data --input=rl.parquet --format=guilibra_rl --to=guilibra_rl \\
        --output=rl_small_groups.parquet --row_group_mb=8

--format: guilibra_sft | guilibra_rl | uni_gui | native (the input's format).
--to: native (default) | guilibra_sft | guilibra_rl (the output's format).
Bad records are skipped and counted by reason; the run fails (and removes the output)
when their fraction passes --bad_record_threshold. Records stream through: memory
does not grow with the data.

guilibra_rl -> guilibra_rl copies the rows unchanged and only rewrites the row groups
(about --row_group_mb MB each), which readers need to read one row at a time; it
holds about twice the largest parquet page of the input in memory.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Iterator

from guilibra_jax.data import bad_records as B
from guilibra_jax.data import readers as R
from guilibra_jax.data import writers as W
from guilibra_jax.errors import UserError


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
    try:
        n = W.WRITERS[to](_kept(src, log), output, **kwargs)
        log.check(final=True)
    except BaseException:
        if os.path.isfile(output):
            os.unlink(output)
        raise
    out = {"written": n, "bad": dict(log.counts)}
    if isinstance(src, R.UniGuiSource):
        out["skipped"] = dict(src.skipped)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True, nargs="+", help="files, folders or globs")
    ap.add_argument("--format", required=True, choices=R.FORMATS)
    ap.add_argument("--output", required=True)
    ap.add_argument("--to", default="native", choices=sorted(W.WRITERS))
    ap.add_argument("--image_root", default=None)
    ap.add_argument("--include_unused", action="store_true", help="uni_gui: keep is_use=false steps")
    ap.add_argument("--bad_record_threshold", type=float, default=0.05)
    ap.add_argument("--row_group_mb", type=float, default=W.DEFAULT_ROW_GROUP_MB,
                    help="--to=guilibra_rl: parquet row groups of about this many MB (screenshots included)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    if args.row_group_mb <= 0:
        print(f"error: --row_group_mb must be > 0, got {args.row_group_mb}", file=sys.stderr)
        return 2
    try:
        result = convert(args.input, args.format, args.output, args.to, image_root=args.image_root,
                         include_unused=args.include_unused, bad_record_threshold=args.bad_record_threshold,
                         row_group_mb=args.row_group_mb)
    except (B.TooManyBadRecords, UserError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
