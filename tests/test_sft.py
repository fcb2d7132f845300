"""sft.py: the masked loss against hand-worked values and against transformers' own -100 labels,
the worked solutions each task writes (GSM8K's '#### N' said as the verifier reads it), the bad
data refused before the weights load, and the checkpoint an RL file trains from. TRL's
SFTTrainer on the same batch: the second tier, at the end."""

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import sft
from common.env import make_env
from common.errors import UsageError
from common.models import encode_prompts, load_policy, load_tokenizer
from common.run import parse_args
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model_name_or_path", "tiny-random", "--num_eval_problems", "0", "--num_prompts", "4",
        "--max_steps", "1", "--max_new_tokens", "48"]


# ---- the loss -----------------------------------------------------------------------------------
def test_the_loss_is_the_token_mean_of_the_solution_tokens_negative_log_likelihood():
    # two solutions of 2 and 1 tokens (the rest padding): -(-1 - 2 - 0.5) / 3 tokens
    logprobs = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -9.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    normaliser = sft.loss_normaliser(mask, world_size=1)
    assert normaliser == 3.0
    loss = sft.sft_loss(logprobs, mask, normaliser)
    assert loss.item() == pytest.approx(3.5 / 3)
    loss.backward()
    # d loss / d log pi = -1/3 on each counted token, 0 on padding: each token weighs alike
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1, -1, 0], [-1, 0, 0]]) / 3)


def test_micro_batches_share_the_batch_s_denominator():
    # the same two rows in one micro-batch or one at a time: the same loss in total
    logprobs = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -9.0, -9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    whole = sft.sft_loss(logprobs, mask, 3.0)
    parts = sft.sft_loss(logprobs[:1], mask[:1], 3.0) + sft.sft_loss(logprobs[1:], mask[1:], 3.0)
    assert whole.item() == pytest.approx(parts.item())


# ---- the worked solutions -----------------------------------------------------------------------
def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_s_last_line_is_said_as_the_verifier_reads_it_and_its_calculator_spans_go(tmp_path):
    data = write(tmp_path / "g.jsonl", [{"question": "Natalia sold 48 clips, half as many in May. "
                                                     "How many in all?",
                                         "answer": "In May 48/2 = <<48/2=24>>24.\n"
                                                   "48+24 = <<48+24=72>>72.\n#### 72"}])
    env = make_env("gsm8k", path=data)
    assert env.solutions(say=lambda _: None) == [
        "In May 48/2 = 24.\n48+24 = 72.\nThe answer is 72."]


def test_generated_arithmetic_has_a_worked_line_the_verifier_pays_for():
    env = make_env("arithmetic", num_examples=50, difficulty="mixed")
    texts = env.solutions(say=lambda _: None)
    for k, text in enumerate(texts):
        assert text.endswith(f"The answer is {env.examples[k]['answer']}.")
        assert env.verify(text, k)[0] == 1.0
    # a level-1 problem's line is its sum: "What is 47 + 38?" -> "47 + 38 = 85."
    first = next(k for k, ex in enumerate(env.examples) if ex["level"] == 1)
    expr = env.examples[first]["question"].removeprefix("What is ").removesuffix("?")
    assert texts[first].split("\n")[0] == f"{expr} = {env.examples[first]['answer']}."


def test_the_worked_lines_leave_the_stream_of_problems_as_it_was():
    # the RL files draw the same problems with and without the solutions: a question and its
    # answer depend on the seed alone (the words of a worked line use no random draw); these are
    # the problems the generator drew before it wrote worked lines
    env = make_env("arithmetic", num_examples=3, difficulty="5")
    assert [ex["answer"] for ex in env.examples] == ["185", "30", "354"]
    assert env.examples[0]["question"].startswith("Noah reads 63 pages a day for ")
    assert env.examples[1]["question"].startswith("Leo buys 5 notebooks that cost")


def test_countdown_s_expression_is_put_in_the_answer_tags():
    env = make_env("countdown", num_examples=3)
    texts = env.solutions(say=lambda _: None)
    assert all(t.startswith("<answer> ") and t.endswith(" </answer>") for t in texts)
    assert [env.verify(t, k)[0] for k, t in enumerate(texts)] == [1.0, 1.0, 1.0]


def test_a_solution_key_names_the_field_of_another_file(tmp_path):
    data = write(tmp_path / "m.jsonl", [{"problem": "What is $1 + 1$?", "answer": "2",
                                         "rationale": "One and one: $\\boxed{2}$."}])
    args = parse_args(sft.Args, ["--dataset_name", "math", "--dataset_path", str(data),
                                 "--solution_key", "rationale"])
    env, _ = sft.make_envs(replace(args, num_eval_problems=0), say=lambda _: None)
    assert env.solutions(say=lambda _: None) == ["One and one: $\\boxed{2}$."]


# ---- bad data: one line, before the weights load ----------------------------------------------
@pytest.fixture
def no_weights(monkeypatch):
    """sft.main up to the weights: loading them fails the test."""
    def refuse(*a, **k):
        raise AssertionError("the weights loaded before the data was refused")
    monkeypatch.setattr(sft, "trained_policy", refuse)


