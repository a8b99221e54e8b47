"""User-facing errors: a mistake in what the user gave (a config key, a file, a record,
a model folder), as opposed to a bug. Launchers print the message on one line and exit
with status 2, without a traceback (``--verbose`` shows it); see :mod:`launch.cli`.

Messages name the full config key (``data.max_bad_fraction``), file or record, the value
found and what is allowed."""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user. A ValueError, so existing ``except ValueError`` still works."""


class ConfigError(UserError):
    """A run config key holds a bad value (or keys disagree)."""
