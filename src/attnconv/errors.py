"""The exception the command line prints as one line: a mistake in the user's input or setting.

Anything else that escapes a command is an internal bug and keeps its traceback.
"""

from __future__ import annotations

import warnings


class UserError(ValueError):
    """A bad argument, file or environment the user can fix; ``attnconv`` prints it as one line
    (exit status 2). A ValueError, so library callers catching ValueError keep working."""


_warned: set[str] = set()


def warn_deprecated(old_name: str, message: str, stacklevel: int = 2) -> None:
    """One DeprecationWarning per process for each deprecated ``old_name`` (its first use).

    ``stacklevel`` counts from the caller of this function, as for ``warnings.warn``.
    """
    if old_name in _warned:
        return
    _warned.add(old_name)
    warnings.warn(message, DeprecationWarning, stacklevel=stacklevel + 1)
