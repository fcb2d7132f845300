"""Arguments: the options every algorithm file shares (`TrainArgs`; its data options, `DataArgs`,
eval.py's too), `--help` from the docstring under each field (CleanRL's style), `parse_args`, which
hands a seed's command line to common/run/seed_flags.py, and the learning-rate schedule.

One hyperparameter has one name here (docs/README.md, "Vocabulary"). Where a seed calls it something
else, that name is an alias (common/run/seed_flags.py), never a second field.
"""

import argparse
import ast
import inspect
import math
import os
import sys
import textwrap
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Literal, Optional

from common.errors import leave_together, on_every_rank, report_user_errors


@dataclass
class DataArgs:
    """The data options: which problems, how a prompt puts them, and how a response is rewarded.
    The training files (`TrainArgs`) and eval.py (its `Args`) both take them, so an option means
    the same in both, and common/env/math_env.py makes them into envs for both."""

    dataset_name: str = "arithmetic"
    """task: arithmetic, countdown (generated), gsm8k, math, a MATH subject (prealgebra...), or a
    data file or hub dataset id"""
    dataset_path: Optional[str] = None
    """the problems to train on (eval.py: to evaluate): a .jsonl/.json/.parquet file or a hub
    dataset id (fields: data/README.md; default: the task's own)"""
    question_key: Optional[str] = None
    """field of the data rows that holds the question (default: the task's usual names)"""
    answer_key: Optional[str] = None
    """field of the data rows that holds the gold answer (default: the task's usual names)"""
    difficulty: str = "1-2"
    """arithmetic: level 1..6, a range '1-2' or 'mixed' (1: 2-digit addition ... 5: word
    problems; 6: word problems with 3-digit numbers, for tools.py; mixed: 1-5)"""
    levels: Optional[str] = None
    """math: keep these MATH levels only, e.g. '1-3' or '4,5' (default: all)"""
    template: Literal["chat", "plain"] = "chat"
    """'chat' for instruct models, 'plain' for base models"""
    chat_template_kwargs: Optional[str] = None
    """options the chat template reads, a JSON object (TRL's name), e.g. '{"enable_thinking":
    true}' for Qwen3 (docs/thinking.md)"""
    system_prompt: Optional[str] = None
    """system prompt text (default: the task's own)"""
    num_few_shot: int = 1
    """worked examples put in each prompt (one shows the answer format the verifier needs)"""
    reward_fn: Optional[list[str]] = None
    """your own reward function(s) in TRL's convention, f(completions, **row_fields) -> floats:
    file.py:name or module:name. Your code, run in this process (docs/your_own_task.md)"""
    reward_weights: Optional[list[float]] = None
    """weights of the verifier and then each --reward_fn (default: 1 each; a verifier weight 0
    trains on your rewards alone)"""


