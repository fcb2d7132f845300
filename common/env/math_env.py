"""The environment: `MathEnv`, a gym-like env over a task's problems, and how options build one.

    env = make_env("gsm8k", split="train")         # or arithmetic, countdown, math
    obs = env.reset()                              # chat messages (or a plain prompt string)
    obs, reward, done, info = env.step(response)   # info: correct, format_ok, pred, answer, steps
    verify("gsm8k", response, "18")                # the same grading as a pure function

The env puts a problem in a prompt (template, system prompt, few-shot examples) and grades a
response with its task's verifier and your own reward functions, in one step or one line at a
time. Where problems come from and how they are graded is common/env/tasks.py's (number answers
common/env/answers.py's, MATH answers common/env/grader.py's). Then the command line's data options
(common/run/args.py's DataArgs) made into envs: `resolve_task` reads --dataset_name (a task, a MATH
subject, a data file or a hub dataset id), `make_envs` builds a training file's envs, and eval.py
builds its one env from the same pieces.
"""

import copy
import math
import random
import re
from dataclasses import fields
from pathlib import Path

from common.errors import UsageError, on_every_rank
from common.env.reasoning import Reasoning
from common.env.rewards import call_reward_fn, load_reward_fn, weighted_sum
from common.env.tasks import (TASKS, Arithmetic, Task, detect_task, grade, is_hub_id, load_few_shot,
                          load_hub_rows, read_rows, rename_fields)

# ------------------------------------------------------------------------------------------------
# The environment

# what a task's verifier reads at a response's end, for the error of a solution it cannot read
FORMATS = {"arithmetic": "'The answer is N.'", "gsm8k": "'The answer is N.'",
           "countdown": "'<answer> EXPRESSION </answer>'", "math": "'\\boxed{ANSWER}'"}
# a GSM8K-style calculator span in a few-shot solution
CALC_ANNOTATION = re.compile(r"<<[^<>\n]*>>")


