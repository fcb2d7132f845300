"""Your own reward functions (`--reward_fn file.py:name` or `module:name`), in TRL's convention.

A reward function grades a batch, and every argument is a keyword list with one entry per
completion, as TRL's GRPOTrainer passes them:

    def my_reward(completions, **kwargs) -> list[float | None]: ...

- `prompts`: what the model was given: chat messages under `--template chat`, a string under
  `--template plain`.
- `completions`: what it wrote: `[{"role": "assistant", "content": text}]` under chat, the text
  under plain.
- `completion_ids`: the sampled token ids, or None where the caller has none (evaluation, stepwise
  episodes).
- one list per field of the data row, under the row's own names (`answer`, `question`, ...).

It returns one float per completion, or None for "this function does not score this one" (TRL's
convention): a None is left out of the weighted sum. The reward of a completion is
`sum(weight * value)` over the task's verifier (always first) and each function, with
`--reward_weights` (default 1 each).

The function is your own code, run in the training process with its rights: mathrl imports it as
Python imports any module. One call (one batch) may take MATHRL_REWARD_FN_TIMEOUT seconds (default
60); a call that runs longer stops the run with one line naming the function.
"""

import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Mapping, Set
from numbers import Real
from pathlib import Path

from common.errors import PathError, UsageError
from common.env.timelimit import OutOfTime, wall_limit

# keys that name the batch itself in TRL's call, so no data field may take their place
RESERVED = ("prompts", "completions", "completion_ids")


def load_reward_fn(spec: str):
    """'path/to/file.py:name' or 'package.module:name' -> (name, the function)."""
    module_name, sep, name = spec.rpartition(":")
    if not sep or not module_name or not name.isidentifier():
        raise UsageError(f"--reward_fn {spec!r}: write file.py:function or module:function, e.g. "
                         "--reward_fn examples/own_task/reward.py:reward")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise PathError(f"--reward_fn {spec}: no file {path} (a path relative to "
                            f"{os.getcwd()}, or an absolute one)")
        found = importlib.util.spec_from_file_location(f"reward_fn_{path.stem}", path)
        module = importlib.util.module_from_spec(found)
        found.loader.exec_module(module)  # the user's own code: its errors keep their traceback
    else:
        if os.getcwd() not in sys.path:  # `python grpo.py --reward_fn my_rewards:f` from a folder
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name is None or not module_name.startswith(e.name):
                raise  # an import inside the user's module failed: its traceback says which
            raise PathError(f"--reward_fn {spec}: no module {module_name!r} on the path (give a "
                            "file instead: path/to/file.py:function)") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise UsageError(f"--reward_fn {spec}: {module_name} has no function {name!r} (functions "
                         f"in it: {', '.join(found) or 'none'})")
    return name, fn


def reward_fn_limit() -> float:
    """Seconds one call of a reward function may take: MATHRL_REWARD_FN_TIMEOUT, default 60."""
    text = os.environ.get("MATHRL_REWARD_FN_TIMEOUT", "60")
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise UsageError(f"MATHRL_REWARD_FN_TIMEOUT={text}: give a number of seconds above 0")
    return seconds


def call_reward_fn(name, fn, prompts, completions, completion_ids, rows) -> list:
    """fn's rewards for a batch, checked: one float or None per completion. rows: the data row of
    each completion, whose fields become keyword lists."""
    fields = list(dict.fromkeys(k for row in rows for k in row if k not in RESERVED))
    kwargs = {k: [row.get(k) for row in rows] for k in fields}
    where = f"reward function {name!r} (--reward_fn)"
    limit = reward_fn_limit()
    try:
        with wall_limit(limit):  # by the clock: a function may wait on a server
            out = fn(prompts=prompts, completions=completions, completion_ids=completion_ids,
                     **kwargs)
    except OutOfTime:
        raise UsageError(f"{where} took more than {limit:g} s on a batch of {len(completions)} "
                         "completions; make it faster, or allow it more time with "
                         "MATHRL_REWARD_FN_TIMEOUT=<seconds>") from None
    # a dict or a set has a length too, but its keys are no rewards in order
    if isinstance(out, (str, bytes, Mapping, Set)) or not hasattr(out, "__len__"):
        raise UsageError(f"{where} returned {type(out).__name__}; return a list with one float "
                         f"(or None) per completion")
    out = list(out.tolist() if hasattr(out, "tolist") else out)  # a tensor or an array
    if len(out) != len(completions):
        raise UsageError(f"{where} returned {len(out)} rewards for {len(completions)} "
                         "completions; return one float (or None) per completion")
    for k, value in enumerate(out):
        if value is None:
            continue
        if not isinstance(value, Real):  # True and False count 1 and 0, as in TRL
            raise UsageError(f"{where} returned {value!r} ({type(value).__name__}) for completion "
                             f"{k}; return a float, or None for no reward")
        if not math.isfinite(value):
            raise UsageError(f"{where} returned {value} for completion {k}; return a finite "
                             "float, or None for no reward")
    return [None if v is None else float(v) for v in out]


def weighted_sum(columns: list, weights: list) -> list:
    """Each completion's reward: sum(weight * value) over the columns (one per function), leaving
    out a None, as TRL's nansum does."""
    return [sum(w * v for w, v in zip(weights, values) if v is not None)
            for values in zip(*columns)]