@dataclass
class TrainArgs(DataArgs):
    """The data (`DataArgs`), IO and infrastructure options every algorithm file shares. What a
    reader tunes (learning rate, schedule, clipping, updates, micro-batch size, seed, sampling, the
    algorithm's own coefficients) sits in each file's own Args, where the file shows it."""

    # ---- model and held-out data
    model_name_or_path: str = "SmolLM2-135M-Instruct"
    """policy to train: a hub id, a local folder, 'SmolLM2-135M-Instruct' (offline default) or
    'tiny-random'"""
    eval_dataset_path: Optional[str] = None
    """held-out data, the way --dataset_path is given (default: the task's test split; with a
    training file, a held-out fifth of it)"""
    # ---- the run
    output_dir: Optional[str] = None
    """where metrics.jsonl, eval.jsonl, samples.jsonl and checkpoint-N/ go (default: a new
    runs/<file>/<date>_<time> each run, which runs/<file>/latest links to; with --resume, the one
    it links to)"""
    # ---- evaluation, logging, checkpoints
    eval_interval: int = 0
    """evaluate every this many updates (0: only at the start and the end)"""
    eval_on_start: bool = True
    """evaluate before the first update (--no_eval_on_start: skip it)"""
    num_eval_problems: int = 200
    """held-out problems per evaluation and set (greedy pass@1)"""
    eval_datasets: Optional[list[str]] = None
    """held-out sets to evaluate, each on its own: a task or benchmark (gsm8k, math500, aime24...),
    a data file, a hub dataset id, or TASK=FILE (a file read as that task: aime24=aime.jsonl), e.g.
    --eval_datasets arithmetic gsm8k=gsm8k_test.jsonl. The training task's name stands for its own
    held-out set; every set at this run's response budget. Logged per set as
    eval/<set>/greedy_pass@1 (default: the training task's held-out set alone)"""
    eval_samples: int = 0
    """k: also sample k responses per held-out problem at --eval_temperature, and log avg@k (mean
    accuracy of the samples), pass@k and maj@k per set. Costs up to k times the greedy evaluation's
    time (GSM8K on a CPU, k = 4: 3.5 times; 0: greedy pass@1 only)"""
    eval_temperature: float = 0.6
    """sampling temperature of --eval_samples (0.6, as DeepSeek-R1's and Qwen's reports sample)"""
    eval_batch_size: int = 64
    """prompts per generate call in evaluation"""
    log_interval: int = 5
    """write decoded samples with their rewards every this many updates"""
    save_interval: int = 0
    """checkpoint every this many updates (0: only at the end)"""
    resume: bool = False
    """continue from the latest complete checkpoint-N in output_dir"""
    # ---- hardware
    bf16: bool = False
    """bfloat16 autocast for forwards (weights and optimizer state stay fp32, unless
    --offload_optimizer)"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass to save memory"""
    compile: bool = False
    """sample with a static KV cache and a torch.compile'd decode step, replayed as CUDA graphs on a
    GPU, where an eager step is ~1,700 kernel launches: on an H200, 0.19 s a rollout against 0.71
    (SmolLM2, 32 rows) for ~64 s of compiling a run; it pays from about 7,000 decode steps a run,
    max_steps x max_new_tokens (docs/gpu.md). On a CPU it does not pay"""
    cuda_graphs: bool = True
    """on a GPU, each decode step over a static KV cache replays as one CUDA graph, captured at a
    rollout's first step in milliseconds (--no_cuda_graphs: one kernel launch per op, as
    model.generate does; docs/gpu.md). --compile goes further, at a minute of compiling"""
    plain: bool = False
    """the plain path, for reading and stepping through: the sampler's plain Decoder and
    token_logprobs' own lines instead of their speedups (docs/reading.md), the same tokens and
    losses up to float rounding, several times slower"""
    fsdp: bool = False
    """shard trained weights, gradients and AdamW states over the ranks (FSDP2; under torchrun)"""
    offload_optimizer: bool = False
    """ZeRO-Offload: the policy's trained weights and gradients in bf16 on the device, its fp32
    master weights and AdamW moments in the CPU's memory, where the step runs (needs --bf16; not
    with --fsdp). A 1.5B update then needs ~6 GB of a GPU before activations, not 24, for a slower
    step (docs/gpu.md)"""
    lora_r: int = 0
    """LoRA rank: train adapters on frozen weights (needs peft); 0: full fine-tuning"""
    lora_alpha: Optional[int] = None
    """LoRA scale numerator: adapters are scaled by lora_alpha / lora_r, at most 64 (None: 2 *
    lora_r)"""
    lora_target_modules: str = "all-linear"
    """modules that get adapters: 'all-linear' or a comma list such as 'q_proj,v_proj'"""
    merge_lora: bool = False
    """also write each checkpoint's adapter merged into the base model, in checkpoint-N/merged"""
    track: bool = False
    """log to Weights & Biases"""
    wandb_project: str = "mathrl"
    """wandb project name"""



