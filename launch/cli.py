"""What every launcher shares: one flag style (absl) and user errors on one line.

    if __name__ == "__main__":
        cli.run(main)

A :class:`guilibra_jax.errors.UserError` raised anywhere under ``main`` prints
``error: <message>`` on stderr and exits with status 2; ``--verbose`` re-raises it with
its traceback. Anything else is a bug and keeps its traceback (exit status 1).
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

    app.run(wrapped)
