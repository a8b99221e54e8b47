"""Compare two online evaluations of the same held-out episodes, paired by episode.

    python -m launch.compare --a=runs/miniwob_eval/online_checkpoint.json \\
        --b=runs/miniwob_rl_eval/online_checkpoint.json [--out=runs/rl_vs_sft.json]

``--a`` / ``--b`` are ``online_<agent>.json`` files that launch.eval writes (synthetic
world or MiniWoB++), or an eval workdir holding exactly one. Prints (and with ``--out``
writes) the success difference b - a over the episodes both played, its paired bootstrap
95% interval, and the same per task (per platform in the synthetic world); see
:mod:`guilibra_jax.eval.compare`. Overall figures are over episodes: the macro success
when every task played the same number of episodes, as launch.eval plays them.
"""

import glob
import json
import os

from absl import flags

from launch import cli, recipes

__doc__ += recipes.index_text()   # --help lists the recipes in configs/

_A = flags.DEFINE_string("a", None, "The baseline: an online_<agent>.json file or an eval workdir with one.")
_B = flags.DEFINE_string("b", None, "The other side (the difference is b - a), as --a.")
_OUT = flags.DEFINE_string("out", "", "Also write the comparison here (JSON).")
flags.mark_flags_as_required(["a", "b"])


def _load(path: str, flag: str) -> dict:
    from guilibra_jax.errors import UserError
    if os.path.isdir(path):
        found = sorted(glob.glob(os.path.join(path, "online_*.json")))
        if len(found) != 1:
            raise UserError(f"--{flag}={path}: a folder needs exactly one online_<agent>.json, found "
                            f"{[os.path.basename(f) for f in found]}; name the file")
        path = found[0]
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise UserError(f"--{flag}={path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise UserError(f"--{flag}={path}: not JSON ({e})") from None


def main(argv):
    del argv
    from guilibra_jax.eval.compare import compare_online
    out = compare_online(_load(_A.value, "a"), _load(_B.value, "b"), names=("a", "b"))
    out = {"a_file": _A.value, "b_file": _B.value, **out}
    text = json.dumps(out, indent=1)
    if _OUT.value:
        with open(_OUT.value, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    cli.run(main)
