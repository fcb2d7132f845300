"""Options that another option makes meaningless, teachers of another size, and a resumed queue of
sampled batches (issue 69): each is one line, `error: ...`, naming the fix, before any model loads.
In process: each case calls the check a file runs first (check_options, saved_queue), so the suite
pays milliseconds for it. tests/test_distill.py's runs train with a teacher of more output rows."""

import importlib
import json
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

import async_grpo
import dapo
import distill
import grpo
import reinforce
import reinforce_stepwise
import tools
import common.run.checks as checks
import eval as ev
from common.errors import PathError, UsageError
from dev.algorithms import ALGORITHMS
from common.run.checks import check_options
from common.run.pair import Sampled, rollout_state, saved_queue

ROOT = Path(__file__).resolve().parents[1]
FILES = {name: importlib.import_module(name) for name in ALGORITHMS}


def options(name, tmp_path, **given):
    module = FILES[name]
    extra = {"teacher_model_name_or_path": "tiny-random"} if name == "distill" else {}
    args = replace(module.Args(), **{"model_name_or_path": "tiny-random",
                                     "output_dir": str(tmp_path / "run"), **extra, **given})
    return args, module.check_args


# ---- an option read only under another's value -----------------------------------------------------------
# A case for every row of the one table (tested below): the option set where another turns it off
REFUSED = [
    ("distill", {"jsd_beta": 0.5}, "--jsd_beta 0.5 changes nothing in this run: it is read only with "
                                   "--loss_form full. Drop it, or pass that."),
    ("async_grpo", {"icepop_low": 0.3}, "--icepop_low 0.3 changes nothing in this run: it is read only "
                                        "with --off_policy_correction icepop. Drop it, or pass that."),
    ("async_grpo", {"icepop_high": 3.0, "off_policy_correction": "seq_mis"},
     "--icepop_high 3.0 changes nothing in this run: it is read only with --off_policy_correction icepop."),
    ("async_grpo", {"is_cap": 3.0, "off_policy_correction": "icepop"},
     "--is_cap 3.0 changes nothing in this run: it is read only with --off_policy_correction tis or seq_mis."),
    ("tools", {"tools": "none", "max_turns": 2},
     "--max_turns 2 changes nothing in this run: it is read only with --tools naming a tool"),
    ("grpo", {"kl_estimator": "k1"}, "--kl_estimator k1 changes nothing in this run: it is read only with "
                                     "--beta > 0."),
    ("grpo", {"kl_penalty": "reward"}, "--kl_penalty reward changes nothing in this run"),
    ("dapo", {"overlong_buffer_len": 0, "overlong_penalty_factor": 0.5},
     "--overlong_penalty_factor 0.5 changes nothing in this run: it is read only with "
     "--overlong_buffer_len above 0"),
    ("dapo", {"dynamic_sampling": False, "max_sampling_rounds": 2},
     "--max_sampling_rounds 2 changes nothing in this run: it is read only with dynamic sampling"),
    ("grpo", {"eval_temperature": 0.8}, "--eval_temperature 0.8 changes nothing in this run: it is "
                                        "read only with --eval_samples above 0"),
    ("dapo", {"epsilon_high": 0.1}, "--epsilon_high 0.1 is below --epsilon 0.2: clip-higher widens "
                                    "the upper clip; pass at least 0.2"),
    ("tools", {"tools": "none", "tool_format": "template"},
     "--tool_format template changes nothing in this run: it is read only with --tools naming a tool"),
    ("tools", {"tool_format": "template", "num_few_shot": 2},
     "--num_few_shot 2 changes nothing in this run: it is read only with --tool_format tags."),
    ("grpo", {"plain": True, "compile": True}, "--compile changes nothing in this run: it is read only "
                                              "with the default path"),
    ("ppo", {"plain": True, "cuda_graphs": False}, "--no_cuda_graphs changes nothing in this run"),
    ("grpo", {"compile": True, "cuda_graphs": False}, "--no_cuda_graphs changes nothing in this run: it "
                                                     "is read only with the default path without --compile"),
    ("reinforce", {"lora_target_modules": "q_proj"}, "--lora_target_modules q_proj changes nothing in "
                                                     "this run: it is read only with --lora_r above 0"),
    ("sft", {"wandb_project": "mine"}, "--wandb_project mine changes nothing in this run: it is read "
                                       "only with --track"),
    ("dapo", {"num_eval_problems": 0, "eval_interval": 5},
     "--eval_interval 5 changes nothing in this run: it is read only with --num_eval_problems above 0"),
    ("grpo", {"num_eval_problems": 0, "eval_dataset_path": "held_out.jsonl"},
     "--eval_dataset_path held_out.jsonl changes nothing in this run: it is read only with "
     "--num_eval_problems above 0"),
    ("distill", {"num_eval_problems": 0, "eval_batch_size": 8},
     "--eval_batch_size 8 changes nothing in this run: it is read only with --num_eval_problems above 0"),
]