class MathEnv:
    """A gym-like env over a list of problems; single-turn (one action = one response) or
    stepwise."""

    def __init__(self, task, examples, seed, template, system_prompt, few_shot, stepwise, step_tag,
                 max_steps, reward_fn, calc_annotations, reward_funcs=(), reward_weights=None):
        self.task, self.examples, self.rng = task, examples, random.Random(seed)
        self.reward_funcs = list(reward_funcs)  # (name, function): your own rewards
        self.reward_weights = reward_weights or [1.0] * (1 + len(self.reward_funcs))
        self.reward_log = {}  # name -> the values since reward_metrics() last read them
        self.calc_annotations = calc_annotations
        self.template, self.stepwise, self.step_tag = template, stepwise, step_tag
        self.max_steps, self.reward_fn, self.few_shot = max_steps, reward_fn, few_shot
        self.system_prompt = task.system_prompt if system_prompt is None else system_prompt
        self.index, self.steps, self.done = None, [], True
        # (--dataset_name, --dataset_path) as the run reads them, for args.json: `make_envs` sets it
        self.source = None
        # the reasoning block's tags, and where thinking is expected the tokenizer that counts its
        # tokens for the think/ metrics: `read_reasoning` sets them once the tokenizer is known
        self.reasoning, self.tokenizer, self.think_log = Reasoning(), None, []

    def __len__(self):
        return len(self.examples)

    def sample_fields(self, index: int) -> dict:
        """The question and gold answer of problem `index`, for sample logs."""
        return {"question": self.examples[index]["question"],
                "answer": self.examples[index]["answer"]}

    def _solution(self, example) -> str:
        """A few-shot solution, one step per line; in stepwise mode each line carries the step tag.
        Without calc_annotations its calculator spans go: a model that has no calculator should not
        learn to call one."""
        text = example["solution"]
        text = text if self.calc_annotations else CALC_ANNOTATION.sub("", text)
        if not self.stepwise:
            return text
        return "".join(line + self.step_tag for line in text.split("\n"))

    def solutions(self, say=print) -> list[str]:
        """Every problem's worked solution as a response the verifier pays for (sft.py's targets):
        the task's own form of it (`Task.worked`: GSM8K's '#### N' said 'The answer is N.'), its
        calculator spans dropped as the few-shot examples' are. Refused in one line, naming the
        row, where a solution is missing or empty, or the verifier does not read the gold answer
        in it."""
        say(f"reading the worked solutions of {len(self.examples):,} problems")
        texts = []
        for i, example in enumerate(self.examples):
            text = self._solution({"solution": self.task.worked(example)}).strip()
            where = example.get("where", f"problem {i + 1}")
            if not text:
                raise UsageError(f"{where}: no worked solution (an empty or missing 'solution' "
                                 "field): give the rows one, or name their field with "
                                 "--solution_key.")
            # the task's verifier itself, as the reward reads it: past a reasoning block
            if grade(self.task, self.reasoning.split(text)[1] or "", example["answer"])[0] != 1.0:
                raise UsageError(
                    f"{where}: the verifier does not read the gold answer "
                    f"{example['answer']!r} in the solution's end ({text[-60:]!r}): end it as "
                    f"the task asks ({FORMATS.get(self.task.name, FORMATS['math'])}).")
            texts.append(text)
        return texts

    def prompt(self, index: int):
        """The prompt for problem `index`: chat messages or, for template="plain", one string."""
        question = self.examples[index]["question"]
        if self.template == "plain":
            parts = [self.system_prompt] if self.system_prompt else []
            parts += [f"Question: {ex['question']}\nAnswer: {self._solution(ex)}"
                      for ex in self.few_shot]
            return "\n\n".join(parts + [f"Question: {question}\nAnswer:"])
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        for ex in self.few_shot:
            messages += [{"role": "user", "content": ex["question"]},
                         {"role": "assistant", "content": self._solution(ex)}]
        return messages + [{"role": "user", "content": question}]

    def check_prompt_lengths(self, count_tokens, max_positions: int, max_new_tokens: int,
                             model: str, indices=None):
        """Refuse, naming the row, a prompt whose tokens (chat template, system prompt and few-shot
        examples included) plus max_new_tokens pass the model's max_positions: past them a model
        reads positions it never learned, and trains on what it makes of them without a word.
        count_tokens(prompts) -> their token counts, as the sampler encodes them. indices: the
        problems to check (default: all).

        A token holds at least one byte, so a prompt has at most as many tokens as the prompt
        without its question, plus the question's bytes; only the rare row whose bound passes
        the limit is tokenized, and a file of thousands of rows is checked in milliseconds."""
        budget = max_positions - max_new_tokens
        indices = range(len(self.examples)) if indices is None else indices
        # what every prompt holds besides its question (template, system prompt, few-shot
        # examples), and a few tokens of slack: BPE may cut the text around the question otherwise
        empty = copy.copy(self)
        empty.examples = [{"question": ""}]
        frame = count_tokens([empty.prompt(0)])[0] + 8
        near = [i for i in indices
                if frame + len(self.examples[i]["question"].encode("utf-8")) > budget]
        for i, tokens in zip(near, count_tokens([self.prompt(i) for i in near])):
            if tokens > budget:
                raise self._too_long(i, tokens, max_positions, max_new_tokens, model)

    def _too_long(self, i, tokens, max_positions, max_new_tokens, model):
        """check_prompt_lengths' error, for problem i, whose prompt is `tokens` tokens."""
        where = self.examples[i].get("where", f"problem {i}")
        fix = (f"lower --max_new_tokens to {max_positions - tokens} or less, or shorten the "
               "question" if tokens < max_positions else
               "shorten the question or drop the row" +
               (", or use fewer --num_few_shot examples" if self.few_shot else ""))
        return UsageError(f"{where}: the prompt is {tokens:,} tokens, which with "
                          f"--max_new_tokens {max_new_tokens} passes the {max_positions:,} "
                          f"positions of {model}: {fix}.")

    def reset(self, index: int | None = None):
        """Start an episode on problem `index` (None: drawn with the env's seeded RNG). Returns the
        prompt."""
        self.index = self.rng.randrange(len(self.examples)) if index is None else index
        self.steps, self.done = [], False
        self._prompt = self.prompt(self.index)
        return self._prompt

    def read_reasoning(self, reasoning, tokenizer=None):
        """Grade by `reasoning`'s tags (common/env/reasoning.py); with the tokenizer, also log what
        the thinking took, in tokens (`reward_metrics`' think/ keys)."""
        self.reasoning, self.tokenizer = reasoning, tokenizer

    def verify(self, response: str, index: int) -> tuple[float, dict]:
        """The task's verifier on what follows a full response's reasoning block: (reward, info)."""
        answer = self.examples[index]["answer"]
        # a block that never closed leaves no text to grade: no answer, reward 0
        reward, pred, format_ok = grade(self.task, self.reasoning.split(response)[1] or "", answer)
        return reward, {"correct": reward == 1.0, "format_ok": format_ok, "pred": pred,
                        "answer": answer, "steps": 1}

    def score(self, response: str, index: int) -> tuple[float, dict]:
        """Grade a full response to problem `index`: (reward, info)."""
        return self.score_all([response], [index])[0]

    def score_all(self, responses: list, indices: list, completion_ids=None) -> list:
        """Grade responses (response k answers problem indices[k]): [(reward, info)]. The reward is
        the task's verifier, plus each --reward_fn called once on the whole batch, weighted."""
        graded = [self.verify(response, index) for response, index in zip(responses, indices)]
        if self.tokenizer is not None:
            self._log_thinking(responses, completion_ids)
        if not self.reward_funcs:
            return graded
        return self._with_reward_funcs(graded, responses, indices, completion_ids)

    def _log_thinking(self, responses, completion_ids):
        """What each response's thinking took (`Reasoning.token_split`), for `_think_means`: from
        the sampled ids where they are given, else from the text encoded again."""
        tok = self.tokenizer
        for k, response in enumerate(responses):
            ids = (completion_ids[k] if completion_ids is not None else
                   tok(response, add_special_tokens=False)["input_ids"])
            self.think_log.append(self.reasoning.token_split(
                response, ids, lambda x: tok.decode(x, skip_special_tokens=True)))

    def _with_reward_funcs(self, graded, responses, indices, completion_ids):
        """The verifier's (reward, info) of each response, with each --reward_fn's reward added,
        weighted, and logged under its name."""
        chat = self.template == "chat"
        prompts = [self.prompt(i) for i in indices]
        completions = [[{"role": "assistant", "content": r}] if chat else r for r in responses]
        rows = [self.examples[i].get("row", self.examples[i]) for i in indices]
        columns = [[reward for reward, _ in graded]] + [
            call_reward_fn(name, fn, prompts, completions, completion_ids, rows)
            for name, fn in self.reward_funcs]
        names = ["verifier"] + [name for name, _ in self.reward_funcs]
        for name, column in zip(names, columns):
            self.reward_log.setdefault(name, []).extend(v for v in column if v is not None)
        total = weighted_sum(columns, self.reward_weights)
        return [(reward, {**info, "rewards": dict(zip(names, values))})
                for reward, (_, info), values in zip(total, graded, zip(*columns))]

    def reward_metrics(self) -> dict:
        """{"rewards/<name>/mean": ...} of the verifier and each --reward_fn over the responses
        graded since the last call (None values left out; NaN where none was graded, so that every
        update and every rank logs the same keys); {} without a --reward_fn. Where thinking is
        expected (`read_reasoning`), the thinking's too (`_think_means`)."""
        means = self._reward_means() if self.reward_funcs else {}
        return {**means, **self._think_means()} if self.tokenizer else means

    def _think_means(self) -> dict:
        """Over the responses graded since the last call: the tokens the thinking took, up to the
        block's close (think/len_mean), the share whose block never closed (think/unclosed_frac)
        and the tokens of the answer after it (think/answer_len_mean); `Reasoning.token_split`
        counts them. NaN where none was graded, as `_reward_means`."""
        log, n = self.think_log, len(self.think_log)
        out = {key: sum(row[k] for row in log) / n if n else math.nan for k, key in
               enumerate(("think/len_mean", "think/unclosed_frac", "think/answer_len_mean"))}
        log.clear()  # in place: the stepwise episodes' copies of this env share it
        return out

    def _reward_means(self) -> dict:
        """reward_metrics where there is a --reward_fn: each reward's mean, and the log emptied."""
        names = ["verifier"] + [name for name, _ in self.reward_funcs]
        out = {f"rewards/{name}/mean": sum(values) / len(values) if values else math.nan
               for name in names for values in [self.reward_log.get(name, [])]}
        self.reward_log.clear()  # in place: the stepwise episodes' copies of this env share it
        return out

    def step(self, action: str):
        """Single-turn: grade the whole response; obs is None, done is True.
        Stepwise: append one step; done when it holds a final answer or after max_steps. obs is the
        new state."""
        if self.done:
            raise RuntimeError("the episode is over (or never started): call env.reset() first")
        example = self.examples[self.index]
        if not self.stepwise:
            self.steps, self.done, obs = [action], True, None
            reward, info = self.score(action, self.index)
        else:
            tag = self.step_tag.strip()
            self.steps.append((action.replace(tag, "") if tag else action).rstrip())
            answered = bool(self.task.final_answer.search(self.steps[-1]))
            self.done = answered or len(self.steps) >= self.max_steps
            if self.done:  # the outcome verifier reads the whole solution, without step tags
                reward, info = self.score("\n".join(self.steps), self.index)
            else:
                reward, info = 0.0, {"correct": False, "format_ok": False, "pred": None,
                                     "answer": example["answer"]}
            info["cut"] = self.done and not answered  # ended by the step limit, not by an answer
            obs = self._state()
        info["steps"] = len(self.steps)
        if self.reward_fn is not None:  # process reward hook (APPO/TPPO): scores every step
            reward = float(self.reward_fn(example, list(self.steps), self.done))
        return obs, reward, self.done, info

    def _state(self):
        """The prompt plus the steps so far; chat puts them in a trailing assistant message to
        continue."""
        text = "".join(step + self.step_tag for step in self.steps)
        if self.template == "plain":
            return self._prompt + text
        return self._prompt + [{"role": "assistant", "content": text}]


