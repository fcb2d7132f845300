"""PS4, find the bug: an algorithm file with one bug planted in it, the symptom the bug shows in the
logs, and the test that finds it (docs/course.md).

    python -m exercises.bug                # the exercises, each with its symptom
    python -m exercises.bug 4.3            # write bugs/4.3/ppo.py: ppo.py with one bug in it
    python -m exercises.bug 4.3 --run -- --model_name_or_path tiny-random --max_steps 3
    python -m exercises.bug 4.3 --hint     # where to look
    python -m exercises.bug 4.3 --check    # fixed? the test aimed at the bug, on your copy
    python -m exercises.bug 4.3 --fresh    # start over: the buggy copy again, over your edits

The bugs are those of dev/planted_bugs.py, realistic one-line mistakes in the way a file wires its
helpers together, each with the test of the suite that catches it. This file adds only the words:
the symptom, measured on the tiny model with the flags shown, and a hint. The copy is made from the
real file when you ask for it, and --check runs the project's own test on your copy, so the
solution is the real file itself and nothing here can drift from it.

Why it works this way:
- The copy keeps the file's name, in a folder per exercise (bugs/4.3/ppo.py): two exercises share
  ppo.py and two grpo.py, and a traceback or a diff names the file you know.
- --run executes the copy as `python ppo.py` would, as __main__, with the repository's root on the
  path, since the copy imports common/ and `python bugs/4.3/ppo.py` would not find it. Without
  --output_dir its logs go to runs/bugs/4.3/run-N, a new folder each time, so that runs before
  and after a fix lie side by side.
- --check never changes the working tree: it copies the tree to a temporary folder, puts your copy
  in place of the real file there and runs the aimed test. Its exit status is 0 only when the
  test passes, so a teacher can grade with it. A fix that differs from the real file's line passes
  too, as long as the test does.
- A copy you have edited is never overwritten; --fresh writes the buggy one again.
- The hint waits for --hint: reading the symptom is the exercise.
"""

import argparse
import os
import runpy
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from itertools import count
from pathlib import Path

from dev.planted_bugs import BUGS, copy_tree, run_test

ROOT = Path(__file__).resolve().parents[1]
COPIES = ROOT / "bugs"  # the students' copies, one folder per exercise (.gitignore has /bugs/)
RUNS = ROOT / "runs" / "bugs"  # where --run writes the logs when no --output_dir is given


class Problem(Exception):
    """What stops a command, said in one line with the fix."""


@dataclass(frozen=True)
class BugExercise:
    """One exercise: a bug of dev/planted_bugs.py and the words that teach it.

    bug: its name in BUGS, which holds the file, the right line, the buggy one and the test.
    symptom: what the buggy copy's logs show, measured with `flags` on the tiny model.
    flags: the file's own flags that show the symptom in seconds.
    hint: where to look, for a student who is stuck.
    tool_model: the flags name bugs/tool-model, a random model that calls the calculator by chance
        (tests/tool_model.py), written with the copy: tiny-random never calls a tool.
    """

    id: str
    bug: str
    symptom: str
    flags: str
    hint: str
    tool_model: bool = False

    @property
    def path(self) -> str:
        return BUGS[self.bug][0]

    @property
    def test(self) -> str:
        return BUGS[self.bug][3]

    @property
    def copy(self) -> Path:
        return COPIES / self.id / Path(self.path).name

    def buggy_text(self) -> str:
        """The real file with the bug planted: its right line(s) replaced by the buggy ones."""
        _, right, wrong, _ = BUGS[self.bug]
        source = (ROOT / self.path).read_text()
        if source.count(right) != 1:
            raise Problem(f"{self.path} no longer holds the line of PS{self.id}'s bug: update "
                          "dev/planted_bugs.py's BUGS")
        return source.replace(right, wrong)