def algorithm_of(args):
    """The file whose Args `args` are, without .py: "grpo" for grpo.py's (run as __main__ too)."""
    return Path(inspect.getfile(type(args))).stem


def runs_of(args):
    """Where a file's runs go when --output_dir is not given, each in a folder of its own:
    runs/grpo for grpo.py, and so on (common/run/checkpoints.py's run_folder)."""
    return Path("runs") / algorithm_of(args)


# ------------------------------------------------------------------------------------------------
# The range of every number option, checked before any model loads (common/run/checks.py) and shown
# by --help
# ------------------------------------------------------------------------------------------------
# Sizes that must be >= 1, and counts that may be 0 (0: never, or none).
POSITIVE = ("max_steps", "max_new_tokens", "max_turns", "micro_batch_size", "eval_batch_size",
            "log_interval",
            "num_prompts", "num_generations", "num_ppo_epochs", "num_mini_batches", "num_envs",
            "num_steps", "max_episode_steps", "eval_max_new_tokens", "max_sampling_rounds",
            "critic_hidden_size", "max_thinking_tokens")
NON_NEGATIVE = ("num_eval_problems", "eval_samples", "eval_interval", "save_interval",
                "warmup_steps",
                "num_few_shot", "lora_r", "critic_num_layers", "ref_model_sync_steps",
                "max_staleness", "overlong_buffer_len")
# The most a size that memory holds may be: far above any run that fits one machine, far below a
# typo such as --num_prompts 1000000000000, which would fill 8 GB in a minute before anything
# failed.
MOST = {"num_prompts": 2**16, "num_envs": 2**16, "num_generations": 4096, "num_steps": 2**16,
        "max_new_tokens": 2**17, "eval_max_new_tokens": 2**17, "max_episode_steps": 4096,
        "micro_batch_size": 2**16, "eval_batch_size": 4096, "max_sampling_rounds": 64,
        "lora_r": 4096, "critic_hidden_size": 16384, "critic_num_layers": 16,
        "overlong_buffer_len": 2**17, "eval_samples": 4096}
# What one rank's rollout holds at once, in sequences and in sampled tokens: the sampler decodes
# every row in one batch (16,384 rows of SmolLM2's 49,152-word vocabulary are 3.2 GB of logits a
# step), and the update keeps each token's log-probs.
MOST_ROWS, MOST_TOKENS = 2**14, 2**24
# The most lora_alpha / lora_r may be (the default scales by 2): --lora_alpha 1e12 at --lora_r 4
# would merge into weights of 2e8 within two updates, and the run would exit 0.
MOST_LORA_SCALE = 64
# The range of each option, in whichever file defines it: (low, high, brackets), "(" leaving the
# end out and "[" keeping it in. NaN lies outside every range, and a real-valued option that no
# range names must still be finite (check_ranges). A value outside them does not fail later: a
# negative --max_grad_norm reverses every update while the logged norm looks normal, a negative
# --epsilon clips every token, --learning_rate 1e30 writes weights of 1e30 and exits 0.
RANGES = {
    # a learning rate of 0 is allowed: the tests use it to read gradients without moving weights.
    # AdamW moves every weight by about the learning rate each step, and these models' weights are
    # at most about 1: at 1e30 they would be 1e30 after two updates, and the run would exit 0 (the
    # largest rate the tests use is 0.05).
    "learning_rate": (0, 1, "[]"), "critic_learning_rate": (0, 1, "[]"),
    "max_grad_norm": (0, math.inf, "[]"),  # 0: no clipping, as in transformers' Trainer
    "warmup_ratio": (0, 1, "[]"), "num_train_epochs": (0, math.inf, "()"),
    "epsilon": (0, math.inf, "()"), "epsilon_high": (0, math.inf, "()"),
    "beta": (0, math.inf, "[)"),
    "cliprange_value": (0, math.inf, "()"), "vf_coef": (0, math.inf, "[)"),
    # 0 is greedy: with --eval_samples, k copies of the greedy response (refused in checks.py)
    "eval_temperature": (0, math.inf, "[)"),
    "gamma": (0, 1, "[]"), "gae_lambda": (0, 1, "[]"), "entropy_coef": (0, math.inf, "[)"),
    "target_kl": (0, math.inf, "[)"), "skip_kl": (0, math.inf, "[)"),
    "huber_delta": (0, math.inf, "()"), "missing_eos_penalty": (0, math.inf, "[)"),
    "reward_weight": (0, math.inf, "[)"), "jsd_beta": (0, 1, "[]"),
    "overlong_penalty_factor": (0, math.inf, "[)"),
    # async_grpo.py: a cap below 1 would weigh down the tokens of an on-policy batch too, and
    # IcePop's bounds hold 1 between them (its own are 0.5 and 5)
    "is_cap": (1, math.inf, "[)"), "icepop_low": (0, 1, "(]"), "icepop_high": (1, math.inf, "[)"),
    # 0 would scale every adapter to nothing, and the run would train nothing
    "lora_alpha": (1, math.inf, "[)"),
    # numpy's range; --seed 1e30 overflowed torch.manual_seed, with a traceback
    "seed": (0, 2**32 - 1, "[]"),
    **{name: (1, MOST.get(name, math.inf), "[]" if name in MOST else "[)") for name in POSITIVE},
    **{name: (0, MOST.get(name, math.inf), "[]" if name in MOST else "[)")
       for name in NON_NEGATIVE},
}