# ------------------------------------------------------------------------------------------------
# The order of the problems: the same stream on every rank, and for a resumed run
# ------------------------------------------------------------------------------------------------
def problem_index(position, num_problems, seed):
    """The problem at `position` of an endless stream over the problems: a seeded permutation per
    pass. Every rank computes the same stream, and a resumed run continues where it stopped."""
    import torch  # the env reads torch here only: a grader's worker process never orders problems

    epoch, offset = divmod(position, num_problems)
    perm = torch.randperm(num_problems,
                          generator=torch.Generator().manual_seed(seed * 7919 + epoch))
    return int(perm[offset])


def prompt_indices(step, num_prompts, num_problems, seed):
    """The problems of update `step`: num_prompts consecutive positions of the stream."""
    return [problem_index(pos, num_problems, seed) for pos in range(step * num_prompts,
                                                                    (step + 1) * num_prompts)]


# ------------------------------------------------------------------------------------------------
# One env: make_env and its options

ENV_OPTIONS = {
    "template": "chat", "system_prompt": None, "num_few_shot": 0, "stepwise": False,
    "step_tag": "\n", "max_steps": 10, "reward_fn": None, "calc_annotations": False, "keys": None,
    "reward_funcs": (), "reward_weights": None,
}


def _names(benchmark: bool) -> str:
    """The tasks, or the benchmarks, by name: messages list the benchmarks apart, since they are
    evaluated only."""
    return ", ".join(name for name, cls in TASKS.items() if cls.benchmark == benchmark)


