"""PS2, wiring it up: train an algorithm file with your PS1 functions in place of its own.

    python -m exercises.train grpo.py --max_steps 20                # every PS1 function grpo.py uses
    python -m exercises.train grpo.py --plug 1.5 -- --max_steps 20  # PS1.5 only
    python -m exercises.train grpo.py --solution -- --max_steps 20  # the project's own: the reference
    torchrun --nproc_per_node 2 -m exercises.train grpo.py ...

The file runs as `python grpo.py` would, with one change: the names it calls for the pieces that
PS1 asks for (grpo.py's `group_advantages`, `aggregate`, ...) are bound to your functions. Nothing
in the file is edited, and with --solution the run is the plain file's, number for number
(tests/test_exercises.py). Before training, each of your functions is checked as
`python -m exercises.check` would; a stub stops the run, a wrong function is said and trained with
anyway: watching what it does to a run is a lesson of its own.
"""

import argparse
import importlib
import os
from pathlib import Path

from exercises.check import all_exercises, check

# For each file: exercise -> (the name the file calls, how the student's function stands in for it).
# Most exercises have the file's own signature; the adapters cover the three that ask for one case
# of a more general function.


def _same(student, original):
    return student


def _rloo(student, original):  # reinforce.py's compute_baselines: PS1.7 is its "rloo" case
    return lambda episode_returns, group_size, baseline: (
        student(episode_returns, group_size) if baseline == "rloo"
        else original(episode_returns, group_size, baseline))


def _skip_ties(student, original):  # online_dpo.py's preference_pairs: PS1.12 is ties="skip"
    return lambda scores, group_size, ties="skip": (
        student(scores, group_size) if ties == "skip" else original(scores, group_size, ties))


def _step_gae(student, original):  # appo.py's compute_advantages takes a mask it does not use
    return lambda rewards, values, response_mask, next_values, dones, gamma, lam: student(
        rewards, values, next_values, dones, gamma, lam)


PLUGS = {
    "grpo": {"1.1": ("masked_mean", _same), "1.3": ("kl_estimate", _same),
             "1.5": ("group_advantages", _same), "1.6": ("aggregate", _same)},
    "ppo": {"1.1": ("masked_mean", _same), "1.2": ("masked_whiten", _same),
            "1.3": ("kl_estimate", _same), "1.6": ("aggregate", _same),
            "1.8": ("token_gae", _same)},
    "reinforce": {"1.1": ("masked_mean", _same), "1.3": ("kl_estimate", _same),
                  "1.7": ("compute_baselines", _rloo)},
    "online_dpo": {"1.12": ("preference_pairs", _skip_ties)},
    "appo": {"1.1": ("masked_mean", _same), "1.3": ("kl_estimate", _same),
             "1.13": ("compute_advantages", _step_gae)},
    "tppo": {"1.1": ("masked_mean", _same), "1.3": ("kl_estimate", _same),
             "1.14": ("compute_advantages", _same)},
}


def plug(module, ids, solution=False, say=print):
    """Bind the file's names to the students' functions (the oracles with solution) for the
    exercises `ids`; returns {exercise: the name bound}. A stub raises SystemExit with one line."""
    exercises = all_exercises()
    bound = {}
    for id in ids:
        name, adapt = PLUGS[module.__name__][id]
        exercise = exercises[id]
        problem = check(exercise, solution)
        if problem is not None and problem.startswith("not written yet"):
            raise SystemExit(f"error: PS{id} {problem}; or train without it: --plug "
                             + " ".join(i for i in ids if i != id))
        if problem is not None:
            say(f"PS{id} is wrong ({problem}); training with it anyway")
        fn = exercise.oracle if solution else exercise.student()
        setattr(module, name, adapt(fn, getattr(module, name)))
        bound[id] = name
    return bound


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Everything after the file (or after --) goes to the file as its own flags.")
    parser.add_argument("file", help=f"the algorithm file: {', '.join(f + '.py' for f in PLUGS)}")
    parser.add_argument("--plug", nargs="+", metavar="ID",
                        help="the PS1 exercises to plug in (default: every one the file uses)")
    parser.add_argument("--solution", action="store_true",
                        help="plug the project's own functions: the reference run")
    args, rest = parser.parse_known_args(argv)
    rest = [a for a in rest if a != "--"]
    name = Path(args.file).stem
    if name not in PLUGS:
        raise SystemExit(f"error: {args.file} is no algorithm file; the files are "
                         f"{', '.join(f + '.py' for f in PLUGS)}")
    ids = args.plug or list(PLUGS[name])
    unknown = [i for i in ids if i not in PLUGS[name]]
    if unknown:
        raise SystemExit(f"error: {name}.py calls no function of PS{', PS'.join(unknown)}; it "
                         f"calls those of {', '.join(PLUGS[name])}")
    module = importlib.import_module(name)
    bound = plug(module, ids, args.solution)
    if os.environ.get("RANK", "0") == "0":
        print(f"{name}.py with {'the project' if args.solution else 'your'} functions: "
              + ", ".join(f"{v} (PS{k})" for k, v in bound.items()), flush=True)
    return module.main(module.parse_args(module.Args, rest))


if __name__ == "__main__":
    main()
