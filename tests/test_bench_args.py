"""The workshop's scripts (bench/, dev/, dev/lab/: dev/README.md) without their runs: each one's
--help parses and an unknown flag is one line, and the benches that no other test runs build
command lines that their files accept, plan the settings their docs describe and refuse a bad
value in one line. No model runs here: seconds in all."""

import argparse
import importlib
import runpy
import sys
from pathlib import Path

import pytest

from common.run.args import parse_args

pytestmark = pytest.mark.slow  # the second tier: the benches' arguments

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(str(p.relative_to(ROOT)) for pattern in ("bench/*.py", "dev/*.py", "dev/lab/*.py")
                 for p in ROOT.glob(pattern) if 'if __name__ == "__main__":' in p.read_text())
sys.path.insert(0, str(ROOT / "bench"))


def run_script(path, argv, monkeypatch):
    """Runs `python path *argv` in this process (its imports are already warm) -> the SystemExit
    code; sys.path is restored after."""
    monkeypatch.setattr(sys, "argv", [path, *argv])
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / path), run_name="__main__")
    return done.value.code


def test_every_workshop_script_is_listed():
    # the glob finds the benches and tools that dev/README.md documents
    assert {"bench/staleness_lab.py", "dev/device_check.py", "dev/lab/roofline.py"} <= set(SCRIPTS)
    listed = (ROOT / "dev/README.md").read_text()
    assert [s for s in SCRIPTS if Path(s).name not in listed] == []


@pytest.mark.parametrize("path", SCRIPTS)
def test_help_parses_and_an_unknown_flag_is_one_line(path, monkeypatch, capsys):
    assert run_script(path, ["--help"], monkeypatch) == 0
    assert capsys.readouterr().out.startswith("usage:")
    assert run_script(path, ["--no_such_flag"], monkeypatch) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert said[-1].startswith(f"{Path(path).name}: error:"), said


def error_of(module, argv, capsys):
    """The one line with which `module.parse(argv)` refuses argv."""
    with pytest.raises(SystemExit) as done:
        module.parse(argv)
    assert done.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def accepts(algo, argv):
    """argv parses with `algo`.py's own options (an unknown or renamed flag exits)."""
    return parse_args(importlib.import_module(algo).Args, argv)


def test_async_throughput_runs_each_setting_with_its_files_options(tmp_path, capsys):
    import async_throughput as bench

    args = bench.parse(["--out", str(tmp_path), "--max_steps", "3", "--", "--bf16"])
    for name in bench.SETTINGS:
        command = bench.command(name, tmp_path / "run", args.max_steps, args.extra)
        script = next(i for i, a in enumerate(command) if a.endswith(".py"))
        parsed = accepts(command[script][:-3], command[script + 1:])
        assert (parsed.max_steps, parsed.num_eval_problems, parsed.bf16) == (3, 0, True)
        assert "PORT" not in command  # torchrun's port is a free one
    assert "--max_steps must be at least 2" in error_of(bench, ["--max_steps", "1"], capsys)


def test_staleness_lab_plans_13_settings_of_async_grpos_options(tmp_path, capsys):
    import staleness_lab as bench

    args = bench.parse(["--out", str(tmp_path)])
    settings = bench.settings(args)
    assert len(settings) == 13 and settings[0] == (0, "none")  # k = 0 once: every weight is 1
    for k, correction in settings:
        command = bench.command(k, correction, 0, tmp_path / "run", args)
        assert command[1:3] == ["tests/run_with_test_reward.py", "async_grpo"]
        parsed = accepts("async_grpo", command[3:])
        assert (parsed.max_staleness, parsed.off_policy_correction) == (k, correction)
    assert "invalid choice: 'is'" in error_of(bench, ["--corrections", "is"], capsys)
    assert "--ks" in error_of(bench, ["--ks", "-1"], capsys)


