"""Run safety: every option error before any model loads, each naming its fix; rewards that are
not finite numbers; optimizer steps whose loss or gradient is NaN or inf."""

import importlib.util
import math
import os
import tempfile
from dataclasses import MISSING, fields
from pathlib import Path

import torch
import torch.distributed as dist

from common.run.args import (
    MOST_LORA_SCALE,
    MOST_ROWS,
    MOST_TOKENS,
    RANGES,
    algorithm_of,
    in_range,
    range_text,
    runs_of,
)
from common.distributed import collective_device, collective_group, print0, world_size
from common.run.logger import kind_of
from common.errors import NonFiniteError, PackageError, PathError, UsageError
from common.models.loading import check_model_name
from common.models.templates import read_template_kwargs


# The options that another option turns off, which every file shares: (the option; whether this
# run reads it, from the args `a`; the option that would). check_unused refuses one given another
# value than its default where the run does not read it. --eval_temperature's row is in
# EVAL_CHECKS below, which check_eval_sets also runs alone; a file's own (dapo.py's overlong and
# sampling options, distill.py's, async_grpo.py's, tools.py's) are in its check_args; eval.py's
# in its own table; dev/notes/reliability.md lists them all.
READ_ONLY_WITH = [
    # a KL to a reference, which beta > 0 loads
    ("kl_estimator", lambda a: a.beta > 0, "--beta > 0"),
    ("kl_penalty", lambda a: a.beta > 0, "--beta > 0"),
    # the plain Decoder is never compiled nor captured; --compile's graphs replace the captured step
    ("compile", lambda a: not a.plain, "the default path (the plain Decoder of --plain is never "
     "compiled)"),
    ("cuda_graphs", lambda a: not a.plain and not a.compile, "the default path without --compile "
     "(--plain decodes eagerly, --compile replays its own graphs)"),
    ("lora_target_modules", lambda a: a.lora_r > 0, "--lora_r above 0 (LoRA adapters)"),
    ("wandb_project", lambda a: a.track, "--track (Weights & Biases)"),
    ("eval_dataset_path", lambda a: a.num_eval_problems > 0, "--num_eval_problems above 0"),
    ("eval_interval", lambda a: a.num_eval_problems > 0, "--num_eval_problems above 0"),
    ("eval_batch_size", lambda a: a.num_eval_problems > 0, "--num_eval_problems above 0"),
]

