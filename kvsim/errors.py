"""Exceptions raised for callers' mistakes.

Every error a user can cause (a bad size, a malformed config.json, a trace with missing
columns) is a :class:`KvsimError` carrying a one-line message. The CLI prints the message
and exits non-zero; the app shows it with ``st.error``. Internal invariants use ``assert``.
"""

from __future__ import annotations


class KvsimError(ValueError):
    """A caller's mistake, described in one line fit to show a user."""


class ConfigError(KvsimError):
    """A model description (preset name, config.json, hand-set sizes) is unusable."""