@pytest.mark.parametrize("name,given,says", REFUSED)
def test_an_option_that_another_turns_off_is_refused(name, given, says, tmp_path):
    args, check_args = options(name, tmp_path, **given)
    with pytest.raises(UsageError) as e:
        check_options(args, check_args)
    assert str(e.value).startswith(says), str(e.value)


@pytest.mark.parametrize("name,given", [
    ("distill", {"jsd_beta": 0.5, "loss_form": "full"}),
    ("async_grpo", {"icepop_low": 0.3, "off_policy_correction": "icepop"}),
    ("async_grpo", {"is_cap": 3.0, "off_policy_correction": "seq_mis"}),
    ("tools", {"max_turns": 2}),
    ("grpo", {"kl_estimator": "k1", "kl_penalty": "reward", "beta": 0.1}),
    ("reinforce_stepwise", {"gamma": 0.5, "max_episode_steps": 3}),
    ("distill", {"jsd_beta": 1.0}),  # the default, given: it changes nothing and says nothing
    ("dapo", {"overlong_buffer_len": 8, "overlong_penalty_factor": 0.5}),
    ("dapo", {"max_sampling_rounds": 2}),
    ("dapo", {"epsilon_high": 0.2}),  # equal: the symmetric clip
    ("grpo", {"eval_temperature": 0.8, "eval_samples": 2}),
    ("grpo", {"eval_temperature": 0.0}),  # greedy asked for, and greedy is what runs
    ("grpo", {"compile": True, "cuda_graphs": True}),  # the default, given
    ("grpo", {"plain": True}),
    ("reinforce", {"lora_target_modules": "q_proj", "lora_r": 4}),
    ("dapo", {"eval_interval": 5}),
])
def test_the_same_option_with_what_reads_it_passes(name, given, tmp_path):
    args, check_args = options(name, tmp_path, **given)
    check_options(args, check_args)


# eval.py's: a regrade (--responses) loads no model and samples nothing
REGRADE = "changes nothing in this run: it is read only with a model to sample"
EVAL_REFUSED = [
    ({"model_name_or_path": "tiny-random"}, f"--model_name_or_path tiny-random {REGRADE}"),
    ({"temperature": 0.6, "num_generations": 4}, f"--temperature 0.6 {REGRADE}"),
    ({"top_p": 0.9}, f"--top_p 0.9 {REGRADE}"),
    ({"num_generations": 4}, f"--num_generations 4 {REGRADE}"),
    ({"max_new_tokens": 64}, f"--max_new_tokens 64 {REGRADE}"),
    ({"max_thinking_tokens": 32}, f"--max_thinking_tokens 32 {REGRADE}"),
    ({"eval_batch_size": 8}, f"--eval_batch_size 8 {REGRADE}"),
    ({"bf16": True}, f"--bf16 {REGRADE}"),
    ({"cuda_graphs": False}, f"--no_cuda_graphs {REGRADE}"),
    ({"responses": None, "top_p": 0.9}, "--top_p 0.9 changes nothing in this run: it is read only with "
                                        "--temperature above 0 (greedy takes the top token)."),
    ({"responses": None, "response_field": "answer"},
     "--response_field answer changes nothing in this run: it is read only with --responses."),
]


@pytest.mark.parametrize("given,says", EVAL_REFUSED)
def test_an_evaluation_option_that_another_turns_off_is_refused(given, says, tmp_path):
    saved = tmp_path / "saved.jsonl"
    saved.write_text('{"response": "The answer is 2.", "answer": "2"}\n')
    args = replace(ev.Args(), **{"responses": str(saved), "output": str(tmp_path / "out.jsonl"),
                                 **given})
    with pytest.raises(UsageError) as e:
        ev.check_args(args)
    assert str(e.value).startswith(says), str(e.value)


