"""bench/learning.py, which writes the results tables of docs/results.md: its statistics and
table by hand on made-up run folders, and one tiny real run through the whole script (a run that
finished is not run again; the plot command runs on it)."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from learning import FILES, mean_se, table, teacher_of  # noqa: E402

pytestmark = pytest.mark.slow  # the second tier: a bench's run


def test_mean_and_standard_error_by_hand():
    # sample s.d. of (0.2, 0.4, 0.6) is 0.2, so the standard error is 0.2 / sqrt(3)
    mean, se = mean_se([0.2, 0.4, 0.6])
    assert mean == pytest.approx(0.4) and se == pytest.approx(0.2 / math.sqrt(3))
    assert mean_se([0.3]) == (0.3, 0.0)


def fake_run(out, file, seed, accs, args):
    run_dir = out / "harder" / f"{file}-seed{seed}"
    run_dir.mkdir(parents=True)
    (run_dir / "eval.jsonl").write_text("".join(
        json.dumps({"step": s, "eval/accuracy": a}) + "\n" for s, a in accs.items()))
    (run_dir / "args.json").write_text(json.dumps(args))
    return {"file": file, "task": "harder", "seed": seed, "returncode": 0, "wall_s": 300.0 + seed,
            "peak_rss_gib": 4.0 + seed / 10}


def test_table_averages_seeds_and_keeps_one_row_per_file(tmp_path):
    grpo_args = {"num_prompts": 4, "num_generations": 8, "max_new_tokens": 64}
    records = [fake_run(tmp_path, "grpo", 0, {0: 0.2, 5: 0.3}, grpo_args),
               fake_run(tmp_path, "grpo", 1, {0: 0.2, 5: 0.5}, grpo_args),
               fake_run(tmp_path, "appo", 0, {0: 0.2, 5: 0.25},
                        {"num_envs": 8, "num_steps": 4, "max_new_tokens": 32}),
               {"file": "ppo", "task": "harder", "seed": 0, "returncode": 1}]  # failed: no row
    rows = table(records, tmp_path, "harder")
    # grpo at update 5: mean 0.4, s.d. 0.1414, s.e. 0.1; wall time the mean of 300 and 301 s
    assert rows["grpo"]["accuracy"] == pytest.approx([0.2, 0.4])
    assert rows["grpo"]["standard_error"] == pytest.approx([0.0, 0.1])
    assert set(rows) == {"grpo", "appo"}
    lines = (tmp_path / "harder.md").read_text().splitlines()
    assert lines[2] == ("| `grpo.py`, mean ± s.e. of 2 seeds | 4 prompts × 8 samples, ≤ 64 tokens | "
                        "at update 0 / 5: 0.200 ± 0.000 / 0.400 ± 0.100 | 5 min 0 s | 4.1 GiB |")
    assert lines[3] == ("| `appo.py` | 8 episodes × 4 steps, ≤ 32 tokens a step | "
                        "at update 0 / 5: 0.200 / 0.250 | 5 min 0 s | 4.0 GiB |")
    assert len(lines) == 4


def test_distills_teacher_is_the_last_checkpoint_of_grpos_run_of_the_first_seed(tmp_path):
    grpo = tmp_path / "harder" / "grpo-seed3"
    for step in (5, 20):  # by number: "checkpoint-5" sorts after "checkpoint-20" as text
        (grpo / f"checkpoint-{step}").mkdir(parents=True)
        (grpo / f"checkpoint-{step}" / "config.json").write_text("{}")
    assert teacher_of(tmp_path, "harder", 3) == str(grpo / "checkpoint-20")
    with pytest.raises(SystemExit, match="run with --files grpo distill"):
        teacher_of(tmp_path, "default", 3)


def test_one_tiny_run_through_the_script_and_no_rerun(tmp_path):
    command = [sys.executable, "bench/learning.py", "--out", str(tmp_path), "--tasks", "harder",
               "--files", "grpo", "--grpo_seeds", "3", "--", "--model_name_or_path", "tiny-random",
               "--max_steps", "1", "--num_prompts", "2", "--num_generations", "2",
               "--max_new_tokens", "8", "--num_eval_problems", "4"]
    first = warm.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = tmp_path / "harder" / "grpo-seed3"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["returncode"] == 0 and record["peak_rss_gib"] > 0.1
    assert record["command"][:8] == ["grpo.py", "--eval_interval", "5", "--seed", "3",
                                     "--output_dir", str(run_dir), "--difficulty"]
    args = json.loads((run_dir / "args.json").read_text())
    assert (args["difficulty"], args["seed"], args["num_prompts"]) == ("1-3", 3, 2)
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["tables"]["harder"]["grpo"]["steps"] == [0, 1]
    assert results["tables"]["harder"]["grpo"]["accuracy"] == [e["eval/accuracy"] for e in evals]
    if importlib.util.find_spec("matplotlib"):  # .ci/run installs it
        png = (tmp_path / "harder" / "curves_step.png").read_bytes()
        assert png[:4] == b"\x89PNG" and len(png) > 10_000
    else:
        assert "pip install matplotlib" in first.stderr
    # finished runs are kept: a second call only rewrites the table
    second = warm.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and "harder / grpo / seed 3" not in second.stdout
    assert json.loads((run_dir / "run.json").read_text()) == record


def test_the_docs_show_the_tables_the_bench_wrote_with_a_row_for_every_file():
    # dev/notes/results/ holds bench/learning.py's own output; docs/results.md must quote it unchanged
    readme = (ROOT / "docs" / "results.md").read_text()
    results = json.loads((ROOT / "dev" / "notes" / "results" / "results.json").read_text())
    for task in ("default", "harder"):
        lines = (ROOT / "dev" / "notes" / "results" / f"{task}.md").read_text().splitlines()
        assert len(lines) == 2 + len(FILES) and all(line in readme for line in lines)
        assert set(results["tables"][task]) == set(FILES)
        for row in results["tables"][task].values():  # every file ends above where it started
            assert row["accuracy"][-1] > row["accuracy"][0]
        assert f"img/learning/{task}/curves_step.png" in readme
        assert (ROOT / "docs" / "img" / "learning" / task / "curves_time.png").is_file()