def _task(name: str) -> type[Task]:
    if name not in TASKS:
        raise _unknown_task(name)
    return TASKS[name]


def _unknown_task(name):
    """_task's error, for a name that is no task."""
    return UsageError(f"unknown task {name!r}; the tasks are {_names(False)}. For your own "
                      "data and reward, pass a file with the task whose answers it holds and "
                      "--reward_fn file.py:name (docs/your_own_task.md). The benchmarks, "
                      f"evaluated only: {_names(True)}.")


def verify(task: str, response: str, answer: str, reasoning=Reasoning()) -> float:
    """Reward in [0, 1] for a full response against a gold answer (countdown: 1.0 / 0.1 / 0.0),
    graded after its reasoning block (one that never closed leaves no text: 0). Pure."""
    return grade(_task(task), reasoning.split(response)[1] or "", answer)[0]


def make_env(task: str, split: str = "train", path=None, seed: int = 0, say=print,
             **options) -> "MathEnv":
    """Build an env over a task's problems.

    task: one of TASKS ("arithmetic", "countdown", "gsm8k", "math", and the benchmarks "aime24",
        "aime25", "amc23", "math500", "minerva_math", "olympiadbench").
    split: "train" or "test". gsm8k/math load the hub split; generated tasks use
    data/<task>_test.jsonl
        for "test" and generate `num_examples` problems from `seed` for "train", excluding test
        problems. A benchmark has only "test".
    path: a local .jsonl/.json/.parquet file to use instead (the split is then ignored).
    seed: seeds problem generation and the env's own RNG for `reset()`.
    Options:
        template="chat"      "chat": a list of {"role", "content"} messages; "plain": one string
        system_prompt=None   None = the task's default; "" = no system prompt
        num_few_shot=0       worked examples from data/few_shot_<task>.jsonl put before the question
        stepwise=False       one action = one reasoning step (a line) instead of the whole response
        step_tag="\\n"        appended after each step in stepwise mode (OpenR uses " ки\\n")
        max_steps=10         a stepwise episode ends after this many steps
        reward_fn=None       reward_fn(example, steps, done) -> float replaces the per-step reward
                             (default: the verifier on the final step, 0.0 before)
        reward_funcs=()      (name, function) pairs in TRL's convention (common/env/rewards.py),
                             added to the verifier's reward of every graded response
        reward_weights=None  the verifier's weight, then each function's (default: 1 each)
        calc_annotations=False  keep the <<expr>> calculator spans of the few-shot solutions
                             ("4 * 7 = <<4*7>>28"), for a policy that has a calculator; by default
                             they are removed
        difficulty="mixed"   arithmetic only: 1..6 (see Arithmetic), a range "1-2", a list "1,3",
                             or "mixed"
        num_examples=10000   generated tasks only: size of the train split
    """
    cls = _task(task)
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    cls.check_split(split)  # a benchmark has only a test split: refused before any data loads
    unknown = sorted(set(options) - set(ENV_OPTIONS) - set(cls.options))
    if unknown:
        raise UsageError(f"unknown option(s) {unknown} for task {task!r}; accepted: "
                         f"{sorted({**ENV_OPTIONS, **cls.options})}")
    env_options = {k: options.get(k, default) for k, default in ENV_OPTIONS.items()}
    task_options = {k: options.get(k, default) for k, default in cls.options.items()}
    keys = env_options.pop("keys")
    _check_options(**env_options)  # fail on a bad option before loading any data
    few_shot = load_few_shot(cls, env_options.pop("num_few_shot"), say)
    examples = cls.load(split, path, seed, keys, **task_options)
    return MathEnv(cls, examples, seed=seed, few_shot=few_shot, **env_options)