TINY = "--model_name_or_path tiny-random --num_eval_problems 0 --max_new_tokens 8"
# a reward that the tiny random model earns now and then, so that rewards differ within a batch
CAPITAL = "--reward_fn examples/own_task/reward.py:starts_with_capital --reward_weights 0 1"
EXERCISES = [
    BugExercise(
        "4.1", "group_of_the_wrong_size",
        symptom="In samples.jsonl the four responses to 'What is 86 + 59?' all score 0, yet three "
                "have advantage 0.0 and one -0.707, while zero_std_frac 0.5 says that problem's "
                "rewards differ: responses of one group with the same reward should get the same "
                "advantage (-0.465 each in the real file).",
        flags=f"{TINY} --max_steps 1 --num_prompts 2 --num_generations 16 {CAPITAL}",
        hint="group_advantages cuts the update's rewards into groups. What size does it need, "
             "and what does the update pass it?"),
    BugExercise(
        "4.2", "kl_swapped",
        symptom="kl_ref is negative from update 2 on: -0.023, -0.046, -0.077. A KL is never "
                "negative, and k1's mean over the policy's own samples estimates KL(pi || pi_ref) "
                "(the real file: 0.057, 0.032, 0.102).",
        flags=f"{TINY} --max_steps 4 --beta 0.1 --kl_penalty reward --kl_estimator k1 "
              "--learning_rate 1e-2",
        hint="kl_estimate(logp, ref_logp, estimator) estimates KL(pi || pi_ref) from samples of "
             "pi. In the KL that goes into the reward, which log-probs come first?"),
    BugExercise(
        "4.3", "value_targets_after_whitening",
        symptom="return/mean is 0.000 at update 1 while reward/mean is 0.25, although with gamma 1 "
                "and no KL penalty a response's return is its reward; v_loss sits at 0.496 in "
                "every update instead of falling (the real file: return/mean 0.25, v_loss 0.125, "
                "0.031, 0.0003).",
        flags=f"{TINY} --max_steps 3 {CAPITAL}",
        hint="The critic learns the returns of GAE, taken before anything is done to the "
             "advantages. Follow `returns` from compute_advantages to the value loss."),
    BugExercise(
        "4.4", "critic_off_by_one",
        symptom="None at this size: every metric agrees with the real file's to 2 or 3 digits "
                "(value/mean 0.0207 against 0.0203 at update 3). Logs do not show every bug: find "
                "it by reading the file against docs/ppo.md.",
        flags=f"{TINY} --max_steps 3 {CAPITAL}",
        hint="V(s_t) of response token t must be read at the position before token t, the same "
             "one-token shift as the log-probs. Which columns of the critic's output does the "
             "file read?"),
    BugExercise(
        "4.5", "kl_weight_dropped",
        symptom="reward/mean is 0 in every update, and return/mean is exactly minus kl_ref: "
                "-0.0049 and -0.0270 at updates 2 and 3. The return is the reward minus beta "
                "times the KL, with --beta 0.05 (the real file: -0.00002 and -0.0023, about 0.05 "
                "of its kl_ref).",
        flags=f"{TINY} --max_steps 3 --learning_rate 1e-2",
        hint="Find where the update builds the KL-regularised returns, and see what it passes "
             "for beta."),
    BugExercise(
        "4.6", "old_logprobs_of_other_rows",
        symptom="approx_kl is 0.71, 0.54 and 1.61 and early_stop_frac 1.0 in every update, so "
                "the policy never takes a step (no grad_norm is logged), while mismatch/kl is 0: "
                "the sampler and the trainer agree. The console warns of divergence and suggests "
                "a lower --learning_rate (the real file: approx_kl 0.0, early_stop_frac 0.0).",
        flags=f"{TINY} --max_steps 3",
        hint="On the first minibatch of an update the policy is the one that sampled, so every "
             "ratio is exactly 1. update_policy indexes each micro-batch two ways: `rows`, rows "
             "of the rollout, and `in_batch`, positions in the minibatch. Which tensors are the "
             "rollout's, and which the minibatch's?"),
    BugExercise(
        "4.7", "step_mean_copied_into_the_token_loss",
        symptom="grad_norm 13.2 and critic_grad_norm 18.8; run it again with --max_new_tokens 16 "
                "and they grow to 19.2 and 28.4, in step with response_len/mean, while pg_loss "
                "and v_loss hardly change. The gradient of a token mean does not grow with the "
                "steps' length (the real file: 1.65 and 2.35 at 8 tokens, 1.23 and 1.82 at 16).",
        flags=f"{TINY} --max_steps 2 --prm_model_name_or_path tiny-random",
        hint="Both losses are token means over the minibatch (docs/tppo.md, item 10). What "
             "divides the summed losses? And what does appo.py divide its own by?"),
    BugExercise(
        "4.8", "reference_is_the_policy",
        symptom="kl_ref and rewards/margins are exactly 0 and pg_loss exactly 0.6931 (log 2) in "
                "every update, although from update 2 the policy has moved (the real file at "
                "updates 2 and 3: kl_ref -0.0016 and 0.0001, pg_loss 0.6927 and 0.6912, "
                "rewards/accuracies 0.67 and 1.0).",
        flags=f"{TINY} --max_steps 3 --learning_rate 1e-4 {CAPITAL}",
        hint="DPO's implicit reward is beta log(pi / pi_ref), against the frozen starting "
             "policy. Which model scores the pairs before the update?"),
    BugExercise(
        "4.9", "teacher_at_another_temperature",
        symptom="The teacher here is the student itself (tiny-random), so the student has "
                "nothing to learn: yet kl_teacher is 0.00047, -0.0015 and 0.0025, pg_loss the "
                "same, and grad_norm 0.077-0.082 in every update (the real file: exactly 0 each, "
                "and the weights never move).",
        flags=f"{TINY} --max_steps 3 --teacher_model_name_or_path tiny-random",
        hint="Both distributions are compared at the temperature the student sampled at "
             "(docs/distill.md). Which temperature does each model's forward in the update use?"),
    BugExercise(
        "4.10", "tool_answers_in_the_loss",
        symptom="Rewarded (exercises/tool_reward.py) for a response that calls the calculator and "
                "then writes on, a random model learns to call it (tools/call_frequency 0.94-1.0 "
                "from update 4), yet reward/mean stays at 0.34-0.69 through update 8 and "
                "response_len/mean falls to 8.8 tokens: it stops writing after the tool's answer. "
                "(The real file: reward 1.0 from update 6, 11.0 tokens.)",
        flags="--model_name_or_path bugs/tool-model --max_new_tokens 24 --max_turns 2 "
              "--num_prompts 4 --num_generations 8 --max_steps 8 --learning_rate 5e-2 "
              "--temperature 1.0 --num_few_shot 0 --system_prompt Answer. --num_eval_problems 0 "
              "--reward_fn exercises/tool_reward.py:called_then_wrote --reward_weights 0 1",
        hint="A response holds the model's tokens and the tool's answers, and both are in the "
             "sequence the update reads (docs/tools.md). Which of them should the loss count?",
        tool_model=True),
    BugExercise(
        "4.11", "off_policy_weight_upside_down",
        symptom="Sampled 4 updates behind, with TIS: a token's weight is min(pi_prox / mu, 2), "
                "whose mean over the tokens mu sampled is about 1 at most (pi_prox / mu averages 1 "
                "under mu, and the cap only lowers it). Yet is_weight/mean climbs from 1.0 to "
                "1.5-1.9 from update 16 on, and is_weight/clipped_frac to 0.5-0.9: most tokens sit "
                "at the cap (the real file: is_weight/mean 0.19 to 1.05, clipped_frac 0.30 at "
                "most).",
        flags=f"{TINY} --max_steps 30 --max_staleness 4 --num_prompts 4 --num_generations 8 "
              f"--max_new_tokens 4 --temperature 1.0 --learning_rate 5e-2 --num_few_shot 0 "
              f"{CAPITAL}",
        hint="A token sampled k updates ago weighs r = pi_prox / mu (docs/async_grpo.md): above "
             "1 where the trainer's policy now likes it more than the sampler did. Which "
             "log-probs does off_policy_weights subtract from which?"),
    BugExercise(
        "4.12", "cut_responses_kept_in_the_loss",
        symptom="The tiny model writes to the 8-token budget every time: truncated_frac is 1.0 and "
                "reward/overlong_penalty -1.0 in each of the 3 updates, and every response is cut, "
                "so overlong filtering (on by default) should leave nothing to learn from. Yet "
                "grad_norm is 1.53, 0.0 and 2.15 (the real file: 0.0 in every update, and the "
                "weights never move).",
        flags=f"{TINY} --max_steps 3 --overlong_buffer_len 8 --no_dynamic_sampling {CAPITAL}",
        hint="DAPO's overlong filtering keeps the responses cut at the budget out of the loss "
             "(docs/dapo.md). Which rows does the mask keep?"),
    BugExercise(
        "4.13", "calculator_tokens_in_the_loss",
        symptom="None at this size: the tiny model never closes a <<expr>> span (calc/fired 0.0 in "
                "every update), so the calculator writes nothing and every metric is the real "
                "file's to the last digit. Logs do not show every bug: find it by reading the "
                "file against docs/reinforce_stepwise.md.",
        flags=f"{TINY} --max_steps 3 --sym_calc --max_episode_steps 3",
        hint="The calculator's value is context the policy reads, not a token it chose "
             "(docs/reinforce_stepwise.md, item 5). Which mask does the update's loss take, and "
             "which one keeps the calculator's tokens out?"),
    BugExercise(
        "4.14", "cispo_weight_not_detached",
        symptom="grad_norm is 7.56, 0.0 and 5.42 in the 3 updates. With one epoch of one minibatch "
                "the ratio is 1, every weight 1, and CISPO's gradient is that of grpo.py "
                "--loss_type dapo on the same flags: 0.765, 0.0 and 0.539. Ten times more, and "
                "ten is about -log pi of a token of the tiny model (entropy 10.8) (the real "
                "file: 0.765, 0.0 and 0.539).",
        flags=f"{TINY} --max_steps 3 {CAPITAL}",
        hint="CISPO's gradient is REINFORCE's, each token's times its capped ratio "
             "(docs/cispo.md): the weight scales the gradient and takes none itself. Does "
             "policy_loss let a gradient flow through the weight?"),
    BugExercise(
        "4.15", "sapo_temperatures_swapped",
        symptom="grad_norm is the real file's (0.765, 0.0, 0.539: at ratio 1 the gate's slope is "
                "1 whatever the temperature), but pg_loss is +0.155, 0.0 and +0.077. At ratio 1 "
                "the gate is 2 / tau, a token's loss -2 A / tau, and with --sapo_temperature_neg "
                "2 the tokens of negative advantage should weigh half as much as the others: the "
                "mean should be negative (the real file: -0.155, 0.0 and -0.077).",
        flags=f"{TINY} --max_steps 3 --sapo_temperature_neg 2 {CAPITAL}",
        hint="A positive advantage takes sapo_temperature_pos, a negative one the larger "
             "sapo_temperature_neg (docs/sapo.md), and at ratio 1 the gate is 2 / tau. Which "
             "temperature does policy_loss give which sign?"),
    BugExercise(
        "4.16", "prompt_in_the_loss",
        symptom="response_len/mean is 109.75, 110.75 and 110.0 tokens in the 3 updates, with "
                "--max_new_tokens 24, and the worked lines it trains on ('47 + 38 = 85.\\nThe "
                "answer is 85.') are about 21 tokens each; the loss is 10.82-10.83 (the real "
                "file: 20.75, 21.75 and 21.0 tokens, loss 10.79-10.81).",
        flags=f"{TINY} --max_steps 3 --max_new_tokens 24",
        hint="A cold start learns to write the solution after its prompt, not the prompt "
             "(docs/sft.md). What does solution_batch put in the rows the loss counts?"),
]
BY_ID = {e.id: e for e in EXERCISES}