@pytest.mark.parametrize("given", [
    {"responses": None, "top_p": 0.9, "temperature": 0.6},
    {"response_field": "answer"},
    {"responses": None, "model_name_or_path": "tiny-random", "max_new_tokens": 64, "bf16": True},
])
def test_an_evaluation_option_with_what_reads_it_passes(given, tmp_path):
    saved = tmp_path / "saved.jsonl"
    saved.write_text('{"response": "The answer is 2.", "answer": "2"}\n')
    ev.check_args(replace(ev.Args(), **{"responses": str(saved), "output": str(tmp_path / "o.jsonl"),
                                        **given}))


def read_only_rows(name, tmp_path, monkeypatch):
    """{(where, option, what reads it)} of every row that `name`'s checks hand check_unused, on its
    defaults: where is 'all files' for the shared rows (common/run/checks.py), else the file."""
    seen = set()

    def recorder(where):
        return lambda args, rules: seen.update((where, option, needs) for option, _, needs in rules)

    if name == "eval":
        monkeypatch.setitem(ev.check_args.__globals__, "check_unused", recorder("eval.py"))
        ev.check_args(replace(ev.Args(), model_name_or_path="tiny-random",
                              output=str(tmp_path / "eval.jsonl")))
        return seen
    args, check_args = options(name, tmp_path)
    monkeypatch.setattr(checks, "check_unused", recorder("all files"))
    monkeypatch.setitem(check_args.__globals__, "check_unused", recorder(f"{name}.py"))
    check_options(args, check_args)
    return seen


def test_every_option_another_turns_off_is_in_one_table_with_a_case(tmp_path, monkeypatch):
    # issue 80: one table of "X is read only with Y" for every file and eval.py, each row refused by
    # a case above; the table in dev/notes/reliability.md is the rows themselves
    rows = set()
    for name in (*ALGORITHMS, "eval"):
        with monkeypatch.context() as m:
            rows |= read_only_rows(name, tmp_path / name, m)
    text = (ROOT / "dev/notes/reliability.md").read_text()
    section = text.split("## Options that another turns off", 1)[1].split("\n## ", 1)[0]
    table = set(re.findall(r"^\| (all files|\w+\.py) \| `--(\w+)` \| (.+) \|$", section, re.M))
    assert table == rows
    cased = {(name, re.match(r"--(?:no_)?(\w+)", says).group(1)) for name, _, says in REFUSED}
    cased |= {("eval", re.match(r"--(?:no_)?(\w+)", says).group(1)) for _, says in EVAL_REFUSED}
    for where, option, _ in rows:
        assert any(o == option and where in ("all files", f"{name}.py") for name, o in cased), option
    assert len(rows) >= 25


# ---- teachers: their output rows, their weights file ------------------------------------------------------
def config_only(folder, vocab_size):
    """A model folder as far as the checks read it: config.json alone (no weights load)."""
    from common.models.loading import tiny_random_model

    config = tiny_random_model().config.to_dict()
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": vocab_size}))
    return str(folder)


def test_a_teacher_with_fewer_output_rows_than_the_student_is_refused(tmp_path):
    from common.models.loading import embedding_rows, load_tokenizer

    rows = len(load_tokenizer("tiny-random"))  # 49,152: tiny-random's rows
    student = config_only(tmp_path / "student", rows + 128)  # padded further, as big models are
    assert embedding_rows(student) == rows + 128 and embedding_rows("tiny-random") == rows
    args, check_args = options("distill", tmp_path, model_name_or_path=student)
    with pytest.raises(UsageError) as e:
        check_options(args, check_args)
    assert str(e.value) == (f"--teacher_model_name_or_path tiny-random has {rows} output rows, fewer than "
                            f"the student's {rows + 128}: the student can write a token the teacher cannot "
                            "score. Pass a teacher with at least as many (a larger model of the student's "
                            "family has them).")
    # the other way round is the docstring's own pair (a 0.5B student, a 7B teacher): it trains
    args, check_args = options("distill", tmp_path, teacher_model_name_or_path=student)
    check_options(args, check_args)


