"""PS2, wiring it up: train an algorithm file with your PS1 functions in place of its own.

    python -m exercises.train grpo.py --max_steps 20                # every PS1 function grpo.py uses
    python -m exercises.train grpo.py --plug 1.5 -- --max_steps 20  # PS1.5 only
    python -m exercises.train grpo.py --solution -- --max_steps 20  # the project's own: the reference
    python -m exercises.train grpo.py --mistake 1.5:5               # a common mistake, trained
    torchrun --nproc_per_node 2 -m exercises.train grpo.py ...

The file runs as `python grpo.py` would, with one change: the names it calls for the pieces that
PS1 asks for (grpo.py's `group_advantages`, `aggregate`, ...) are bound to your functions. Nothing
in the file is edited, and with --solution the run is the plain file's, number for number
(tests/test_exercises.py). Before training, each of your functions is checked as
`python -m exercises.check` would; a stub stops the run, a wrong function is said and trained with
anyway: watching what it does to a run is a lesson of its own.

Run with the file's default settings (only --seed, --output_dir and the logging intervals may be
given), the run ends with a verdict: it passes when its held-out accuracy after the last update is
at least PASS_MARK. The marks and how they were chosen: docs/course.md#ps2-wiring-it-up.
"""

import argparse
import copy
import importlib
import os
from pathlib import Path

import torch

from common.models.hf import position_ids_from_mask
from common.run.plot import read_log
from exercises.check import all_exercises, check_apart
from exercises.exercise import Wrong

# The held-out accuracy a run of the file's defaults must reach after its last update to pass
# (docs/course.md#ps2-wiring-it-up: the reference runs over seeds, and runs with common mistakes).
PASS_MARK = {"grpo": 0.45, "ppo": 0.45, "reinforce": 0.45, "online_dpo": 0.45}
# The flags that leave a run's training as the defaults have it, so that its mark still holds.
FREE_FLAGS = ("seed", "output_dir", "eval_interval", "log_interval", "save_interval")

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


def _response_logprobs(student, original):
    """token_logprobs, the training forward (common/models/logprobs.py), with the student's PS1.4
    scoring the response from the model's logits. The positions kept are the last R + 1, as the
    file's own plain path keeps them; the entropy, a logged number, is computed beside it."""
    def token_logprobs(model, input_ids, attention_mask, response_len, temperature=1.0,
                       return_hidden=False, fast=True):
        out = model(input_ids=input_ids, attention_mask=attention_mask,
                    position_ids=position_ids_from_mask(attention_mask),
                    logits_to_keep=response_len + 1, output_hidden_states=return_hidden)
        logits = out.logits.float()  # [B, R + 1, V]
        logprobs = student(logits, input_ids[:, -(response_len + 1):], response_len, temperature)
        entropy = torch.distributions.Categorical(logits=logits[:, :-1] / temperature).entropy()
        return (logprobs, entropy, out.hidden_states[-1]) if return_hidden else (logprobs, entropy)
    return token_logprobs


def _clipped_surrogate(student, original):
    """grpo.py's policy_loss built around the student's PS1.9: their per-token surrogate, plus the
    file's KL term, through the file's aggregate (the student's, when 1.3 or 1.6 are plugged too).
    The logged numbers are the file's own. tests/test_exercises.py holds this equal to the file's
    policy_loss, value and gradient, when the surrogate is the file's."""
    def policy_loss(logprobs, old_logprobs, advantages, loss_mask, normaliser, args,
                    ref_logprobs=None):
        if args.importance_sampling_level != "token":  # GSPO's one ratio per response: not 1.9's
            return original(logprobs, old_logprobs, advantages, loss_mask, normaliser, args,
                            ref_logprobs)
        file = original.__globals__  # the file's names, as plug() has bound them
        _, stats = original(logprobs.detach(), old_logprobs, advantages, loss_mask, normaliser,
                            args, ref_logprobs)
        per_token = student(logprobs, old_logprobs, advantages[:, None].expand_as(logprobs),
                            args.epsilon)
        if ref_logprobs is not None:
            per_token = per_token + args.beta * file["kl_estimate"](logprobs, ref_logprobs,
                                                                    args.kl_estimator)
        loss = file["aggregate"](per_token, loss_mask.float(), args.loss_type, normaliser)
        return loss, stats
    return policy_loss


# Plugged only when named with --plug: 1.4 turns the training forward into the plain one (every
# response reads its whole prompt again): a default run of grpo.py took 13 min 49 s with it and
# 8 min 33 s without, on an idle 2-core CPU.
ASKED_FOR = ("1.4",)