def _check_options(template, system_prompt, num_few_shot, stepwise, step_tag, max_steps, reward_fn,
                   calc_annotations, reward_funcs, reward_weights):
    if template not in ("chat", "plain"):
        raise ValueError(f"template must be 'chat' or 'plain', got {template!r}")
    if not isinstance(num_few_shot, int) or num_few_shot < 0:
        raise ValueError(f"num_few_shot must be an integer >= 0, got {num_few_shot!r}")
    if not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps must be an integer >= 1, got {max_steps!r}")
    if reward_fn is not None and not callable(reward_fn):
        raise ValueError("reward_fn must be a callable reward_fn(example, steps, done) -> float, "
                         "or None")
    if reward_weights is not None:
        _check_weights(reward_weights, reward_funcs)


def _check_weights(reward_weights, reward_funcs):
    """_check_options' check of --reward_weights, where they are given."""
    if len(reward_weights) != 1 + len(reward_funcs):
        raise UsageError(f"--reward_weights {' '.join(map(str, reward_weights))}: give "
                         f"{1 + len(reward_funcs)} weights, the verifier's first, then one per "
                         f"--reward_fn ({', '.join(name for name, _ in reward_funcs) or 'none'})")
    if not all(math.isfinite(w) for w in reward_weights):
        raise UsageError(f"--reward_weights {' '.join(map(str, reward_weights))}: every weight "
                         "must be a finite number (negative ones are penalties)")


