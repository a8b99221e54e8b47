"""Write copy variants of demonstration steps (:mod:`guilibra_jax.data.copy_variants`).

    python -m launch.copy_variants --input=runs/miniwob_demos/train.jsonl \\
        --out=runs/miniwob_demos/train_copy.jsonl [--copies=3] [--seed=0] [--random_fraction=0.5]

Reads native JSONL (``--input``: files, folders or globs) and writes to ``--out`` only the
new steps: ``--copies`` variants of every step whose typed or selected value is a string
quoted in its instruction, with the quoted strings swapped for random strings of the same
shape or for other quoted strings of the input. Train on the originals and the variants
together (``--config.data.train_files='("DIR/train.jsonl","DIR/train_copy.jsonl")'``).
Image paths in ``--out`` are relative to its folder when the images lie inside it. Prints
a summary: steps read, bad records (with where they are), eligible steps by source, the
reasons the others have none, and variants written.
"""

import collections
import json

from absl import flags

from launch import cli, recipes

__doc__ += recipes.index_text()   # --help lists the recipes in configs/

_INPUT = flags.DEFINE_list("input", None, "Native JSONL files, folders or globs to draw variants from.")
_OUT = flags.DEFINE_string("out", None, "Output native JSONL (the variants only).")
_COPIES = flags.DEFINE_integer("copies", 3, "Variants per eligible step.", lower_bound=1)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the swaps (with each step's trajectory id and copy index).")
_RANDOM = flags.DEFINE_float("random_fraction", 0.5, "Share of swaps drawn as random strings of the same shape "
                             "(the rest: other quoted strings of the input).", lower_bound=0.0, upper_bound=1.0)
flags.mark_flags_as_required(["input", "out"])


def main(argv):
    del argv
    from guilibra_jax.data import copy_variants as CV
    from guilibra_jax.data.bad_records import Dropped
    from guilibra_jax.data.readers import open_source
    from guilibra_jax.data.writers import write_native
    from guilibra_jax.errors import UserError
    src = open_source(_INPUT.value, "native", config_key="--input")
    records, bad, why_not = [], collections.Counter(), collections.Counter()
    bad_examples = []
    for i in range(len(src)):
        r = src[i]
        if isinstance(r, Dropped):
            bad[r.reason] += 1
            if len(bad_examples) < 5:
                bad_examples.append(f"{r.where}: {r.reason} {r.message}".strip())
            continue
        reason = CV.eligible(r)
        if reason is None:
            records.append(r)
        else:
            why_not[reason] += 1
    if not records:
        raise UserError(f"--input={','.join(_INPUT.value)}: no step types a string quoted in its instruction "
                        f"({dict(why_not)}); nothing to write")
    pool = sorted({q for r in records for q in CV.quoted_strings(r.instruction)})
    variants = [v for r in records for v in CV.copy_variants(r, _COPIES.value, _SEED.value, pool, _RANDOM.value)]
    n = write_native(variants, _OUT.value)
    print(json.dumps({
        "out": _OUT.value, "steps_read": len(src), "bad_records": dict(bad), "bad_examples": bad_examples,
        "eligible": len(records), "eligible_by_source": dict(collections.Counter(r.source for r in records)),
        "not_eligible": dict(why_not), "pool_strings": len(pool), "variants": n}, indent=1))


if __name__ == "__main__":
    cli.run(main)
