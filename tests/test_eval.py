"""eval.py: pass@k and maj@k against hand-worked cases, regrading saved completions (hand-made files
and the real GSM8K / MATH-500 reference solutions), and end-to-end runs on a tiny checkpoint (1
process, torchrun)."""

import json
import sys
from dataclasses import fields, replace
from fractions import Fraction
from pathlib import Path

import pytest

import eval as ev
from common.run.args import field_docs, make_parser, parse_args
from common.env.math_env import make_env
import common.run.evaluation as evaluation
from common.run.evaluation import evaluate
from common.errors import UserError
from common.models.loading import load_policy, load_tokenizer, tiny_random_model
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def run(cmd, **kw):
    out = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


# ---- pass@k and maj@k -------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,c,k,expected", [
    (5, 2, 2, 1 - 3 / 10),    # 1 - C(3,2)/C(5,2)
    (5, 1, 1, 1 / 5),         # pass@1 = c / n
    (10, 3, 4, 1 - 35 / 210),  # 1 - C(7,4)/C(10,4)
    (4, 0, 4, 0.0),
    (4, 4, 1, 1.0),
    (3, 2, 2, 1.0),           # n - c = 1 < k: every pair holds a correct sample
])
def test_pass_at_k_hand_values(n, c, k, expected):
    assert evaluation.pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_is_the_mean_over_all_subsets():
    # n = 4 samples, correct = [1, 0, 1, 0]: of the 6 pairs only {1, 3} misses, so pass@2 = 5/6
    assert evaluation.pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        evaluation.pass_at_k(4, 2, 5)


def test_majority_vote_ties_go_to_the_first_seen_and_no_answer_never_wins():
    keys = [5, 3, 3, None, 5]
    assert evaluation.majority_vote(keys, 3) == 1  # 3 has two votes, 5 one
    assert evaluation.majority_vote(keys, 5) == 0  # 5 and 3 both have two; 5 was seen first
    # two samples without an answer do not outvote one
    assert evaluation.majority_vote([None, None, 7], 3) == 2
    assert evaluation.majority_vote([None, None], 2) is None


def test_answers_without_the_marker_have_no_vote():
    # one marked 4 (right) against two bare 5s: the bare numbers get no reward, so they must not
    # outvote it
    samples = [ev.grade("gsm8k", text, "4") for text in ("The answer is 4.", "5", "so it is 5")]
    assert [s["pred"] for s in samples] == ["4", "5",
                                            "5"] and [s["format_ok"] for s in samples] == [True, False, False]
    assert evaluation.problem_metrics("gsm8k", samples, [3])["maj@3"] is True


def test_vote_keys_compare_numbers_numerically_and_math_by_normalised_latex():
    assert evaluation.vote_key("gsm8k", "18") == evaluation.vote_key("gsm8k",
                                                     "18.00") == evaluation.vote_key("gsm8k", "18.") == Fraction(18)
    assert evaluation.vote_key("arithmetic", "1,000") == 1000
    assert evaluation.vote_key("math", "\\dfrac{1}{2}") == evaluation.vote_key("math", "\\frac{1}{2}")
    # documented: grouped as strings
    assert evaluation.vote_key("math", "\\frac{1}{2}") != evaluation.vote_key("math", "0.5")
    assert evaluation.vote_key("countdown", "(1 + 2) * 3") == evaluation.vote_key("countdown", "(1+2)*3")
    assert evaluation.vote_key("gsm8k", None) is None