def exercise(id) -> BugExercise:
    if id not in BY_ID:
        raise Problem(f"no exercise {id}; the exercises are {', '.join(BY_ID)}")
    return BY_ID[id]


def written(ex) -> Path:
    """The student's copy, which must exist."""
    if not ex.copy.is_file():
        raise Problem(f"no copy of PS{ex.id} yet: python -m exercises.bug {ex.id} writes "
                      f"{os.path.relpath(ex.copy)}")
    return ex.copy


def write(ex, fresh=False) -> str:
    """Write the buggy copy, unless the student's edited one is there; -> what was done."""
    text = ex.buggy_text()
    where = os.path.relpath(ex.copy)
    if ex.copy.is_file() and ex.copy.read_text() != text and not fresh:
        return (f"{where} is already there with your edits: kept (--fresh writes the buggy copy "
                "again)")
    ex.copy.parent.mkdir(parents=True, exist_ok=True)
    ex.copy.write_text(text)
    if ex.tool_model:  # the model the flags name (tests/tool_model.py builds it)
        sys.path.insert(0, str(ROOT / "tests"))
        from tool_model import build
        build(COPIES / "tool-model")
    return f"{where} is {ex.path} with one bug in it"


def run_flags(ex, flags) -> list:
    """The flags of a --run: the student's, with a new run folder where they name none."""
    named = {flag[2:].split("=")[0].replace("-", "_") for flag in flags if flag.startswith("--")}
    if named & {"output_dir", "experiment_name"}:  # OpenR's name: runs/<file>/<name>
        return list(flags)
    folder = next(RUNS / ex.id / f"run-{n}" for n in count(1)
                  if not (RUNS / ex.id / f"run-{n}").exists())
    return [*flags, "--output_dir", os.path.relpath(folder)]


