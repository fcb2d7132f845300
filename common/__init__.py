"""The code the algorithm files share, as the design names it: an env, model loading and sampling,
and a KL/advantage utility module, plus the run's plumbing. Four packages, each importing only from
those below it (env < models < rl < run), stand on a floor that every one of them needs, which this
face names:

    errors        user errors: one line that names the fix, no traceback
    distributed   torchrun's ranks, the collectives, the seeds

Each package's face (its __init__) names what an algorithm file may import from it, and
tests/test_layers.py holds every file to those five faces.
"""

from common.errors import (NonFiniteError, PackageError, PathError, UsageError, UserError,
                           report_user_errors)

# The ranks' names read torch, which the env and the grader's worker processes never load: they
# are imported on first use (from common import all_reduce_sum).
_DISTRIBUTED = ("all_gather_objects", "all_reduce_mean", "all_reduce_sum", "init_distributed",
                "print0", "sample_seed", "set_seed")

__all__ = ["NonFiniteError", "PackageError", "PathError", "UsageError", "UserError",
           "report_user_errors", *_DISTRIBUTED]


def __getattr__(name):
    if name in _DISTRIBUTED:
        from common import distributed

        return getattr(distributed, name)
    raise AttributeError(f"module 'common' has no attribute {name!r}")