def test_problem_metrics_and_summary_by_hand():
    # problem A: preds 7, 7.0, 9, None with the gold 9 -> 1 correct of 4; the majority (7) is wrong
    a = [{"pred": "7", "correct": False}, {"pred": "7.0", "correct": False},
         {"pred": "9", "correct": True},
         {"pred": None, "correct": False}]
    # problem B: preds 4, 4, 5, 4 with the gold 4 -> 3 correct of 4; the majority is right
    b = [{"pred": "4", "correct": True}, {"pred": "4", "correct": True},
         {"pred": "5", "correct": False},
         {"pred": "4", "correct": True}]
    # marked answers
    a, b = ([{**s, "format_ok": s["pred"] is not None} for s in x] for x in (a, b))
    ma, mb = evaluation.problem_metrics("gsm8k", a, [1, 2, 4]), evaluation.problem_metrics("gsm8k", b, [1, 2, 4])
    assert ma == {"num_correct": 1, "pass@1": 0.25, "maj@1": False, "pass@2": 0.5, "maj@2": False,
                  "pass@4": 1.0, "maj@4": False}
    assert mb == {"num_correct": 3, "pass@1": 0.75, "maj@1": True, "pass@2": 1.0, "maj@2": True,
                  "pass@4": 1.0, "maj@4": True}
    records = []
    for samples, m in ((a, ma), (b, mb)):
        samples = [{**s, "reward": float(s["correct"]), "format_ok": s["pred"] is not None,
                    "length": 10,
                    "truncated": s["pred"] is None} for s in samples]
        records.append({"responses": samples, **m})
    summary = ev.summarize(records, [1, 2, 4])
    assert summary["accuracy"] == pytest.approx(0.5)  # (1/4 + 3/4) / 2
    assert summary["pass@2"] == pytest.approx(0.75) and summary["pass@4"] == 1.0
    assert summary["maj@4"] == 0.5 and summary["maj@1"] == 0.5
    assert summary["no_answer_frac"] == summary["truncated_frac"] == 1 / 8
    assert summary["reward/mean"] == 0.5 and summary["response_len/mean"] == 10
    assert not any(k.startswith("accuracy/level_") for k in summary)  # the rows had no level
    # with levels: a third problem at level 2 with 3 of 4 right; level 1 holds A and B
    records = [{**records[0], "level": 1}, {**records[1], "level": 1},
               {**records[0], "num_correct": 3, "level": 2}]
    summary = ev.summarize(records, [1])
    assert summary["accuracy/level_1"] == pytest.approx(0.5)  # (1/4 + 3/4) / 2
    assert summary["accuracy/level_2"] == pytest.approx(0.75) and "accuracy/level_3" not in summary


# ---- argument errors, before any model loads ----------------------------------------------------------
@pytest.mark.parametrize("change,message", [
    (dict(num_generations=4), "--temperature 0 gives 4 copies"),
    (dict(num_generations=4, temperature=0.7, k=[1, 8]), "every k must be between 1 and --n"),
    (dict(model_name_or_path="./no/such/ckpt"), "no such folder"),
    (dict(dataset_name="prealgebra", responses="saved.jsonl"), "pass --dataset_name math and no"),
    (dict(levels="1-2", responses="saved.jsonl"), "a MATH subject or --levels would filter nothing"),
    (dict(responses="/no/such/file.jsonl"), "--responses /no/such/file.jsonl: no such file"),
])
def test_bad_arguments_fail_with_the_fix(change, message):
    with pytest.raises(UserError, match=message):
        ev.check_args(replace(ev.Args(), **change))