@pytest.mark.parametrize("rows,flags,says", [
    ([{"problem": "What is $1 + 1$?", "answer": "2"}], [],
     "row 1: no worked solution (an empty or missing 'solution' field): give the rows one, or "
     "name their field with --solution_key."),
    ([{"problem": "What is $1 + 1$?", "answer": "2", "solution": "  "}], [],
     "no worked solution"),
    ([{"question": "Tom has 3 apples and buys 4. How many?", "answer": "7",
       "solution": "3 + 4 = 7 apples."}], ["--dataset_name", "gsm8k"],
     "row 1: the verifier does not read the gold answer '7' in the solution's end ('3 + 4 = 7 "
     "apples.'): end it as the task asks ('The answer is N.')."),
    ([{"problem": "What is $1 + 1$?", "answer": "2", "solution": "$\\boxed{3}$"}], [],
     "the verifier does not read the gold answer '2'"),
    ([{"problem": "What is $1 + 1$?", "answer": "2"}], ["--solution_key", "worked"],
     "--solution_key 'worked': the rows have no such field"),
])
def test_bad_solutions_are_refused_naming_the_row_and_the_fix(tmp_path, no_weights, rows, flags,
                                                              says):
    data = write(tmp_path / "d.jsonl", rows)
    args = parse_args(sft.Args, [*TINY, "--dataset_name", "math", "--dataset_path", str(data),
                                 "--output_dir", str(tmp_path / "out"), *flags])
    with pytest.raises(UsageError) as e:
        sft.main(args)
    assert says in str(e.value)


def test_a_budget_shorter_than_the_longest_solution_says_how_many_it_would_cut(tmp_path,
                                                                               no_weights):
    # tiny-random's tokens of arithmetic's worked lines: 18, 20 or 22 with the end token
    args = parse_args(sft.Args, [*TINY, "--max_new_tokens", "21", "--output_dir",
                                 str(tmp_path / "out")])
    tokenizer = load_tokenizer("tiny-random")
    env, _ = sft.make_envs(args, say=lambda _: None)
    lengths = [len(x) + 1 for x in tokenizer(env.solutions(say=lambda _: None),
                                             add_special_tokens=False)["input_ids"]]
    cut = sum(n > 21 for n in lengths)
    assert 0 < cut < len(lengths)
    with pytest.raises(UsageError) as e:
        sft.main(args)
    assert str(e.value) == (f"--max_new_tokens 21 would cut {cut:,} of the 10,000 worked "
                            f"solutions (the longest is {max(lengths)} tokens with its end "
                            f"token): pass --max_new_tokens {max(lengths)}, or train on rows "
                            "whose solutions fit.")


def test_reward_functions_are_refused_as_an_rl_file_s_option(tmp_path):
    with pytest.raises(UsageError, match="sft.py trains on worked solutions, not on rewards"):
        sft.main(parse_args(sft.Args, [*TINY, "--reward_fn", "x.py:f",
                                       "--output_dir", str(tmp_path / "o")]))