def in_range(value, low, high, brackets):
    above = value >= low if brackets[0] == "[" else value > low
    below = value <= high if brackets[1] == "]" else value < high
    return above and below  # both False for NaN


def range_text(low, high, brackets):
    if high == math.inf:
        return f"{'>=' if brackets[0] == '[' else '>'} {low}"
    return f"in {brackets[0]}{low}, {high}{brackets[1]}"


# ------------------------------------------------------------------------------------------------
# --help from the docstrings
# ------------------------------------------------------------------------------------------------
def field_docs(cls):
    """{field: the docstring under it} for a dataclass and its bases."""
    docs = {}
    for klass in reversed(cls.__mro__):
        if not is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, doc in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(doc, ast.Expr)
                    and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
                docs[node.target.id] = " ".join(doc.value.value.split())
    return docs


def make_parser(args_class):
    """HfArgumentParser over args_class, with each field's docstring as its help, its default said
    once (a docstring that says its own default, "(default: all)", is not given a second) and its
    range; the --no_X switch of an option whose default is on says only what it turns off."""
    from transformers import HfArgumentParser

    parser = HfArgumentParser(args_class)
    # HfArgumentParser's formatter appends "(default: ...)" to a help that has none: here the
    # loop below says each default, once
    parser.formatter_class = argparse.HelpFormatter
    docs = field_docs(args_class)
    for action in parser._actions:
        if action.dest not in docs:
            continue
        if action.option_strings[0] == f"--no_{action.dest}":
            action.help = f"turn --{action.dest} off"
            continue
        said = [] if "default:" in docs[action.dest] else ["default: %(default)s"]
        if action.dest in RANGES:
            said.append(range_text(*RANGES[action.dest]))
        action.help = docs[action.dest].replace("%", "%%")
        if said:
            action.help += f" ({'; '.join(said)})"
    return parser