PLUGS = {
    "grpo": {"1.1": ("masked_mean", _same), "1.3": ("kl_estimate", _same),
             "1.4": ("token_logprobs", _response_logprobs), "1.5": ("group_advantages", _same),
             "1.6": ("aggregate", _same), "1.9": ("policy_loss", _clipped_surrogate)},
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


def plug(module, ids, solution=False, say=print, mistakes=None):
    """Bind the file's names to the students' functions (the oracles with solution) for the
    exercises `ids`; returns {exercise: the name bound}. A stub raises SystemExit with one line.
    mistakes: {exercise: k}, plug the checker's k-th common mistake (from 1) instead."""
    exercises = all_exercises()
    bound = {}
    for id in ids:
        name, adapt = PLUGS[module.__name__][id]
        exercise = exercises[id]
        if id in (mistakes or {}):
            words, wrong = exercise.mistakes[mistakes[id] - 1]
            # words made from a student's numbers have no text of their own: the list has them
            said = words if isinstance(words, str) else "its words are in exercises/ps1/cases.py"
            say(f"PS{id}: training with common mistake {mistakes[id]}: {said}")
            setattr(module, name, adapt(wrong, getattr(module, name)))
            bound[id] = name
            continue
        problem = check_apart(exercise, solution)  # a loop that never ends is stopped, and said
        if problem is not None and problem.startswith("not written yet"):
            raise SystemExit(f"error: PS{id} {problem}; or train without it: --plug "
                             + " ".join(i for i in ids if i != id))
        if problem is not None:
            say(f"PS{id} is wrong ({problem}); training with it anyway")
        try:
            fn = exercise.oracle if solution else exercise.student()
        except Wrong as e:  # the student's file does not import: nothing to train with
            raise SystemExit(f"error: PS{id}: {e}") from None
        setattr(module, name, adapt(fn, getattr(module, name)))
        bound[id] = name
    return bound


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Everything after the file (or after --) goes to the file as its own flags.")
    parser.add_argument("file", help=f"the algorithm file: {', '.join(f + '.py' for f in PLUGS)}")
    parser.add_argument("--plug", nargs="+", metavar="ID",
                        help="the PS1 exercises to plug in (default: every one the file uses but "
                        f"{', '.join(ASKED_FOR)}, which is plugged only when named here)")
    parser.add_argument("--solution", action="store_true",
                        help="plug the project's own functions: the reference run")
    parser.add_argument("--mistake", nargs="+", default=[], metavar="ID:K",
                        help="train with the checker's K-th common mistake of exercise ID (1.5:5), "
                        "in place of yours: what the mistake does to a run")
    args, rest = parser.parse_known_args(argv)
    rest = [a for a in rest if a != "--"]
    name = Path(args.file).stem
    if name not in PLUGS:
        raise SystemExit(f"error: {args.file} is no algorithm file; the files are "
                         f"{', '.join(f + '.py' for f in PLUGS)}")
    ids = args.plug or [i for i in PLUGS[name] if i not in ASKED_FOR]
    unknown = [i for i in ids if i not in PLUGS[name]]
    if unknown:
        raise SystemExit(f"error: {name}.py calls no function of PS{', PS'.join(unknown)}; it "
                         f"calls those of {', '.join(PLUGS[name])}")
    mistakes = parse_mistakes(args.mistake, name)
    ids += [i for i in mistakes if i not in ids]
    module = importlib.import_module(name)
    bound = plug(module, ids, args.solution, mistakes=mistakes)
    first = os.environ.get("RANK", "0") == "0"
    if first:
        print(f"{name}.py with {'the project' if args.solution else 'your'} functions: "
              + ", ".join(f"{v} (PS{k})" for k, v in bound.items()), flush=True)
    file_args = module.parse_args(module.Args, rest)
    given = copy.deepcopy(file_args)  # main derives some options (the micro-batch) in place
    result = module.main(file_args)
    if first:
        print(verdict(name, given, module.parse_args(module.Args, []), file_args.output_dir))
    return result


def parse_mistakes(given, name):
    """["1.5:5", ...] -> {"1.5": 5}, each a mistake the checker knows for an exercise the file
    calls; anything else is one line naming what there is."""
    exercises, mistakes = all_exercises(), {}
    for item in given:
        id, _, k = item.partition(":")
        if id not in PLUGS[name]:
            raise SystemExit(f"error: --mistake {item}: {name}.py calls no function of PS{id}; it "
                             f"calls those of {', '.join(PLUGS[name])}")
        count = len(exercises[id].mistakes)
        if not k.isdigit() or not 1 <= int(k) <= count:
            raise SystemExit(f"error: --mistake {item}: give ID:K with K from 1 to {count}, the "
                             f"mistakes of PS{id} in exercises/ps1/cases.py")
        mistakes[id] = int(k)
    return mistakes


def final_accuracy(output_dir):
    """(accuracy before the first update, after the last) from a run's eval.jsonl, or None."""
    rows = [r for r in read_log(Path(output_dir) / "eval.jsonl") if "eval/accuracy" in r]
    return (rows[0]["eval/accuracy"], rows[-1]["eval/accuracy"]) if len(rows) >= 2 else None


def verdict(name, args, defaults, folder):
    """One line: did the run reach the file's pass mark, or why no mark applies to it. folder: the
    run's, where its eval.jsonl is."""
    changed = [k for k, v in vars(defaults).items()
               if k not in FREE_FLAGS and getattr(args, k, v) != v]
    if name not in PASS_MARK or changed:
        why = f"it was run with --{', --'.join(changed)}" if changed else f"{name}.py has none"
        return f"PS2: no pass mark for this run ({why}); the marks are for the defaults"
    accuracy = final_accuracy(folder)
    if accuracy is None:
        return "PS2: no pass mark for this run (its eval.jsonl has no evaluation after training)"
    start, end = accuracy
    mark = PASS_MARK[name]
    return (f"PS2 {name}.py: held-out accuracy {start:.3f} -> {end:.3f}: "
            + (f"passes (the mark is {mark})" if end >= mark else
               f"does not pass (the mark is {mark}): run `python -m exercises.check`, then "
               "compare with --solution"))


if __name__ == "__main__":
    main()
