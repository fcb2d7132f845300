"""User errors: what was asked for cannot be done, and the message says what to do instead.

The files print them as one line, `error: <message>`, with no traceback (rank 0 alone under
torchrun), before any heavy work where they can be found that early. Any other exception is a
bug in mathrl or a library, and keeps its traceback. Each class is also the built-in error a Python
reader expects (a UsageError is a ValueError), so `except ValueError` still catches it.
"""

import os
import sys


class UserError(Exception):
    """Raised for what the user asked (a flag, a path, a data file, a reward), never for a bug."""


class UsageError(UserError, ValueError):
    """A flag's value out of its range or at odds with another, or data that does not fit."""


class PathError(UserError, OSError):
    """A path that is missing, already taken, unwritable or of the wrong kind; a model or dataset
    that cannot be loaded from where it was asked for."""


class PackageError(UserError, ImportError):
    """An option that needs a package which is not installed."""


class NonFiniteError(UserError, FloatingPointError):
    """A NaN or inf reward, loss or weight, which would spoil the run if it went on."""


def _print_user_errors(kind, error, traceback):
    if not isinstance(error, UserError):
        return sys.__excepthook__(kind, error, traceback)
    if os.environ.get("RANK", "0") == "0":  # every rank stops; one says why
        print(f"error: {error}", file=sys.stderr, flush=True)


def report_user_errors():
    """From here on, an uncaught UserError ends the process with its one-line message (exit status
    1); anything else prints its traceback as usual."""
    sys.excepthook = _print_user_errors