def test_a_dataset_name_it_cannot_read_is_one_line_naming_what_it_takes(tmp_path):
    out = warm.run([sys.executable, "eval.py", "--model_name_or_path", "tiny-random",
                    "--dataset_name", "aime", "--output", str(tmp_path / "e.jsonl")],
                   cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode != 0 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: --dataset_name 'aime': not a task (arithmetic, countdown, "
                                 "gsm8k, math), a MATH subject (prealgebra, algebra, "), out.stderr
    assert "a data file or a hub dataset id" in out.stderr


def test_help_documents_every_field():
    out = make_parser(ev.Args).format_help()
    docs = field_docs(ev.Args)
    for f in fields(ev.Args):
        assert f"--{f.name}" in out and docs.get(f.name), f.name
    assert "--n NUM_GENERATIONS" in out


# ---- --responses: regrading without a model -----------------------------------------------------------
def test_regrade_a_hand_made_file(tmp_path):
    rows = [
        {"question": "q0", "answer": "18",
         "response": "So she makes 9 * 2 = 18 dollars. The answer is 18."},
        # gold from '####'; wrong
        {"answer": "Half of 8 is 4.\n#### 4", "response": "The answer is 5."},
        {"index": 7, "answer": "1,000",
         "responses": ["The answer is 1000.", "about 999", "\\boxed{1,000}"]},
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "regraded.jsonl"
    summary = ev.main(replace(ev.Args(), dataset_name="gsm8k", responses=str(path),
                              output=str(out)))
    records = read_jsonl(out)
    assert [r["index"] for r in records] == [0, 1, 7]
    assert [r["answer"] for r in records] == ["18", "4", "1000"]
    assert [[s["correct"] for s in r["responses"]] for r in records] == [[True], [False], [True, False, True]]
    assert [s["pred"] for s in records[2]["responses"]] == ["1000", "999", "1000"]
    assert [s["format_ok"] for s in records[2]["responses"]] == [True, False, True]
    # k defaults to 1 and the smallest n (1): accuracy = (1 + 0 + 2/3) / 3
    assert summary["accuracy"] == pytest.approx(5 / 9)
    assert summary["maj@1"] == pytest.approx(2 / 3)
    assert json.loads(out.with_name("regraded.summary.json").read_text())["accuracy"] == pytest.approx(5 / 9)


def test_an_existing_results_file_is_kept_unless_overwrite_is_given(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"answer": "18", "response": "The answer is 18."}) + "\n")
    out = tmp_path / "regraded.jsonl"
    out.write_text("an earlier evaluation\n")
    args = replace(ev.Args(), dataset_name="gsm8k", responses=str(path), output=str(out))
    with pytest.raises(UserError, match=f"--output {out} exists \\(an earlier evaluation\\): "
                                        "pass --overwrite to replace it, or another --output"):
        ev.main(args)
    assert out.read_text() == "an earlier evaluation\n"
    assert ev.main(replace(args, overwrite=True))["accuracy"] == 1.0
    assert read_jsonl(out)[0]["answer"] == "18"


def test_regrade_reads_its_own_output_and_grades_again(tmp_path):
    # eval.py's own format: the saved grades are ignored and recomputed, lengths are kept
    rows = [{"index": 3, "question": "What is 2 + 2?", "answer": "4", "responses": [
        {"response": "The answer is 4.", "correct": False, "length": 6, "truncated": False},
        {"response": "The answer is 5.", "correct": True, "length": 6, "truncated": False},
        {"response": "4 4 4", "length": 3, "truncated": True}]}]
    path = tmp_path / "saved.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n")
    summary = ev.main(replace(ev.Args(), responses=str(path), output=str(tmp_path / "out.jsonl"),
                              k=[1, 2, 3]))
    (record,) = read_jsonl(tmp_path / "out.jsonl")
    # "4 4 4" has no answer marker: no reward (data/README.md, grading policy)
    assert [s["correct"] for s in record["responses"]] == [True, False, False]
    assert record["pass@2"] == pytest.approx(1 - 1 / 3)  # n=3, c=1: 1 - C(2, 2) / C(3, 2)
    assert record["maj@2"] is True  # 4 (first seen) ties with 5
    assert summary["response_len/mean"] == 5 and summary["truncated_frac"] == pytest.approx(1 / 3)


def test_regrade_countdown_output_keeps_its_json_gold(tmp_path):
    env = make_env("countdown", "test")
    ex = env.examples[0]
    row = {"index": 0, "question": ex["question"], "answer": ex["answer"],
           "responses": [{"response": f"<answer>{ex['solution']}</answer>"},
                         {"response": "<answer>1 + 1</answer>"}]}
    (tmp_path / "cd.jsonl").write_text(json.dumps(row) + "\n")
    ev.main(replace(ev.Args(), dataset_name="countdown", responses=str(tmp_path / "cd.jsonl"),
                    output=str(tmp_path / "out.jsonl")))
    (record,) = read_jsonl(tmp_path / "out.jsonl")
    assert [s["reward"] for s in record["responses"]] == [1.0, 0.1]