# ---- an update -----------------------------------------------------------------------------------
def test_an_update_s_loss_is_transformers_own_with_the_prompt_labelled_minus_100(tmp_path):
    # The loss of the first update (learning rate 0: the weights do not move) against the model's
    # own loss with labels -100 on the prompt and on padding: the mean over the solutions' tokens,
    # the end token included. A batch that puts the prompt in its targets fails this.
    out = tmp_path / "run"
    sft.main(parse_args(sft.Args, [*TINY, "--learning_rate", "0", "--output_dir", str(out)]))
    logged = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    args = parse_args(sft.Args, TINY)
    env, _ = sft.make_envs(args, say=lambda _: None)
    tokenizer = load_tokenizer("tiny-random")
    problems = sft.prompt_indices(0, 4, len(env), 0)
    prompts = encode_prompts(tokenizer, [env.prompt(p) for p in problems])
    targets = [tokenizer(env.solutions(say=lambda _: None)[p],
                         add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
               for p in problems]
    width = max(len(p) + len(t) for p, t in zip(prompts, targets))
    ids = torch.full((4, width), tokenizer.pad_token_id)
    labels, attention = torch.full((4, width), -100), torch.zeros(4, width, dtype=torch.long)
    for k, (p, t) in enumerate(zip(prompts, targets)):  # right-padded, as transformers pads
        ids[k, :len(p) + len(t)] = torch.tensor(p + t)
        labels[k, len(p):len(p) + len(t)] = torch.tensor(t)
        attention[k, :len(p) + len(t)] = 1
    with torch.no_grad():
        expected = load_policy("tiny-random")(input_ids=ids, attention_mask=attention,
                                              labels=labels).loss
    assert logged["loss"] == pytest.approx(expected.item(), rel=1e-5)
    assert logged["response_len/mean"] == sum(map(len, targets)) / 4


def test_one_update_lowers_the_loss_of_its_own_batch(tmp_path):
    # a file of 4 problems, 4 an update: the second update takes the same 4 solutions, which
    # score lower after one step of 1e-3 on them
    data = write(tmp_path / "a.jsonl", [{"question": f"What is {q} + 1?", "answer": str(q + 1),
                                         "solution": f"{q} + 1 = {q + 1}.\nThe answer is {q + 1}."}
                                        for q in range(4)])
    out = tmp_path / "run"
    sft.main(parse_args(sft.Args, [*TINY, "--dataset_path", str(data), "--max_steps", "2",
                                   "--learning_rate", "1e-3", "--output_dir", str(out)]))
    first, second = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert second["loss"] < first["loss"] - 0.1  # 10.81 -> 10.56 when written


# ---- its checkpoint trains under an RL file -------------------------------------------------------
@pytest.mark.parametrize("lora", [False, True])
def test_grpo_trains_from_sft_s_checkpoint(tmp_path, lora):
    sft_out, rl_out = tmp_path / "sft", tmp_path / "grpo"
    extra = ["--lora_r", "4"] if lora else []
    done = warm.run([sys.executable, "sft.py", *TINY, *extra, "--learning_rate", "1e-3",
                     "--output_dir", str(sft_out)], cwd=ROOT, capture_output=True, text=True,
                    timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    checkpoint = sft_out / "checkpoint-1"
    assert (checkpoint / ("adapter_config.json" if lora else "config.json")).is_file()
    done = warm.run([sys.executable, "grpo.py", "--model_name_or_path", str(checkpoint),
                     "--max_new_tokens", "8", "--num_eval_problems", "0", "--num_prompts", "2",
                     "--num_generations", "2", "--max_steps", "1", "--output_dir", str(rl_out)],
                    cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (rl_out / "checkpoint-1" / "config.json").is_file()
    # what grpo.py started from is what sft.py saved, not tiny-random
    trained, base = load_policy(str(checkpoint)), load_policy("tiny-random")
    moved = sum((a - b).abs().sum().item()
                for a, b in zip(trained.parameters(), base.parameters()))
    assert moved > 0
    args = json.loads((rl_out / "args.json").read_text())
    assert args["model_name_or_path"] == str(checkpoint)


# ---- against TRL's own code -------------------------------------------------------------------
@pytest.mark.slow  # the second tier: TRL's code
def test_the_loss_and_gradient_equal_trls_sft_trainer_on_the_same_batch(tmp_path):
    # sft.py's loss on a fixed batch (two prompts x 4 solutions of 1 to 5 tokens) against
    # SFTTrainer's training_step with completion_only_loss, from the same weights: TRL builds its
    # labels from the completion mask (-100 on the prompt), pads on the right, and takes the mean
    # over the labelled tokens, as sft.py's token mean does.
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer
    from trl_steps import a_batch, moved_policy

    from common.models import token_logprobs

    batch = a_batch()
    gen, policy = batch.gen(), moved_policy()
    input_ids, attention_mask = gen.sequences()
    mask = gen.response_mask
    logprobs, _ = token_logprobs(policy, input_ids, attention_mask, mask.shape[1])
    loss = sft.sft_loss(logprobs, mask, sft.loss_normaliser(mask, world_size=1))
    loss.backward()

    rows = [(p.tolist(), c[m.bool()].tolist())
            for p, c, m in zip(batch.prompt_ids, batch.completion_ids, batch.completion_mask)]
    data = Dataset.from_dict({"input_ids": [p + c for p, c in rows],
                              "completion_mask": [[0] * len(p) + [1] * len(c) for p, c in rows]})
    config = SFTConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False,
                       per_device_train_batch_size=len(rows), completion_only_loss=True,
                       max_length=None, gradient_checkpointing=False)
    trainer = SFTTrainer(model=moved_policy(), args=config, train_dataset=data,
                         processing_class=load_tokenizer("tiny-random"))
    inputs = next(iter(trainer.get_train_dataloader()))  # all 8 rows, in TRL's order
    assert (inputs["labels"] != -100).sum().item() == mask.sum().item() == 27
    trainer.current_gradient_accumulation_steps = 1
    trl_loss = trainer.training_step(trainer.model, inputs)
    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-5)
    for (name, ours), theirs in zip(policy.named_parameters(), trainer.model.parameters()):
        # fp32 rounding, and TRL's chunked log-softmax: under 1e-6 of the gradient's norm
        assert ((ours.grad - theirs.grad).norm() / theirs.grad.norm()).item() < 2e-6, name


def test_a_bad_solution_is_one_line_on_the_command_line(tmp_path):
    data = write(tmp_path / "d.jsonl", [{"question": "Tom has 3 apples and buys 4. How many?",
                                         "answer": "7", "solution": "3 + 4 = 7 apples."}])
    done = warm.run([sys.executable, "sft.py", "--dataset_name", "gsm8k", "--dataset_path",
                     str(data), "--output_dir", str(tmp_path / "out")], cwd=ROOT,
                    capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: {data}: row 1: the verifier does not read the gold answer '7' in the solution's "
        "end ('3 + 4 = 7 apples.'): end it as the task asks ('The answer is N.').")
    assert not (tmp_path / "out" / "metrics.jsonl").exists()