# ------------------------------------------------------------------------------------------------
# The command line's data options, made into envs

MATH_SUBJECTS = ("prealgebra", "algebra", "number_theory", "counting_and_probability", "geometry",
                 "intermediate_algebra", "precalculus")


def resolve_task(args, say=print):
    """(task, data path, MATH subject) of the options: --dataset_name may be a task, a MATH
    subject (the math task, filtered to that subject) or a data file or hub dataset id (the task
    read off its fields). A --dataset_path file given with the default task (arithmetic) whose rows
    are not arithmetic is read as the task its fields say. Reads one row at most: no heavy work."""
    task, path, subject = args.dataset_name, args.dataset_path, None
    if task.lower() in MATH_SUBJECTS:
        task, subject = "math", task.lower()
    elif task not in TASKS and (Path(task).is_file() or is_hub_id(task)):  # TRL's way: the data
        task, path = None, path or task
    elif task not in TASKS:
        raise _not_a_task(task)
    if path is not None:
        task = _task_of_data(task, path, args, say)
    return task, path, subject


def _not_a_task(task):
    """resolve_task's error, for a --dataset_name that names nothing it reads."""
    return UsageError(f"--dataset_name {task!r}: not a task ({_names(False)}), a MATH "
                      f"subject ({', '.join(MATH_SUBJECTS)}), a benchmark ({_names(True)}), "
                      "a data file or a hub dataset id.")


def _task_of_data(task, path, args, say):
    """resolve_task's task where a data file or hub dataset is given: its first row's, if asked."""
    keys = {"question": args.question_key, "answer": args.answer_key}
    if Path(path).is_file() and task in (None, "arithmetic"):
        found = detect_task([rename_fields(read_rows(path, "arithmetic")[0], keys)])
        if task is not None and found != task:
            say(f"{path}: its fields are those of the {found} task, not arithmetic: reading it as "
                f"{found}")
        return found
    if task is None:  # a hub dataset named by --dataset_name: its fields decide
        return detect_task([rename_fields(load_hub_rows(path, None, "train")[0], keys)])
    return task