def test_regrade_without_a_response_field_names_the_fix(tmp_path):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"question": "q", "answer": "18"}) + "\n")
    args = replace(ev.Args(), dataset_name="gsm8k", responses=str(tmp_path / "bad.jsonl"),
                   output=str(tmp_path / "o.jsonl"))
    # a bare gold number is no reference solution: grading it against itself would say nothing
    with pytest.raises(ValueError,
                       match="row 1 has no 'response' or 'responses' field .* --response_field"):
        ev.main(args)
    with pytest.raises(ValueError, match="has no 'text' field"):
        ev.main(replace(args, response_field="text"))


@pytest.mark.skipif(not (SHARED / "gsm8k_test.jsonl").is_file(), reason=f"{SHARED} not found")
def test_regrade_gsm8k_reference_solutions_is_100_percent(tmp_path, capsys):
    ev.main(parse_args(ev.Args, [
        "--dataset_name", "gsm8k", "--responses", str(SHARED / "gsm8k_test.jsonl"), "--output",
        str(tmp_path / "gsm8k.jsonl")]))
    out = capsys.readouterr().out
    assert "graded field 'answer' of 1319 rows" in out
    assert "accuracy: 1.0000 (1319/1319 correct)" in out
    assert len(read_jsonl(tmp_path / "gsm8k.jsonl")) == 1319


@pytest.mark.skipif(not (SHARED / "math500_test.jsonl").is_file(), reason=f"{SHARED} not found")
def test_regrade_math500_reference_solutions(tmp_path):
    args = replace(ev.Args(), dataset_name="math", responses=str(SHARED / "math500_test.jsonl"),
                   output=str(tmp_path / "m.jsonl"))
    summary = ev.main(args)
    assert summary["num_problems"] == 500 and summary["accuracy"] == 1.0


# ---- end to end on a tiny checkpoint ------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint-3"
    tiny_random_model().save_pretrained(path)
    load_tokenizer("tiny-random").save_pretrained(path)
    return path


def test_eval_checkpoint_greedy_matches_the_training_evaluator(checkpoint, tmp_path):
    out = run([sys.executable, "eval.py", "--model_name_or_path", str(checkpoint), "--dataset_name",
               "arithmetic",
               "--split", "test", "--num_eval_problems", "6", "--max_new_tokens", "8",
               "--batch_size", "4",
               "--output", str(tmp_path / "e.jsonl")]).stdout
    records = read_jsonl(tmp_path / "e.jsonl")
    assert len(records) == 6
    solved = sum(r["num_correct"] for r in records)
    assert f"accuracy: {solved / 6:.4f} ({solved}/6 correct)" in out
    # the same problems, prompts and greedy responses as the evaluation inside the training scripts
    env = make_env("arithmetic", "test", difficulty="1-2")
    acc, expected = evaluate(load_policy(str(checkpoint)), load_tokenizer(str(checkpoint)), env, 6,
                             8,
                             return_records=True)
    assert [r["index"] for r in records] == [r["index"] for r in expected]
    assert [r["responses"][0]["response"] for r in records] == [r["response"] for r in expected]
    assert [r["answer"] for r in records] == [env.examples[r["index"]]["answer"] for r in records]
    assert acc == solved / 6
    summary = json.loads((tmp_path / "e.summary.json").read_text())
    assert summary["num_problems"] == 6 and summary["args"]["max_new_tokens"] == 8


@pytest.mark.parametrize("stepwise", [False, True])
def test_the_training_evaluation_shows_its_progress_batch_by_batch(stepwise, capsys):
    # 8 problems in batches of 4: the bar shows 0/8 before the first batch (a first batch can take
    # minutes on a busy CPU), then 4/8 and 8/8, with the rate
    env = make_env("arithmetic", "test", difficulty="1-2", stepwise=stepwise, max_steps=2)
    evaluate(load_policy("tiny-random"), load_tokenizer("tiny-random"), env, 8, 2, batch_size=4)
    err = capsys.readouterr().err
    shown = [err.find(f"| {n}/8 [") for n in (0, 4, 8)]
    assert -1 < shown[0] < shown[1] < shown[2] and "held-out eval:" in err[:shown[0]], err
    assert "problem/s]" in err[shown[1]:]


