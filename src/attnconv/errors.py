"""The exception the command line prints as one line: a mistake in the user's input or setting.

Anything else that escapes a command is an internal bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(ValueError):
    """A bad argument, file or environment the user can fix; ``attnconv`` prints it as one line
    (exit status 2). A ValueError, so library callers catching ValueError keep working."""
