"""User errors: what was asked for cannot be done, and the message says what to do instead.

The files print them as one line, `error: <message>`, with no traceback (under torchrun rank 0
alone, unless another rank is the only one to fail), before any heavy work where they can be found
that early. Any other exception is a
bug in mathrl or a library, and keeps its traceback. Each class is also the built-in error a Python
reader expects (a UsageError is a ValueError), so `except ValueError` still catches it.
"""

import os
import sys
import time


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
    rank = os.environ.get("RANK", "0")
    if rank != "0":
        # An option error stops every rank at once, and rank 0 says why: torchrun ends the others
        # during this pause, so the message is printed once. An error of this rank alone (a NaN
        # reward in its batch) outlives the pause and is printed, naming the rank. 2 s was too
        # short for rank 0's exit on a busy machine, and the message came twice.
        time.sleep(10.0)
        print(f"error (rank {rank}): {error}", file=sys.stderr, flush=True)
        return
    print(f"error: {error}", file=sys.stderr, flush=True)


def report_user_errors():
    """From here on, an uncaught UserError ends the process with its one-line message (exit status
    1); anything else prints its traceback as usual."""
    sys.excepthook = _print_user_errors
