"""The TRL benchmark's summary arithmetic (the benchmark itself needs TRL and ~20 min: bench/trl_vs_mathrl.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from trl_vs_mathrl import summarize  # noqa: E402


def test_summary_ratios_and_rollout_time_by_hand():
    rows = {
        "trl": [{"seconds": s, "reward": r, "response_len": n} for s, r, n in
                [(40.0, 0.0, 50), (50.0, 0.5, 50), (60.0, 1.0, 50), (30.0, 0.5, 50)]],
        "mathrl": [{"seconds": s, "reward": r, "response_len": n, "update_s": u} for s, r, n, u in
                   [(20.0, 0.0, 40, 12.0), (30.0, 0.25, 40, 20.0), (10.0, 0.75, 20, 4.0), (40.0, 0.25, 100, 30.0)]],
    }
    out = summarize(rows, {"trl": 2000.0, "mathrl": 1000.0})
    assert out["median_step_s"] == {"trl": 45.0, "mathrl": 25.0}
    assert out["ratio_mathrl_over_trl"] == pytest.approx(25 / 45)
    # per token: mathrl 100 s / 200 tokens = 0.5, TRL 180 s / 200 tokens = 0.9
    assert out["ratio_per_completion_token"] == pytest.approx(0.5 / 0.9)
    assert out["reward_last_steps"] == 1 and out["reward"] == {"trl": 0.5, "mathrl": 0.25}
    # rollout = step - update: 8, 10, 6, 10 -> median 9; updates 12, 20, 4, 30 -> median 16
    assert out["mathrl_rollout_s_median"] == 9.0 and out["mathrl_update_s_median"] == 16.0