def test_sampled_eval_is_the_same_with_any_batch_size_and_under_torchrun(checkpoint, tmp_path, monkeypatch):
    common = ["--model_name_or_path", str(checkpoint), "--num_eval_problems", "4",
              "--max_new_tokens", "6",
              "--num_generations", "3", "--temperature", "1.0", "--k", "1", "2", "3"]
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
         "29561",
         "eval.py", *common, "--batch_size", "3", "--output", str(tmp_path / "two.jsonl")])
    # in-process, with a grade that varies for a random model: correct when the response has an even
    # length
    real_make_env = ev.make_env

    def make_env_even(*a, **kw):
        env = real_make_env(*a, **kw)
        env.verify = lambda text, i: (float(len(text) % 2 == 0),
                                     {"correct": len(text) % 2 == 0, "format_ok": True,
                                      "pred": str(len(text) % 2)})
        return env

    monkeypatch.setattr(ev, "make_env", make_env_even)
    args = parse_args(ev.Args,
                      common + ["--eval_batch_size", "12", "--output", str(tmp_path / "one.jsonl")])
    summary = ev.main(args)
    one, two = read_jsonl(tmp_path / "one.jsonl"), read_jsonl(tmp_path / "two.jsonl")
    texts = [[s["response"] for s in r["responses"]] for r in one]
    assert texts == [[s["response"] for s in r["responses"]] for r in two]
    assert len({t for row in texts for t in row}) > 1  # really sampled
    correct = [[len(t) % 2 == 0 for t in row] for row in texts]
    assert summary["accuracy"] == pytest.approx(sum(map(sum, correct)) / 12)
    assert summary["pass@3"] == pytest.approx(sum(any(c) for c in correct) / 4)
    # the votes are the parities: maj@3 is right when most samples have an even length
    assert summary["maj@3"] == pytest.approx(sum(sum(c) >= 2 for c in correct) / 4)


