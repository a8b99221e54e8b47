"""What every launcher shares: one flag style (absl) and user errors on one line.

    if __name__ == "__main__":
        cli.run(main)

A :class:`guilibra_jax.errors.UserError` raised anywhere under ``main`` prints
``error: <message>`` on stderr and exits with status 2; ``--verbose`` re-raises it with
its traceback. Anything else is a bug and keeps its traceback (exit status 1).
``--help`` (``-h``, ``-?``, ``--helpshort``, ``--helpfull``) prints the launcher's
docstring (with the recipes in ``configs/``) and its flags on stdout, exit status 0.
"""

from __future__ import annotations

import sys

from absl import app, flags

from guilibra_jax.errors import UserError

_VERBOSE = flags.DEFINE_bool("verbose", False, "Show tracebacks of user errors (bad config, files, records).")


def run(main) -> None:
    """``absl.app.run(main)`` with user errors reported on one line (exit status 2)."""

    def wrapped(argv):
        try:
            return main(argv)
        except UserError as e:
            if _VERBOSE.value:
                raise
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)

    app.run(wrapped, flags_parser=parse_flags)


_HELP = {"help": True, "h": True, "?": True, "helpshort": True, "helpfull": False}   # name -> short help


def _help_asked(argv: list[str]) -> bool | None:
    """Short help (True) or full help (False) when ``argv`` asks for help, else None."""
    for a in argv[1:]:
        if a == "--":
            break
        name = a.lstrip("-").split("=", 1)[0]
        if a.startswith("-") and name in _HELP and a.partition("=")[2].lower() not in ("false", "0"):
            return _HELP[name]
    return None


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, with a ``--config.a.b=v`` override of a key the locked config
    does not have (ml_collections raises AttributeError / KeyError there) reported on
    one line naming the key, exit status 2, instead of a traceback. ``--help`` prints
    the usage before any flag is parsed (a recipe is not loaded) and exits with status 0
    (absl's own help flags exit with 1)."""
    short = _help_asked(argv)
    if short is not None:
        app.usage(shorthelp=short, writeto_stdout=True)
        if short:
            print("\nTry --helpfull to get a list of all flags.")
        sys.exit(0)
    try:
        return app.parse_flags_with_usage(argv)
    except (AttributeError, KeyError) as e:
        msg = e
        while isinstance(msg, BaseException) and msg.args:  # ml_collections wraps a KeyError
            msg = msg.args[0]
        name, _, hint = str(msg).partition("\n")
        name, hint = name.strip("'\" "), hint.replace("\n", " ").strip()
        culprit = next((a.split("=")[0] for a in argv[1:] if a.startswith("--") and "." in a
                        and name and name in a.split("=")[0].split(".")), None)
        if culprit is None:  # not an override of ours: a bug (in a recipe file, say) keeps its traceback
            raise
        print(f"error: config key {culprit.split('.', 1)[1]} does not exist (from {culprit})"
              + (f": {hint}" if hint else ""), file=sys.stderr)
        sys.exit(2)