def make_env_options(args, task: str) -> dict:
    """The make_env options that the data options (common/run/args.py's DataArgs) give, for training
    and eval.py alike: template, system prompt, few-shot examples, the rows' keys, your own reward
    functions and their weights, and the arithmetic task's difficulty."""
    options = dict(template=args.template, num_few_shot=args.num_few_shot,
                   system_prompt=args.system_prompt,
                   keys={"question": args.question_key, "answer": args.answer_key,
                         # sft.py's: the field of the worked solutions
                         "solution": getattr(args, "solution_key", None)},
                   reward_funcs=[load_reward_fn(spec) for spec in args.reward_fn or ()],
                   reward_weights=args.reward_weights)
    if task == "arithmetic":
        options["difficulty"] = args.difficulty
    elif args.difficulty != next(f.default for f in fields(args) if f.name == "difficulty"):
        raise UsageError(f"--difficulty {args.difficulty} changes nothing in this run: it is read "
                         f"only by the arithmetic task, and this run's is {task}. Drop it.")
    return options


@on_every_rank()  # each rank reads the same options and files
def make_envs(args, stepwise_options=None, stepwise_eval=False, say=print):
    """(train env, held-out env or None when args.num_eval_problems is 0), from the options every
    algorithm file shares (common/run/args.py): the task and its files (`resolve_task`), keys,
    filters, template, system prompt, few-shot examples and your own reward functions. A training
    file without an --eval_dataset_path gives up a held-out slice of its rows (`hold_out`). The
    train env's `source` is (--dataset_name, --dataset_path) as run: a data file or hub dataset
    given as --dataset_name becomes its task and the path, a MATH subject stays itself."""
    task, path, subject = resolve_task(args, say)
    options = make_env_options(args, task)
    train = make_env(task, "train", path=path, seed=args.seed, say=say,
                     **{**options, **(stepwise_options or {})})
    train.source = (subject or task, path)
    evaluation = None
    if args.num_eval_problems:
        eval_options = {**options, **((stepwise_options or {}) if stepwise_eval else {})}
        own_file = args.eval_dataset_path is None and path is not None and Path(path).is_file()
        evaluation = make_env(task, "test", path=path if own_file else args.eval_dataset_path,
                              seed=args.seed, say=lambda _: None, **eval_options)
        if own_file:
            hold_out(train, evaluation, args.num_eval_problems, args.seed, path, say)
    for env in (train, evaluation):
        if env is not None and (subject or args.levels):
            filter_math(env, subject, args.levels, say)
    return train, evaluation


def make_eval_sets(args, say=print) -> dict:
    """--eval_datasets as {name: held-out env}: a task or benchmark's test split, a data file's
    rows or a hub dataset's, each read whole and prompted as its own task prompts (its system
    prompt and worked examples; --template and --num_few_shot as the run's). The training task's
    name stands for the run's own held-out set (`make_envs`'s), which is None here and filled in by
    the caller. A set's metrics are named by `eval_set_name` (eval/<name>/...). Empty without
    --eval_datasets."""
    sets = {}
    for given in args.eval_datasets or ():
        name = eval_set_name(given)
        if name in sets:
            raise UsageError(f"--eval_datasets names two sets {name!r}: give each once (a file's "
                             "metrics are named by its stem, so rename one of two files)")
        if given == args.dataset_name:
            sets[name] = None
            continue
        sets[name] = eval_set_env(args, given, "test", say)
    return sets


def eval_set_name(given: str) -> str:
    """The name an --eval_datasets entry goes by in metrics and file names: a task's or
    benchmark's own (TASK=FILE's TASK), a data file's stem, a hub dataset's name without its
    owner."""
    if "=" in given:
        return given.split("=", 1)[0]
    if Path(given).suffix in (".jsonl", ".json", ".parquet"):
        return Path(given).stem
    return given.rsplit("/", 1)[-1]