def test_a_teacher_weights_file_cut_short_is_named_before_it_loads(tmp_path):
    from safetensors.torch import save_file

    teacher = Path(config_only(tmp_path / "teacher", 64))
    save_file({"w": torch.zeros(1000)}, teacher / "model.safetensors")
    whole = (teacher / "model.safetensors").stat().st_size  # 8 + its header + 4,000
    os.truncate(teacher / "model.safetensors", whole - 1000)
    args, check_args = options("distill", tmp_path, teacher_model_name_or_path=str(teacher))
    with pytest.raises(PathError) as e:
        check_options(args, check_args)
    assert str(e.value) == (f"--teacher_model_name_or_path {str(teacher)!r}: model.safetensors has "
                            f"{whole - 1000} bytes, its header says {whole} (a copy or a save that stopped "
                            "early?). Copy it again, or pass another checkpoint.")
    os.truncate(teacher / "model.safetensors", 20)  # inside the header
    with pytest.raises(PathError, match="model.safetensors has 20 bytes, and no whole safetensors header"):
        check_options(args, check_args)


def test_a_teacher_s_padding_rows_without_mass_change_no_divergence():
    # the full form over a teacher with 3 more output rows: rows whose logits are -1e4 (no mass)
    # give the divergence of the unpadded teacher, at every beta
    torch.manual_seed(0)
    student, teacher = torch.nn.Linear(8, 5, bias=False), torch.nn.Linear(8, 5, bias=False)
    padded = torch.nn.Linear(8, 8, bias=True)
    with torch.no_grad():
        padded.weight.zero_()
        padded.weight[:5] = teacher.weight
        padded.bias.copy_(torch.tensor([0.0] * 5 + [-1e4] * 3))
    h, h_teacher = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    for beta in (0.0, 0.5, 1.0):
        want = distill.full_divergence(h, h_teacher, student, teacher, beta, 0.7)
        got = distill.full_divergence(h, h_teacher, student, padded, beta, 0.7)
        assert want.shape == (2, 3) and (want > 0).all()
        torch.testing.assert_close(got, want)


# ---- async_grpo.py: the queue of sampled batches a checkpoint holds ----------------------------------------
def batch(version=0, prompts=2, samples=4, problems=(3, 7)):
    """rollout_state of a batch as the sampler makes it: prompts x samples rows."""
    from common.models.sampler import Generation, Rollout

    rows = prompts * samples
    gen = Generation(torch.ones(rows, 5, dtype=torch.long), torch.ones(rows, 5, dtype=torch.long),
                     torch.ones(rows, 6, dtype=torch.long), torch.ones(rows, 6, dtype=torch.long),
                     torch.zeros(rows, 6), torch.ones(rows, dtype=torch.bool),
                     torch.zeros(rows, dtype=torch.bool))
    rollout = Rollout(gen, ["x"] * rows, torch.zeros(rows), torch.zeros(rows), list(problems))
    return rollout_state(Sampled(version, rollout, 0.5))


def queue_error(queue, start=2, num_problems=10, **given):
    args = replace(async_grpo.Args(), **{"num_prompts": 2, "num_generations": 4, **given})
    with pytest.raises(UsageError) as e:
        saved_queue({"extra": {"queue": queue}}, args, start, num_problems, "run/checkpoint-2")
    return str(e.value)


def test_a_resumed_queue_of_the_checkpoint_s_shape_is_taken_as_it_is():
    args = replace(async_grpo.Args(), num_prompts=2, num_generations=4)
    queue = [batch(0), batch(1)]
    assert saved_queue({"extra": {"queue": queue}}, args, 2, 10, "run/checkpoint-2") is queue
    assert saved_queue(None, args, 0, 10, None) == []  # a run from update 0


def test_a_resumed_queue_of_another_batch_shape_names_the_options_to_resume_with():
    # --num_generations 2 on a queue of 4 samples a prompt was trained on in groups of 2, silently
    assert queue_error([batch()], num_generations=2) == (
        "--resume: run/checkpoint-2 holds batches sampled ahead of 2 prompts x 4 samples, which this "
        "run would cut into groups of another size: resume with the checkpoint's --num_prompts and "
        "--num_generations (the run folder's args.json has them), or pass another --output_dir.")
    assert "of 2 prompts x 4 samples" in queue_error([batch()], num_prompts=4)


DAMAGED = ("--resume: the queue of sampled batches in run/checkpoint-2 is damaged ({}): resume from an "
           "earlier checkpoint (delete this one), or pass another --output_dir.")