# The checks every algorithm file shares, in the order they run, before any model loads. A row:
# (the option a file must have for the row to apply, or None: every file; whether something is
# wrong, from the args `a` and the number of ranks that train `w`; the error; its message, which
# names the fix: a str.format text over a and w, or a function of them). A row with no message is
# a check that computes its own and raises it.
COMMON_CHECKS = [
    (None, lambda a, w: check_ranges(a), None, None),
    (None, lambda a, w: check_rollout_size(a, w), None, None),
    ("temperature", lambda a, w: not a.temperature > 0 or not 0 < a.top_p <= 1, UsageError,
     "--temperature {a.temperature} --top_p {a.top_p}: training samples need a temperature > 0 "
     "(log-probs are divided by it) and top_p in (0, 1]."),
    ("num_prompts", lambda a, w: a.num_prompts % w, UsageError,
     lambda a, w: f"--num_prompts {a.num_prompts} must be divisible by the number of processes "
                  f"that train ({w}); try --num_prompts {w * max(1, a.num_prompts // w)}."),
    ("num_prompts", lambda a, w: rows_a_rank(a, w) % getattr(a, "num_mini_batches", 1), UsageError,
     lambda a, w: f"each rank gets {rows_a_rank(a, w)} sequences per update (num_prompts / "
                  f"processes x num_generations), which --num_mini_batches {a.num_mini_batches} "
                  f"must divide; try --num_mini_batches "
                  f"{math.gcd(rows_a_rank(a, w), a.num_mini_batches)}."),
    (None, lambda a, w: check_output_dir(a.output_dir or runs_of(a)), None, None),
    (None, lambda a, w: check_unused(a, [(name, read(a), needs) for name, read, needs
                                         in READ_ONLY_WITH if hasattr(a, name)]), None, None),
    (None, lambda a, w: a.lora_r and importlib.util.find_spec("peft") is None, PackageError,
     "--lora_r needs peft: pip install peft (or --lora_r 0 for full fine-tuning)"),
    (None, lambda a, w: a.lora_alpha is not None and not a.lora_r, UsageError,
     "--lora_alpha scales LoRA adapters, but --lora_r is 0 (full fine-tuning): drop --lora_alpha "
     "or set --lora_r."),
    (None, lambda a, w: a.lora_alpha is not None and a.lora_alpha / a.lora_r > MOST_LORA_SCALE,
     UsageError,
     lambda a, w: f"--lora_alpha {a.lora_alpha}: adapters are scaled by lora_alpha / lora_r = "
                  f"{a.lora_alpha / a.lora_r:g}, which must be at most {MOST_LORA_SCALE} (the "
                  f"default, 2 * lora_r, scales by 2); pass --lora_alpha "
                  f"{MOST_LORA_SCALE * a.lora_r} or less."),
    (None, lambda a, w: a.merge_lora and not a.lora_r, UsageError,
     "--merge_lora merges LoRA adapters, but --lora_r is 0 (full fine-tuning saves whole models "
     "already): drop --merge_lora or set --lora_r."),
    (None, lambda a, w: a.fsdp and "RANK" not in os.environ, UsageError,
     "--fsdp shards the models over the processes that torchrun starts: run `torchrun "
     "--nproc_per_node N <file>.py --fsdp ...` (N = 1 works too)."),
    (None, lambda a, w: a.compile and a.fsdp, UsageError,
     "--compile decodes with a whole, compiled model; under --fsdp the weights are gathered from "
     "shards for each rollout: drop one of the two."),
    (None, lambda a, w: a.offload_optimizer and not a.bf16, UsageError,
     "--offload_optimizer keeps the trained weights in bf16 on the device, so the forwards run in "
     "bf16: add --bf16."),
    (None, lambda a, w: a.offload_optimizer and a.fsdp, UsageError,
     "--offload_optimizer keeps a whole fp32 copy of the weights on each rank's CPU; --fsdp shards "
     "them over the ranks instead: drop one of the two."),
    (None, lambda a, w: a.track and importlib.util.find_spec("wandb") is None, PackageError,
     "--track logs to Weights & Biases, which is not installed: pip install -r "
     "requirements-extra.txt (wandb and tensorboard), or drop --track (metrics.jsonl is written "
     "anyway, TensorBoard logs when installed)."),
    (None, lambda a, w: check_model_name(a.model_name_or_path), None, None),
    # raises its own error where --chat_template_kwargs is no JSON object (else a dict: not None)
    (None, lambda a, w: a.chat_template_kwargs is not None
     and read_template_kwargs(a.chat_template_kwargs, a.template) is None, None, None),
    ("max_thinking_tokens", lambda a, w: (a.max_thinking_tokens or 0) >= a.max_new_tokens,
     UsageError,
     lambda a, w: f"--max_thinking_tokens {a.max_thinking_tokens} must be below --max_new_tokens "
                  f"{a.max_new_tokens}, which holds the thinking, its close and the answer "
                  f"after it: raise --max_new_tokens (e.g. to {a.max_thinking_tokens + 256}) or "
                  "lower the budget."),
]
# --eval_datasets and --eval_samples where the evaluation can do them: held-out problems to
# evaluate, and whole responses sampled by `generate` (a stepwise evaluation plays episodes, and
# tools.py's answers with its tools, greedily, on prompts that show the tools). The last of the
# shared checks.
EVAL_CHECKS = [
    # --eval_temperature 0 asks for the greedy evaluation, which is what runs without samples
    ("eval_samples", lambda a, w: check_unused(a, [("eval_temperature", a.eval_samples > 0
                                                    or a.eval_temperature == 0,
                                                    "--eval_samples above 0 (a sampled "
                                                    "evaluation)")]), None, None),
    (None, lambda a, w: a.eval_samples and a.eval_temperature == 0, UsageError,
     "--eval_samples {a.eval_samples} with --eval_temperature 0 draws {a.eval_samples} copies of "
     "the greedy response: sample with e.g. --eval_temperature 0.6, or drop --eval_samples."),
    (None, lambda a, w: (a.eval_datasets or a.eval_samples) and not a.num_eval_problems,
     UsageError,
     "--eval_datasets and --eval_samples evaluate held-out problems, but --num_eval_problems is 0: "
     "drop them or give --num_eval_problems N."),
    (None, lambda a, w: evaluates_alone(a) and (
        a.eval_samples or any(name != a.dataset_name for name in a.eval_datasets or ())),
     UsageError,
     lambda a, w: f"{evaluates_alone(a)}, greedily, on its own held-out set: drop --eval_samples "
                  "and --eval_datasets, and evaluate a checkpoint on other sets with eval.py "
                  "(--eval_datasets A B --num_generations k --temperature 0.6)."),
]
COMMON_CHECKS += EVAL_CHECKS