def run(ex, flags):
    """Run the student's copy as `python <file> flags` would."""
    copy = written(ex)
    argv = run_flags(ex, flags)
    print(f"running {os.path.relpath(copy)} {' '.join(argv)}", flush=True)
    sys.path.insert(0, str(ROOT))  # the copy imports common/, which sits at the root
    sys.argv = [str(copy), *argv]
    runpy.run_path(str(copy), run_name="__main__")


def check(ex) -> tuple[bool, str]:
    """Run the test aimed at the bug on the student's copy, in a temporary copy of the tree:
    (fixed, one line that says so)."""
    mine = written(ex).read_text()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        copy_tree(tree)
        (tree / ex.path).write_text(mine)
        out = run_test(tree, ex.test)
    if out.returncode == 0:
        return True, f"fixed: {ex.test} passes"
    lines = (out.stdout + out.stderr).splitlines()
    errors = [line[1:].strip() for line in lines if line.startswith("E ")]
    said = errors[0] if errors else next((x for x in reversed(lines) if x.strip()), "")
    return False, f"not fixed yet: {ex.test} fails: {said}"


def wrap(text) -> str:
    return textwrap.fill(text, width=100, subsequent_indent="    ", break_on_hyphens=False)


def describe(ex) -> str:
    """What a student reads once the copy is written."""
    me = f"python -m exercises.bug {ex.id}"
    return "\n".join([
        wrap(f"The symptom: {ex.symptom}"),
        f"See it:  {me} --run -- {ex.flags}",
        f"         (logs in {os.path.relpath(RUNS / ex.id)}/run-N: metrics.jsonl, samples.jsonl)",
        f"Stuck:   {me} --hint",
        f"Fixed?   {me} --check    (the real {ex.path} is the answer: diff it only after)"])


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, as every other error here, not argparse's usage
        raise Problem(f"{message} (python -m exercises.bug --help)")


