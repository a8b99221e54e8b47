"""Convert trajectory data between formats; every format goes through native records.

    python -m launch.convert_data --input=DIR_OR_FILE --format=uni_gui --output=out.jsonl
    python -m launch.convert_data --input=out.jsonl --format=native --to=guilibra_sft --output=sft.json

--format: guilibra_sft | guilibra_rl | uni_gui | native (the input's format).
--to: native (default) | guilibra_sft | guilibra_rl (the output's format).
Bad records are skipped and counted by reason; the run fails when their fraction
passes --bad_record_threshold.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from guilibra_jax.data import bad_records as B
from guilibra_jax.data import readers as R
from guilibra_jax.data import writers as W


def convert(inputs, fmt: str, output: str, to: str = "native", *, image_root: str | None = None,
            include_unused: bool = False, bad_record_threshold: float = 0.05) -> dict:
    """Convert and return {"written": n, "bad": {reason: count}, "skipped": {...}}."""
    if to not in W.WRITERS:
        raise ValueError(f"unknown output format {to!r}; expected one of {sorted(W.WRITERS)}")
    src = R.open_source(inputs, fmt, image_root=image_root, include_unused=include_unused)
    log = B.BadRecordLog(threshold=bad_record_threshold, min_seen=0)
    records = []
    for i in range(len(src)):
        r = src[i]
        if isinstance(r, B.Dropped):
            log.add(r)
        else:
            log.kept += 1
            records.append(r)
    log.check(final=True)
    n = W.WRITERS[to](records, output)
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
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        result = convert(args.input, args.format, args.output, args.to, image_root=args.image_root,
                         include_unused=args.include_unused, bad_record_threshold=args.bad_record_threshold)
    except B.TooManyBadRecords as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