def check_common_args(args, world_size=1, rows=COMMON_CHECKS):
    """The checks every algorithm file shares (COMMON_CHECKS), before any model loads: the first
    row that applies and finds something wrong stops the run with its message."""
    for option, wrong, error, message in rows:
        if (option is None or hasattr(args, option)) and wrong(args, world_size):
            raise error(message(args, world_size) if callable(message)
                        else message.format(a=args, w=world_size))


def check_eval_sets(args):
    """The evaluation's rows (EVAL_CHECKS) alone."""
    check_common_args(args, rows=EVAL_CHECKS)


def rows_a_rank(args, world_size):
    """The sequences one rank samples in an update: its share of the prompts, num_generations
    each."""
    return args.num_prompts // world_size * getattr(args, "num_generations", 1)  # sft: 1


def evaluates_alone(args):
    """What evaluates only its own held-out set, greedily: tools.py (with its tools) and
    reinforce_stepwise.py (episodes), or None."""
    return {"tools": "tools.py evaluates with its tools",
            "reinforce_stepwise": "reinforce_stepwise.py evaluates stepwise episodes"}.get(
        algorithm_of(args))


def check_options(args, check_args, world_size=1, samplers=0):
    """Every option error before any model loads, each naming its fix: the checks every file
    shares, then the file's own check_args(args, world_size). samplers: the last ranks under
    torchrun, which only sample (async_grpo.py's one), so the shared checks split the batch over
    the others, the ranks that train."""
    check_common_args(args, trainers(world_size, samplers))
    check_args(args, world_size)


def check_ranges(args):
    """Every number option of `args` within its range (RANGES), and every real-valued one a finite
    number, whether or not a range names it: the check covers an option added later too
    (--temperature inf would sample from a flat distribution, and the run would exit 0). eval.py's
    options too."""
    for name, (low, high, brackets) in RANGES.items():
        value = getattr(args, name, None)
        if value is not None and not in_range(value, low, high, brackets):
            raise UsageError(f"--{name} {value}: must be {range_text(low, high, brackets)} "
                             f"{default_text(defaults_of(args)[name])}.")
    for f in fields(args):
        value = getattr(args, f.name)
        numbers = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in numbers) \
                and f.name not in RANGES:  # those in RANGES passed, inf allowed (max_grad_norm)
            raise _not_finite(args, f.name, value)


def _not_finite(args, name, value):
    """check_ranges' error, for an option outside RANGES that holds NaN or inf."""
    shown = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else value
    return UsageError(f"--{name} {shown}: must be a finite number "
                      f"{default_text(defaults_of(args)[name])}.")


def defaults_of(args):
    """{option: its default} of an options dataclass."""
    return {f.name: f.default_factory() if f.default is MISSING else f.default
            for f in fields(args)}


def default_text(default):
    return "(leave it out for its default)" if default is None else f"(the default is {default})"


def check_unused(args, rules):
    """Stop when an option was set (another value than its default) that the run would not read,
    because another option turns off what reads it: a user who passes --jsd_beta 0.5 under the
    sampled form expects a JSD and would get the reverse KL without a word. rules: (name, read,
    needs) each, `read` whether this run reads args.<name>, `needs` the option that would."""
    defaults = defaults_of(args)
    for name, read, needs in rules:
        value = getattr(args, name)
        if not read and value != defaults[name]:
            given = (f"--{name}" if value else f"--no_{name}") if isinstance(value, bool) \
                else f"--{name} {value}"
            raise UsageError(f"{given} changes nothing in this run: it is read only with "
                             f"{needs}. Drop it, or pass that.")


def trainers(world_size, samplers=0):
    """The ranks that train, data-parallel: all but the `samplers` last under torchrun; one
    process both samples and trains."""
    return world_size - samplers if world_size > 1 else 1


