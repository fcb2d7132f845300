"""User errors: what was asked for cannot be done, and the message says what to do instead.

The files print them as one line, `error: <message>`, with no traceback, before any heavy work
where they can be found that early. Under torchrun an error that every rank meets is printed by the
first rank of each node, and one rank's own by that rank. Any other exception is a bug in mathrl or
a library, and keeps its traceback. Each class is also the built-in error a Python
reader expects (a UsageError is a ValueError), so `except ValueError` still catches it.
"""

import atexit
import contextlib
import math
import os
import signal
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
    if "RANK" in os.environ and getattr(error, "every_rank", False):
        # once a node, by its first rank: each node's launcher shows its own ranks' lines, and
        # another node's files may differ. Not sys.stderr: under a process group, torch's
        # excepthook buffers it
        if os.environ.get("LOCAL_RANK", "0") == "0":
            print(f"error{'' if rank == '0' else f' (rank {rank})'}: {error}", file=sys.__stderr__,
                  flush=True)
        leave_together(1)
    # A rank's own error (a NaN reward in its batch) is said by that rank: the others wait in a
    # collective for it. torchrun ends them when the first rank exits, which the rest of this
    # rank's kind meet during this pause, so an error that every rank met is printed once.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(1))  # ended during the pause: still 1
    if rank != "0":
        time.sleep(10.0)
        print(f"error (rank {rank}): {error}", file=sys.stderr, flush=True)
        return
    print(f"error: {error}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def on_every_rank():
    """Code that every rank runs alike on the same inputs (the command line, the option checks,
    the task's data): a user error raised in it is raised by every rank, so the first rank of each
    node alone prints it. Also a decorator: @on_every_rank()."""
    try:
        yield
    except UserError as error:
        error.every_rank = True
        raise


_AT_EXIT = []  # (function, args) that leave_together runs too, as os._exit skips atexit


def at_exit(function, *args):
    """atexit.register(function, *args), also run by a rank that leaves through leave_together."""
    atexit.register(function, *args)
    _AT_EXIT.append((function, args))


def leave_together(status):
    """End this rank at the moment every rank that met the same error ends, by the clock they all
    read: the second whole half-second from now. torchrun ends the ranks still running when the
    first one exits, with a line of its own for each after the error's; ranks that leave within
    one of its checks (every 0.1 s) leave none, so the error is the last line before its summary.
    A rank ended by it anyway exits with the same status."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(status))
    for function, args in _AT_EXIT:
        with contextlib.suppress(Exception):
            function(*args)
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        stream.flush()
    time.sleep(max(0.0, (math.floor(time.time() / 0.5) + 2) * 0.5 - time.time()))
    os._exit(status)


def report_user_errors():
    """From here on, an uncaught UserError ends the process with its one-line message (exit status
    1); anything else prints its traceback as usual."""
    sys.excepthook = _print_user_errors
