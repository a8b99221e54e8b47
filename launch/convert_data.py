"""Convert trajectory data between formats; every format goes through native records.

    python -m launch.convert_data --input=DIR_OR_FILE --format=uni_gui --output=out.jsonl
    python -m launch.convert_data --input=out.jsonl --format=native --to=guilibra_sft --output=sft.json

--format: guilibra_sft | guilibra_rl | uni_gui | native (the input's format).
--to: native (default) | guilibra_sft | guilibra_rl (the output's format).
Bad records are skipped and counted by reason; the run fails when their fraction
passes --bad_record_threshold.
"""

from __future__ import annotations

import json
import logging
import sys

from absl import flags

from guilibra_jax.data import bad_records as B
from guilibra_jax.data import readers as R
from guilibra_jax.data import writers as W
from guilibra_jax.errors import UserError
from launch import cli


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


_INPUT = flags.DEFINE_multi_string("input", None, "Files, folders or globs (repeat the flag for several).")
_FORMAT = flags.DEFINE_enum("format", None, list(R.FORMATS), "The input's format.")
_OUTPUT = flags.DEFINE_string("output", None, "Output file.")
_TO = flags.DEFINE_enum("to", "native", sorted(W.WRITERS), "The output's format.")
_IMAGE_ROOT = flags.DEFINE_string("image_root", None, "Folder relative image paths start from (guilibra_sft).")
_INCLUDE_UNUSED = flags.DEFINE_bool("include_unused", False, "uni_gui: keep is_use=false steps.")
_THRESHOLD = flags.DEFINE_float("bad_record_threshold", 0.05, "Fail when the fraction of bad records passes this.")
flags.mark_flags_as_required(["input", "format", "output"])


def run(argv) -> None:
    """absl main: convert, print the counts as JSON; too many bad records is a user error."""
    del argv
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        result = convert(_INPUT.value, _FORMAT.value, _OUTPUT.value, _TO.value, image_root=_IMAGE_ROOT.value,
                         include_unused=_INCLUDE_UNUSED.value, bad_record_threshold=_THRESHOLD.value)
    except B.TooManyBadRecords as e:
        raise UserError(str(e)) from None
    except FileNotFoundError as e:
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