# ---- --dataset_name as training takes it: a MATH subject, a data file -----------------------------------
# A MATH-format file: MATH's own 'type' and MATH-500's 'subject' name the subject, levels as "Level N"
MATH_ROWS = [
    {"problem": "What is $2+2$?", "solution": "$2+2=\\boxed{4}$", "type": "Prealgebra",
     "level": "Level 1"},
    {"problem": "Solve $x+1=8$.", "solution": "$x=\\boxed{7}$", "type": "Algebra", "level": "Level 1"},
    {"problem": "What is $3\\cdot 3$?", "solution": "$\\boxed{9}$", "type": "Prealgebra",
     "level": "Level 3"},
    {"problem": "In how many orders can 2 books stand?", "solution": "$\\boxed{2}$",
     "type": "Counting & Probability", "level": "Level 2"},
    {"problem": "What is $10-5$?", "solution": "$\\boxed{5}$", "subject": "Prealgebra", "level": 2},
    {"problem": "What is $6/2$?", "solution": "$\\boxed{3}$", "type": "Prealgebra", "level": "Level 5"},
    {"problem": "What is $1+1$?", "solution": "$\\boxed{2}$", "type": "Prealgebra", "level": "Level 2"},
]
# A GSM8K-format file: the gold is the number after '####'
GSM8K_ROWS = [
    {"question": "Sam has 3 apples and buys 4 more. How many apples does he have?",
     "answer": "3 + 4 = <<3+4=7>>7\n#### 7", "response": "He has 3 + 4 = 7 apples. The answer is 7."},
    {"question": "A box holds 6 pens. How many pens are in 2 boxes?",
     "answer": "6 * 2 = <<6*2=12>>12\n#### 12", "response": "6 * 2 = 12, so the answer is 13."},
    {"question": "Mia saves 250 dollars a month. How much does she save in 4 months?",
     "answer": "250 * 4 = <<250*4=1000>>1000\n#### 1,000", "response": "250 * 4 = 1000\n#### 1000"},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_math_subject_and_levels_pick_the_problems_training_picks(checkpoint, tmp_path,
                                                                    monkeypatch, capsys):
    path = write_jsonl(tmp_path / "math.jsonl", MATH_ROWS)
    # a grade that a random model can pass: correct when the gold answer is even
    real_make_env = ev.make_env

    def make_env_even(*a, **kw):
        env = real_make_env(*a, **kw)
        env.verify = lambda text, i: (float(int(env.examples[i]["answer"]) % 2 == 0),
                                     {"correct": int(env.examples[i]["answer"]) % 2 == 0,
                                      "format_ok": True, "pred": env.examples[i]["answer"]})
        return env

    monkeypatch.setattr(ev, "make_env", make_env_even)
    summary = ev.main(parse_args(ev.Args, [
        "--model_name_or_path", str(checkpoint), "--dataset_name", "prealgebra", "--dataset_path",
        str(path), "--levels", "1-2", "--max_new_tokens", "4", "--output", str(tmp_path / "e.jsonl")]))
    records = read_jsonl(tmp_path / "e.jsonl")
    # prealgebra at levels 1 and 2: rows 1, 5 and 7 of the file (not algebra, counting, level 3 or 5)
    assert [r["question"] for r in records] == ["What is $2+2$?", "What is $10-5$?", "What is $1+1$?"]
    assert [r["answer"] for r in records] == ["4", "5", "2"]
    assert summary["num_problems"] == 3 and summary["accuracy"] == pytest.approx(2 / 3)  # 4 and 2
    assert "accuracy: 0.6667 (2/3 correct)" in capsys.readouterr().out
    # the same problems, in the same order, as training reads from the same options
    import grpo
    from common.env.math_env import make_envs

    train, _ = make_envs(replace(grpo.Args(), dataset_name="prealgebra", dataset_path=str(path),
                                 levels="1-2", num_eval_problems=0), say=lambda _: None)
    assert [ex["question"] for ex in train.examples] == [r["question"] for r in records]


def test_a_data_file_as_dataset_name_is_read_as_the_task_its_fields_say(checkpoint, tmp_path, capsys):
    path = write_jsonl(tmp_path / "mine.jsonl", GSM8K_ROWS)
    out = tmp_path / "e.jsonl"
    summary = ev.main(parse_args(ev.Args, [
        "--model_name_or_path", str(checkpoint), "--dataset_name", str(path), "--max_new_tokens",
        "4", "--output", str(out)]))
    assert f"| gsm8k {path}: 3 of 3 problems" in capsys.readouterr().out
    records = read_jsonl(out)
    assert [r["question"] for r in records] == [row["question"] for row in GSM8K_ROWS]
    assert [r["answer"] for r in records] == ["7", "12", "1000"]  # gsm8k's gold: after '####'
    # a random model's 4 tokens hold no "The answer is" or '####': no answer, no reward
    assert summary["accuracy"] == 0.0 and summary["format_ok_frac"] == 0.0


def test_a_data_file_as_dataset_name_regrades_its_responses(tmp_path):
    # as `python eval.py --dataset_name data.jsonl ...` in training: the task is read off the rows
    path = write_jsonl(tmp_path / "mine.jsonl", GSM8K_ROWS)
    out = run([sys.executable, "eval.py", "--dataset_name", str(path), "--responses", str(path),
               "--output", str(tmp_path / "r.jsonl")]).stdout
    # 7 right; 13 against the gold 12 wrong; '#### 1000' against '#### 1,000' right
    assert "graded field 'response' of 3 rows" in out and "accuracy: 0.6667 (2/3 correct)" in out
    records = read_jsonl(tmp_path / "r.jsonl")
    assert [[s["pred"] for s in r["responses"]] for r in records] == [["7"], ["13"], ["1000"]]