# ------------------------------------------------------------------------------------------------
# The parser
# ------------------------------------------------------------------------------------------------
def parse_args(args_class, argv=None):
    """Command line -> an args_class instance. A flag that is not the file's own is a seed's name,
    read by the seeds' dialect (common/run/seed_flags.py): a start with the file's own flags alone
    enters none of it."""
    from transformers import HfArgumentParser

    report_user_errors()  # from here on a user error prints as one line, without a traceback
    argv = list(sys.argv[1:] if argv is None else argv)
    # the docstrings become --help's text only when it is asked for
    asked = any(word == "--help" or word.startswith("-h") for word in argv)
    parser = make_parser(args_class) if asked else HfArgumentParser(args_class)
    native, values, lines = [], {}, []
    for word in argv:  # --name=value as two words, as the dialect reads it
        flag, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
        native += [flag, value] if eq else [flag]
    own = parser._option_string_actions
    flags = {"--" + word[2:].replace("-", "_") for word in native if word.startswith("--")}
    if "RANK" in os.environ:  # under torchrun every rank reads the same line and fails alike
        parser.error = lambda message: _parse_error(parser, message)
    with on_every_rank():
        # a seed's flag, or one option under two of its names (--X and --no_X): the dialect says
        if not flags <= own.keys() or len({own[flag].dest for flag in flags}) < len(flags):
            from common.run.seed_flags import translate

            native, values, lines = translate(Path(inspect.getfile(args_class)).stem, argv,
                                              parser)
        args = expand_home(replace(parser.parse_args_into_dataclasses(args=native)[0], **values))
    if lines and os.environ.get("RANK", "0") == "0":
        print("\n".join(lines), flush=True)
    return args


def _parse_error(parser, message):
    """argparse's error (usage, then the message; status 2), said by rank 0 alone."""
    if os.environ["RANK"] == "0":
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {message}", file=sys.stderr, flush=True)
    leave_together(2)


# Options that name a file or folder, where ~ is the home folder. A shell makes it so for a bare
# word, but not after "=" (--output_dir=~/runs) nor inside quotes, and a folder named ~ appeared.
PATH_OPTIONS = ("dataset_name", "reward_fn", "output", "responses")  # and every *_path, *_dir


def expand_home(args):
    """args with a leading ~ (or ~user) of every path option made the home folder's path."""
    changes = {}
    for name in (f.name for f in fields(args)):
        value = getattr(args, name)
        if value is None or not (name.endswith(("_path", "_dir")) or name in PATH_OPTIONS):
            continue
        expanded = ([os.path.expanduser(v) for v in value] if isinstance(value, list)
                    else os.path.expanduser(value))
        if expanded != value:
            changes[name] = expanded
    return replace(args, **changes)


def lr_at(step, args, base=None):
    """The learning rate of update `step` (0-based): linear warmup, then --lr_scheduler
    (SCHEDULES). A pure function of the step, so a resumed run continues the schedule where it
    stopped. base: another peak rate on the same schedule (a critic's)."""
    lr, warmup = args.learning_rate if base is None else base, args.warmup_steps
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, args.max_steps - warmup)  # 0 to 1 after the warmup
    return SCHEDULES[args.lr_scheduler](lr, progress)


# the rate of a peak rate lr at `progress` (0 to 1) after the warmup: constant, down to 0 at
# max_steps (linear, cosine), or to 1e-7 (polynomial of power 1, as transformers and oat define it)
SCHEDULES = {
    "constant": lambda lr, progress: lr,
    "linear": lambda lr, progress: lr * (1.0 - progress),
    "cosine": lambda lr, progress: lr * 0.5 * (1.0 + math.cos(math.pi * progress)),
    "polynomial": lambda lr, progress: (lr - 1e-7) * (1.0 - progress) + 1e-7 if lr > 1e-7 else lr,
}


def schedule(args, num_problems, problems_per_update):
    """(max_steps, warmup_steps) once the data is read: --num_train_epochs and --warmup_ratio,
    when given, set them."""
    max_steps, warmup_steps = args.max_steps, args.warmup_steps
    if args.num_train_epochs is not None:
        max_steps = max(1, math.ceil(args.num_train_epochs * num_problems / problems_per_update))
    if args.warmup_ratio is not None:
        warmup_steps = math.ceil(args.warmup_ratio * max_steps)
    return max_steps, warmup_steps
