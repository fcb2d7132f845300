"""common/run/plot.py: reading run logs (resumed runs included) and drawing the PNG files."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from common.run import plot
from common.run.logger import json_line

pytestmark = pytest.mark.slow  # the second tier: plots

ROOT = Path(__file__).resolve().parents[1]


def fake_run(path, metrics, evals, args=None):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (path / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (path / "args.json").write_text(json.dumps(args or {}))
    return path


def test_read_log_stitches_a_resumed_run(tmp_path):
    # steps 1-3, a crash, then a resume from checkpoint-2 whose clock starts again at 0
    lines = [{"step": 1, "time": 10.0, "reward/mean": 0.1},
             {"step": 2, "time": 20.0, "reward/mean": 0.2},
             {"step": 3, "time": 30.0, "reward/mean": 0.3},
             {"step": 3, "time": 12.0, "reward/mean": 0.35},
             {"step": 4, "time": 22.0, "reward/mean": 0.4}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 5, "ti')
    rows = plot.read_log(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # the cut-off last line is skipped
    assert [r["time"] for r in rows] == [10.0, 20.0, 42.0, 52.0]  # 30 + 12, 30 + 22
    assert rows[2]["reward/mean"] == 0.35  # the replayed step keeps its last value
    assert plot.read_log(tmp_path / "missing.jsonl") == []


def test_a_nan_the_logger_wrote_as_null_is_skipped(tmp_path):
    lines = [{"step": 1, "time": 1.0, "explained_variance": 0.5},
             {"step": 2, "time": 2.0, "explained_variance": math.nan},  # returns all equal: 0 / 0
             {"step": 3, "time": 3.0, "explained_variance": -0.25}]
    (tmp_path / "metrics.jsonl").write_text("".join(json_line(x) + "\n" for x in lines))
    rows = plot.read_log(tmp_path / "metrics.jsonl")
    assert rows[1]["explained_variance"] is None and rows[1]["nonfinite"] == 1
    assert plot.series(rows, "explained_variance") == ([1, 3], [1.0, 3.0], [0.5, -0.25])


def test_kl_key_labels_and_ema():
    assert plot.kl_key([{"approx_kl": 0.0}, {"approx_kl": 0.1, "kl_ref": 0.2}]) == "kl_ref"
    assert plot.kl_key([{"approx_kl": 0.0}]) == "approx_kl"
    assert plot.run_labels(["a/grpo", "b/grpo", "b/ppo"]) == ["a/grpo", "b/grpo", "ppo"]
    # bias-corrected
    assert plot.ema([1.0, 3.0], 0.5) == pytest.approx([1.0, (0.5 * 0.5 + 1.5) / 0.75])


def test_plot_writes_pngs_for_two_runs(tmp_path):
    pytest.importorskip("matplotlib")
    a = fake_run(tmp_path / "runs" / "grpo", [
        {"step": s, "time": 30.0 * s, "reward/mean": 0.1 * s, "response_len/mean": 60 - s,
         "approx_kl": 0.0}
        for s in range(1, 5)],
        [{"step": 0, "time": 5.0, "eval/accuracy": 0.1},
         {"step": 4, "time": 130.0, "eval/accuracy": 0.3}])
    b = fake_run(tmp_path / "runs" / "ppo", [
        {"step": s, "time": 50.0 * s, "reward/mean": 0.05 * s, "response_len/mean": 50,
         "kl_ref": 0.01 * s}
        for s in range(1, 4)], [{"step": 0, "time": 5.0, "eval/accuracy": 0.1}])
    out = tmp_path / "plots"
    result = subprocess.run([sys.executable, "-m", "common.run.plot", str(a), str(b), "--out", str(out),
                             "--smooth", "0.5"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    paths = [out / "curves_step.png", out / "curves_time.png"]
    assert result.stdout.split() == [str(p) for p in paths]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


def test_bad_run_folder_and_missing_matplotlib(tmp_path):
    result = subprocess.run([sys.executable, "-m", "common.run.plot", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 2 and "is not a run folder: it has no metrics.jsonl" in result.stderr
    run = fake_run(tmp_path / "run", [{"step": 1, "time": 1.0, "reward/mean": 0.5}], [])
    # matplotlib made unimportable: None in sys.modules makes `import matplotlib` raise ImportError
    code = f"import sys; sys.modules['matplotlib'] = None; from common.run.plot import main; sys.exit(main([{str(run)!r}]))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 1 and "pip install matplotlib" in result.stderr
    assert not (run / "curves_step.png").exists()