def test_staleness_lab_summary_and_table_by_hand():
    import staleness_lab as bench

    args = argparse.Namespace(ks=[0, 1], corrections=["none", "tis"], max_steps=6)
    rows = [{"reward/mean": r, "is_weight/clipped_frac": 0.1, "mismatch/kl": 0.01}
            for r in (0.1, 0.2, 0.9, 0.9, 1.0, 1.0)]
    # the last 5 updates: (0.2 + 0.9 + 0.9 + 1 + 1) / 5 = 0.8; 0.8 first reached at update 3
    s = bench.summary(rows, 6)
    assert s["last5"] == pytest.approx(0.8) and s["reached"] == 3
    never = [{**r, "reward/mean": 0.0} for r in rows]
    assert bench.summary(never, 6)["reached"] == 7  # none reaches it: max_steps + 1
    lines = bench.table({(0, "none"): [rows], (1, "none"): [rows, never], (1, "tis"): [rows]},
                        args).splitlines()
    assert lines[2].startswith("| 0 | any (all weigh 1) | 0.80 | 3.0 (3) |")
    assert lines[3].startswith("| 1 | none | 0.40 | 5.0 (3, 7) |") and len(lines) == 5


def test_tool_gain_runs_tools_py_with_and_without_its_tool(tmp_path, capsys):
    import tool_gain as bench

    args = bench.parse(["--seeds", "0", "--", "--model_name_or_path", "tiny-random"])
    for tools in bench.SETTINGS:
        command = bench.command(tools, 0, tmp_path / "run", args.max_steps, args.extra)
        assert command[1] == "tools.py"
        parsed = accepts("tools", command[2:])
        assert (parsed.tools, parsed.difficulty, parsed.max_steps) == (tools, "6", 10)
    assert "--max_steps must be at least 1" in error_of(bench, ["--max_steps", "0"], capsys)


def test_throughput_runs_every_file_with_its_own_defaults(tmp_path, capsys):
    import throughput as bench

    args = bench.parse(["--bf16"])
    assert args.algos == list(bench.ALGORITHMS)  # every algorithm file
    for algo in args.algos:
        command = bench.command(algo, args, str(tmp_path / algo))
        assert Path(command[1]).name == f"{algo}.py"
        parsed = accepts(algo, command[2:])
        assert (parsed.max_steps, parsed.num_eval_problems, parsed.bf16) == (3, 0, True)
    assert "--steps must be >= 1" in error_of(bench, ["--steps", "0"], capsys)
    assert "invalid choice" in error_of(bench, ["--algos", "trpo"], capsys)


def test_grading_pool_refuses_a_batch_it_cannot_write(capsys):
    import grading_pool as bench

    args = bench.parse([])
    assert (args.answers, args.runaways, args.workers) == (64, 8, [1, 2])
    assert "fewer than --answers" in error_of(bench, ["--runaways", "64"], capsys)
    assert "at most 968 answers" in error_of(bench, ["--answers", "1000"], capsys)
    assert "at least 1 worker" in error_of(bench, ["--workers", "0"], capsys)


def test_stepwise_calculator_builds_each_settings_env(capsys):
    import stepwise_calculator as bench

    # the system prompt asks for <<expr>> with the calculator; the worked examples show it only
    # when annotated
    args = bench.parse([])
    shown = {}
    for name, (sym_calc, annotated) in bench.SETTINGS.items():
        env = bench.episodes_env(args, sym_calc, annotated)
        assert len(env) >= args.num_problems, name
        messages = env.reset(0)
        shown[name] = {role: any("<<" in m["content"] for m in messages if m["role"] == role)
                       for role in ("system", "user", "assistant")}
    assert shown == {"no calculator": {"system": False, "user": False, "assistant": False},
                     "calculator, plain": {"system": True, "user": False, "assistant": False},
                     "calculator, annotated": {"system": True, "user": False, "assistant": True}}
    assert "--batch_size must be at least 1" in error_of(bench, ["--batch_size", "0"], capsys)