def main(argv=None) -> int:
    # no abbreviations: a file's flag such as --fre must not pass for --fresh
    parser = Parser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                    epilog="With --run, the flags after -- go to the file as its own.")
    parser.add_argument("id", nargs="?", help="the exercise (4.3); none: list them")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--run", action="store_true", help="run your copy with the flags after --")
    what.add_argument("--check", action="store_true",
                      help="run the test aimed at the bug on your copy: exit status 0 if fixed")
    what.add_argument("--hint", action="store_true", help="where to look")
    what.add_argument("--fresh", action="store_true",
                      help="write the buggy copy again, over your edits")
    try:
        args, flags = parser.parse_known_args(argv)
        flags = [flag for flag in flags if flag != "--"]
        if flags and not args.run:
            raise Problem(f"{' '.join(flags)}: a file's flags go after --run --")
        if args.id is None:
            for ex in EXERCISES:
                print(wrap(f"PS{ex.id} in {ex.path}: {ex.symptom}"))
            print("python -m exercises.bug ID writes the copy of an exercise and says how to run "
                  "and check it")
            return 0
        ex = exercise(args.id)
        if args.run:
            run(ex, flags)
        elif args.check:
            fixed, said = check(ex)
            print(f"PS{ex.id}: {said}")
            return 0 if fixed else 1
        elif args.hint:
            print(f"PS{ex.id} hint: {ex.hint}")
        else:
            print(f"PS{ex.id}: {write(ex, args.fresh)}\n{describe(ex)}")
        return 0
    except Problem as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