def damaged(how):
    queue = [batch(0), batch(1)]
    if how == "not a list":
        return {"0": queue[0]}
    if how == "a key missing":
        del queue[1]["scores"]
    if how == "a field of another type":
        queue[1]["gen"]["logprobs"] = [0.0] * 8
    if how == "rows that differ":
        queue[1]["scores"] = torch.zeros(7)
    if how == "past the data":
        queue[1]["problems"] = [3, 10]
    if how == "from the future":
        queue[1]["version"] = 3
    if how == "a negative version":
        queue[1]["version"] = -1
    return queue


@pytest.mark.parametrize("how,says", [
    ("not a list", "a dict, not a list"),
    ("a key missing", "batch 1 of 2 lacks the fields of a batch"),
    ("a field of another type", "batch 1 of 2 holds a field of another type"),
    ("rows that differ", "batch 1 of 2's fields differ in shape"),
    ("past the data", "batch 1 of 2 names problems outside the data's 10: was the data changed?"),
    # logged as a staleness of -1 before
    ("from the future", "batch 1 of 2 was drawn by the weights of update 3, and the checkpoint is at "
                        "update 2"),
    ("a negative version", "batch 1 of 2 was drawn by the weights of update -1, and the checkpoint is "
                           "at update 2"),
])
def test_a_damaged_queue_is_one_line_before_the_models_load(how, says):
    assert queue_error(damaged(how)) == DAMAGED.format(says)


# ---- a prompt past the model's positions, in training ------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_file_checks_its_prompts_against_the_model_before_the_weights_load(name):
    # common/env/math_env.py's check_prompt_lengths, called by Run.check_prompts: each training
    # file calls it once its tokenizer is there, before any weights load
    source = (ROOT / f"{name}.py").read_text()
    call = source.index("    run.check_prompts(tokenizer, env, eval_env)")
    assert source.index("tokenizer = load_tokenizer(") < call < source.index("trained_policy(")


def test_a_training_prompt_past_the_model_s_positions_is_one_line_before_the_weights_load(tmp_path):
    from common.models.loading import max_positions

    assert max_positions("tiny-random") == 4096
    data = tmp_path / "long.jsonl"
    rows = [{"question": "What is 2 + 2?", "answer": "#### 4"},
            {"question": "Add these. " + "1 + " * 1340 + "1", "answer": "#### 1341"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = warm.run([sys.executable, "grpo.py", "--model_name_or_path", "tiny-random", "--dataset_path",
                    str(data), "--dataset_name", "gsm8k", "--num_few_shot", "0", "--num_prompts", "2",
                    "--num_generations", "2", "--num_eval_problems", "0", "--max_new_tokens", "64",
                    "--output_dir", str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True,
                   timeout=600)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    # it trained without a word on positions tiny-random never learned. The prompt: 3 tokens for
    # each "1 + ", 50 for the rest (the chat template, the system prompt, "Add these. 1")
    assert out.stderr.splitlines() == [(
        f"error: {data}: row 2: the prompt is 4,070 tokens, which with --max_new_tokens 64 passes the "
        "4,096 positions of tiny-random: lower --max_new_tokens to 26 or less, or shorten the question.")]
    assert not (tmp_path / "run" / "checkpoint-1").exists()


def test_an_arithmetic_difficulty_on_another_task_is_refused(tmp_path):
    from common.env.math_env import make_envs

    data = tmp_path / "gsm8k.jsonl"
    data.write_text(json.dumps({"question": "What is 2 + 2?", "answer": "#### 4"}) + "\n")
    args, _ = options("grpo", tmp_path, dataset_name="gsm8k", dataset_path=str(data), difficulty="3")
    with pytest.raises(UsageError) as e:
        make_envs(args, say=lambda _: None)  # the problems were gsm8k's, at no difficulty, silently
    assert str(e.value) == ("--difficulty 3 changes nothing in this run: it is read only by the arithmetic "
                            "task, and this run's is gsm8k. Drop it.")
    args, _ = options("grpo", tmp_path, difficulty="3", num_eval_problems=0)
    env, _ = make_envs(args, say=lambda _: None)  # arithmetic reads it: level 3 alone
    assert {ex["level"] for ex in env.examples} == {3}