def eval_set_env(args, given: str, split: str = "test", say=print) -> "MathEnv":
    """The env of one --eval_datasets entry, `given`: a task, benchmark, MATH subject, data file or
    hub dataset id, or TASK=FILE, a file (or hub id) read as TASK reads its rows (aime24=aime.jsonl:
    offline, a benchmark's file with its answer convention). Read whole with its task's own
    fields, system prompt and verifier; the run's --template and --num_few_shot; --difficulty only
    where the set is arithmetic."""
    one = copy.copy(args)
    one.dataset_name, one.dataset_path = given.split("=", 1) if "=" in given else (given, None)
    one.question_key = one.answer_key = one.system_prompt = one.levels = None
    one.reward_fn = one.reward_weights = None
    task, path, subject = resolve_task(one, say)
    if task != "arithmetic":
        one.difficulty = next(f.default for f in fields(args) if f.name == "difficulty")
    env = make_env(task, split, path=path, seed=args.seed, say=lambda _: None,
                   **make_env_options(one, task))
    if subject:
        filter_math(env, subject, None, say)
    return env


def hold_out(train, evaluation, num_eval_problems, seed, path, say=print):
    """Split one file's problems, in place: a seeded random fifth of its distinct questions (at most
    num_eval_problems) for evaluation, once each, and the rows of the others for training. A
    question that repeats goes one way with all its copies: a copy left in training would be graded
    as held out after being trained on. train and evaluation hold the same rows in the same order
    (both read `path`); a file without repeats splits as it did when rows were drawn."""
    rows = len(train)
    questions = list(dict.fromkeys(ex["question"] for ex in train.examples))
    n = min(num_eval_problems, len(questions) // 5)
    if n == 0:
        say(f"{path}: {rows} rows are too few to hold a fifth out, so evaluation reads the "
            "training rows (--eval_dataset_path for a held-out file)")
        return
    held = {questions[i] for i in random.Random(seed).sample(range(len(questions)), n)}
    first = {}  # held question -> its first row, the one evaluated
    for ex in evaluation.examples:
        if ex["question"] in held:
            first.setdefault(ex["question"], ex)
    evaluation.examples = list(first.values())
    train.examples = [ex for ex in train.examples if ex["question"] not in held]
    if len(questions) == rows:
        say(f"{path}: no --eval_dataset_path, so {n} of its {rows} rows are held out for "
            f"evaluation and {len(train)} train")
    else:
        say(f"{path}: no --eval_dataset_path, so {n} of its {len(questions)} distinct questions "
            f"are held out for evaluation and {len(train)} rows of the others train ({rows} rows: "
            "a repeated question is held out or trained on with all its copies)")


def filter_math(env, subject, levels, say):
    """Keep the problems of one MATH subject and/or some levels, in place. Subjects are spelled
    as the hub's 'type' or MATH-500's 'subject' ("Counting & Probability"); levels as 3 or
    "Level 3"."""
    if env.task.name != "math":
        raise UsageError(f"--levels and MATH subjects filter the math task, not {env.task.name}.")
    examples = env.examples
    if subject is not None:
        if not any(ex.get("subject") for ex in examples):
            say(f"--dataset_name {subject}: these rows have no 'subject' field, so all "
                f"{len(examples)} problems are used")
        else:
            examples = [ex for ex in examples if _subject_key(ex.get("subject")) == subject]
    if levels is not None:
        wanted = set(Arithmetic.levels(levels))
        if not any(ex.get("level") for ex in examples):
            say(f"--levels {levels}: these rows have no 'level' field, so no level filter applies")
        else:
            examples = [ex for ex in examples if _level_number(ex.get("level")) in wanted]
    if not examples:
        raise UsageError(f"no problem of subject {subject} and levels {levels} in this data")
    env.examples = examples


def _subject_key(subject) -> str:
    """'Counting & Probability' -> 'counting_and_probability', as in MATH_SUBJECTS."""
    return str(subject or "").lower().replace("&", "and").replace(" ", "_")


def _level_number(level) -> int:
    """'Level 3' or 3 -> 3; a missing or unreadable level -> 0 (kept by no filter)."""
    digits = re.sub(r"\D", "", str(level or ""))
    return int(digits) if digits else 0
