"""Time limits on work done in this process: a grade, a user's reward function.

    with cpu_limit(2.0):        # 2 s of this process's CPU time, then OutOfTime is raised
        reward = grade(...)
    with wall_limit(60.0):      # 60 s by the clock (a reward function may wait on a server)
        rewards = fn(...)

Python cannot stop a running function from outside, so the limit is a timer signal (SIGPROF for
CPU time, SIGALRM for the clock) whose handler raises OutOfTime inside the work, wherever it is:
in a regex, a loop, a sleep. Signals reach only the main thread, so in another thread, or where
setitimer does not exist (Windows), the work runs without a limit; the files grade and call
reward functions in their main thread. `paused()` holds the timer over code that must not be cut
in the middle, such as a request to the sympy worker and its reply.
"""

import contextlib
import signal
import threading


class OutOfTime(BaseException):
    """The work ran past its limit. A BaseException, as KeyboardInterrupt is, so that an
    `except Exception` inside the work (a user's reward function's) does not swallow it."""


def _raise(signum, frame):
    raise OutOfTime()


@contextlib.contextmanager
def _limit(seconds: float, timer: str, signum: str):
    timer, signum = getattr(signal, timer, None), getattr(signal, signum, None)
    if timer is None or threading.current_thread() is not threading.main_thread():
        yield  # no timer signals here: no limit
        return
    previous = signal.signal(signum, _raise)
    signal.setitimer(timer, max(seconds, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(timer, 0)
        signal.signal(signum, previous)


def cpu_limit(seconds: float):
    """Raise OutOfTime once the block has used `seconds` of this process's CPU time."""
    return _limit(seconds, "ITIMER_PROF", "SIGPROF")


def wall_limit(seconds: float):
    """Raise OutOfTime once the block has run `seconds` by the clock."""
    return _limit(seconds, "ITIMER_REAL", "SIGALRM")


@contextlib.contextmanager
def paused():
    """Hold any running limit of this thread over the block, and give back what was left after
    it: the block is never cut in the middle."""
    timers = [getattr(signal, t) for t in ("ITIMER_PROF", "ITIMER_REAL") if hasattr(signal, t)]
    if threading.current_thread() is not threading.main_thread():
        timers = []
    left = {t: signal.setitimer(t, 0)[0] for t in timers}
    try:
        yield
    finally:
        for timer, seconds in left.items():
            if seconds > 0:
                signal.setitimer(timer, seconds)