def check_rollout_size(args, world_size):
    """What one rank's rollout holds at once fits a machine (MOST_ROWS sequences, MOST_TOKENS
    sampled tokens), or the fix, before any memory is taken: each size may be within its own
    bound and their product still far beyond any memory."""
    if hasattr(args, "num_prompts"):
        G = getattr(args, "num_generations", 1)  # sft.py: one solution a problem
        rows = -(-args.num_prompts // world_size) * G
        sizes = f"--num_prompts {args.num_prompts} x --num_generations {G}"
    else:  # appo, tppo: every episode's steps of an update
        rows = -(-args.num_envs // world_size) * args.num_steps
        sizes = f"--num_envs {args.num_envs} x --num_steps {args.num_steps}"
    tokens = rows * (args.max_new_tokens or 1)  # appo, tppo: None is a task's own, at most 96
    if rows > MOST_ROWS or tokens > MOST_TOKENS:
        raise _too_large(sizes, world_size, rows, tokens, args.max_new_tokens)


def _too_large(sizes, world_size, rows, tokens, max_new_tokens):
    """check_rollout_size's error, for a rollout beyond MOST_ROWS or MOST_TOKENS."""
    return UsageError(f"{sizes} over {world_size} process(es) is {rows} sequences a rank, "
                      f"{tokens} new tokens with --max_new_tokens {max_new_tokens}: one "
                      f"rank's rollout holds at most {MOST_ROWS} sequences and {MOST_TOKENS} "
                      "tokens, so lower them, or run on more processes.")


def check_output_dir(path, flag="--output_dir"):
    """Write a probe file where the output will go (the folder, or its nearest existing parent), so
    that an unwritable path fails before hours of work rather than at the first save. Nothing is
    left behind."""
    path = Path(path).expanduser()
    # the first of the path and its parents that is there: lexists, so that a link to nothing
    # (which mkdir would fail on, with a traceback) is found and said
    existing = next(p for p in [path, *path.parents] if os.path.lexists(p))
    if not existing.is_dir():
        raise _no_folder(flag, path, existing)
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as e:
        raise PathError(f"{flag} {path} can't be written ({e.strerror or e} in {existing}): "
                        "pass a folder you can write to.") from None


def _no_folder(flag, path, existing):
    """check_output_dir's error, for an `existing` that is no folder (or a link to nothing)."""
    if existing.is_symlink() and not existing.exists():
        return PathError(f"{flag} {path}: {existing} is a symbolic link to "
                         f"{os.readlink(existing)}, which does not exist: make that folder, "
                         "remove the link, or pass another path.")
    return PathError(f"{flag} {path}: {existing} is {kind_of(existing.resolve())}, not a "
                     "folder; pass a folder (it is created if missing).")


def check_rewards(rewards, step, task, problems):
    """A NaN or inf reward would turn every weight into NaN through the update: stop before it,
    naming the sample and its problem. rewards: [N] or [N, T]; problems: the problem of each group
    of rows (row k's is problems[k // (N / len(problems))]), or of each entry (problems[k][t])."""
    if not torch.isfinite(rewards).all():
        _refuse_rewards(rewards, step, task, problems)


def _refuse_rewards(rewards, step, task, problems):
    where = tuple((~torch.isfinite(rewards)).nonzero()[0].tolist())
    k = where[0]
    problem = (problems[k][where[1]] if isinstance(problems[0], (list, tuple))
               else problems[k // (len(rewards) // len(problems))])
    raise NonFiniteError(
        f"reward {rewards[where].item()} for sample {k}"
        f"{f', step {where[1]}' if len(where) > 1 else ''} (problem {problem}) of task {task!r} "
        f"in update {step}: rewards must be finite numbers. The run stops before this update, so "
        "no checkpoint holds it; fix the reward function (or PRM) that produced it.")


class StepGuard:
    """`if guard.ok(loss, grad_norm): optimizer.step()`: a step whose loss or gradient norm is NaN
    or inf is skipped on every rank alike, and `patience` skips in a row stop the run."""

    def __init__(self, patience=3):
        self.patience, self.in_a_row, self.skipped = patience, 0, 0

    def ok(self, *values):
        bad = torch.tensor([0.0 if all(math.isfinite(float(v)) for v in values) else 1.0])
        # one rank's NaN skips the step everywhere
        if world_size() > 1:
            bad = bad.to(collective_device())
            dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=collective_group())
        if bad.item() == 0:
            self.in_a_row = 0
            return True
        return self._skip(values)

    def _skip(self, values):
        """Count a skipped step, say so, and stop the run at `patience` in a row. -> False"""
        self.in_a_row += 1
        self.skipped += 1
        print0("non-finite loss or gradient norm "
               f"({', '.join(f'{float(v):.4g}' for v in values)}): optimizer step "
               f"skipped ({self.in_a_row} in a row)")
        if self.in_a_row >= self.patience:
            raise NonFiniteError(
                f"{self.in_a_row} optimizer steps in a row had a NaN or inf loss or gradient norm: "
                "the run stops "
                "here. Lower --learning_rate, check the rewards, or try without --bf16; --resume "
                "continues from "
                f"the last checkpoint, which holds finite weights.")
        return False

    def pop(self):
        """Steps skipped since the last call (the `skipped_steps` metric of one update)."""
        skipped, self.skipped = self.skipped, 0
        return skipped
