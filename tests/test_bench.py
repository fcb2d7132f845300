"""The benchmarks' arithmetic by hand: the TRL comparison's summary (the benchmark itself needs TRL
and ~20 min: bench/trl_vs_mathrl.py), the baseline-variance statistics
(bench/baseline_variance.py), the roofline's bounds (dev/lab/roofline.py) and the GSM8K curve's
reading of samples (bench/gsm8k_curve.py; its run is the device check's --tiny stage); and that
dev/lab/decode_sketch.py samples what `generate` samples."""

import sys
from pathlib import Path

import pytest
import torch

from common.run.checks import check_options

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from baseline_variance import estimator_stats, last_layer_param, per_sample_grads  # noqa: E402
from trl_vs_mathrl import summarize  # noqa: E402
from gsm8k_curve import equations, reading  # noqa: E402

pytestmark = pytest.mark.slow  # the second tier: the benches' units


def test_summary_ratios_and_rollout_time_by_hand():
    rows = {
        "trl": [{"seconds": s, "reward": r, "response_len": n} for s, r, n in
                [(40.0, 0.0, 50), (50.0, 0.5, 50), (60.0, 1.0, 50), (30.0, 0.5, 50)]],
        "mathrl": [{"seconds": s, "reward": r, "response_len": n, "update_s": u} for s, r, n, u in
                   [(20.0, 0.0, 40, 12.0), (30.0, 0.25, 40, 20.0), (10.0, 0.75, 20,
                                                                    4.0), (40.0, 0.25, 100, 30.0)]],
    }
    out = summarize(rows, {"trl": 2000.0, "mathrl": 1000.0})
    assert out["median_step_s"] == {"trl": 45.0, "mathrl": 25.0}
    assert out["ratio_mathrl_over_trl"] == pytest.approx(25 / 45)
    # per token: mathrl 100 s / 200 tokens = 0.5, TRL 180 s / 200 tokens = 0.9
    assert out["ratio_per_completion_token"] == pytest.approx(0.5 / 0.9)
    assert out["reward_last_steps"] == 1 and out["reward"] == {"trl": 0.5, "mathrl": 0.25}
    # rollout = step - update: 8, 10, 6, 10 -> median 9; updates 12, 20, 4, 30 -> median 16
    assert out["mathrl_rollout_s_median"] == 9.0 and out["mathrl_update_s_median"] == 16.0


def test_baseline_variance_statistics_by_hand():
    # one prompt, M = 4 samples split into 2 groups of k = 2; a group's estimate is sum_i w_i g_i /
    # (P k)
    ones = torch.ones(4, dtype=torch.float64)
    # every sample has the same gradient g and reward 1: none estimates g exactly (variance 0, |E|^2
    # = 1); rloo's weights sum to 0 in each group, so it estimates 0, also exactly
    s = estimator_stats(torch.ones(4, 4, dtype=torch.float64), ones[None], k=2)
    assert s["none"]["variance"] == pytest.approx(0) and s["none"]["signal"] == pytest.approx(1)
    assert s["rloo"]["variance"] == pytest.approx(0) and s["rloo"]["signal"] == pytest.approx(0)
    # orthonormal gradients, reward 1 on sample 0 only. none: the group holding sample 0 gives g0 /
    # 2, the other 0 -> unbiased variance of 2 vectors (1/4 + 0 - |g0/2|^2 / 2) / 1 = 1/8. rloo:
    # that group's weights are (1, -1) -> (g0 - g_b) / 2, |.|^2 = 1/2 -> (1/2 - 1/4) = 1/4. With
    # uncorrelated gradients the baseline only adds the second sample's noise: it pays off through
    # the gradient shared by a prompt's responses.
    eye = torch.eye(4, dtype=torch.float64)
    s = estimator_stats(eye, torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64), k=2)
    assert s["none"]["variance"] == pytest.approx(1 / 8) and s["rloo"]["variance"] == pytest.approx(1 / 4)
    assert s["none"]["signal"] == pytest.approx(0) and s["rloo"]["signal"] == pytest.approx(0)
    # two prompts of orthonormal gradients, reward 1 everywhere: the batch estimate sums 4 vectors /
    # (P k) = 4, |.|^2 = 4 / 16; per prompt (2/8 - 1/8) = 1/8, two prompts 1/4
    s = estimator_stats(torch.eye(8, dtype=torch.float64), torch.ones(2, 4, dtype=torch.float64),
                        k=2)
    assert s["none"]["variance"] == pytest.approx(1 / 4)
    with pytest.raises(ValueError, match="at least 2 groups"):
        estimator_stats(eye, ones[None], k=3)


def test_per_sample_gradients_from_one_backward_match_one_backward_per_row():
    from common.models.logprobs import token_logprobs
    from common.models.loading import load_policy
    from common.rl.numerics import masked_sum
    policy = load_policy("tiny-random")
    name, weight = last_layer_param(policy, "mlp.down_proj.weight")
    module = policy.get_submodule(name.rsplit(".", 1)[0])
    ids = torch.randint(3, 200, (3, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # a left-padded prompt
    loss_mask = torch.ones(3, 4)
    loss_mask[2, 3] = 0  # a response that ended early
    fast = per_sample_grads(policy, module, ids, mask, loss_mask, temperature=0.7)
    for i in range(3):
        lp, _ = token_logprobs(policy, ids[i:i + 1], mask[i:i + 1], 4, temperature=0.7)
        (g,) = torch.autograd.grad(masked_sum(lp, loss_mask[i:i + 1]), weight)
        assert torch.allclose(fast[i], g.flatten(), atol=1e-6), i
        assert g.abs().sum() > 0


def test_roofline_update_flops_count_a_shared_prompt_once():
    from dev.lab.roofline import Shape, update_flops

    s = Shape.__new__(Shape)  # a made-up model: 10 body parameters, vocabulary 3, width 2, 1 layer
    s.body_params, s.vocab, s.hidden, s.layers = 10, 3, 2, 1
    # 2 rows sharing one 4-token prompt, 2 response tokens each. Forward: body 2*10*(4*1 + 2*2) = 160,
    # head 2*3*2 per response token * 4 = 48, attention 4*1*2 * (4 * 2) = 64 for the prompt and
    # 4*1*2 * (2 * 5) = 80 per row's response = 160; backward twice the forward
    assert update_flops(s, batch=2, prompt_len=4, new_tokens=2, groups=1) == 3 * (160 + 48 + 64 + 160)


def test_roofline_step_bound_is_the_slower_of_reading_and_computing():
    from dev.lab.roofline import Shape, step_bound

    s = Shape.__new__(Shape)  # 100 parameters in fp32, 8 KV bytes per position, 1 layer of width 2
    s.read_params, s.matmul_params, s.bytes, s.kv_per_position, s.layers, s.hidden = (
        100, 100, 4, 8, 1, 2)
    # 2 rows over 10 positions: bytes 100*4 + 8*10*2 = 560; FLOPs 2*100*2 + 4*1*2 * (2*10) = 560
    assert step_bound(s, batch=2, context=10, bandwidth=56, peak=112) == 10.0  # reading is slower
    assert step_bound(s, batch=2, context=10, bandwidth=56, peak=28) == 20.0  # computing is


@pytest.mark.parametrize("algo", ["grpo", "rloo", "ppo"])
def test_trl_pairs_give_each_file_options_it_accepts_and_the_same_batch(algo):
    # The TRL bench passes each file its options by name; a renamed option once broke it unseen.
    import argparse
    import importlib

    from trl_vs_mathrl import MATHRL_FILE, batch_shape, mathrl_args

    args = mathrl_args(argparse.Namespace(algo=algo, steps=10, seed=0, out="/nonexistent",
                                          device="cpu", num_prompts=None, max_new_tokens=64,
                                          mathrl_option=[],
                                          model_name_or_path="SmolLM2-135M-Instruct"))
    check_options(args, importlib.import_module(MATHRL_FILE[algo]).check_args, 1)
    assert not args.bf16 and not args.compile  # the CPU pair: fp32, eager
    # 32 completions per optimizer step on every pair, micro-batches of 8, as on the TRL side
    assert args.num_prompts * args.num_generations == 32 and args.micro_batch_size == 8
    assert (args.num_prompts, args.num_generations) == batch_shape(algo)
    assert (args.max_new_tokens, args.temperature, args.learning_rate) == (64, 0.7, 2e-5)
    if algo == "rloo":  # TRL's RLOO: k1 KL summed over a response, in its reward
        assert (args.baseline, args.beta, args.kl_estimator, args.kl_penalty,
                args.length_normalize) == ("rloo", 0.05, "k1", "reward", False)
    if algo == "ppo":  # TRL's PPO: one learning rate for policy and value model, GAE lambda 0.95
        assert (args.critic_learning_rate, args.gae_lambda, args.critic_num_layers,
                args.num_ppo_epochs, args.num_mini_batches) == (2e-5, 0.95, 0, 1, 1)


@pytest.mark.parametrize("algo", ["grpo", "rloo", "online_dpo"])
def test_the_gpu_pair_puts_both_sides_in_bf16_on_the_gpu_with_the_batch_asked_for(algo):
    # --device cuda, built on a CPU: TRL leaves the CPU for bf16 autocast, mathrl takes --bf16;
    # 16 prompts of 256 new tokens on both sides; the mathrl side's own flags on top: its default
    # micro-batch (unset: fitted to the GPU's memory), and --compile
    import argparse
    import importlib

    from trl_vs_mathrl import MATHRL_FILE, MICRO, batch_shape, mathrl_args, trl_options

    bench = argparse.Namespace(algo=algo, steps=6, seed=0, out="/nonexistent", device="cuda",
                               num_prompts=16, max_new_tokens=256,
                               model_name_or_path="SmolLM2-135M-Instruct",
                               mathrl_option=["--micro_batch_size=fit", "--compile"])
    trl = trl_options(bench)
    assert (trl["use_cpu"], trl["bf16"], trl["max_completion_length"]) == (False, True, 256)
    prompts, g = batch_shape(algo, 16)
    assert prompts == 16 and trl["gradient_accumulation_steps"] == 16 * g // MICRO
    args = mathrl_args(bench)
    check_options(args, importlib.import_module(MATHRL_FILE[algo]).check_args, 1)
    assert (args.bf16, args.compile, args.micro_batch_size) == (True, True, None)
    assert (args.num_prompts, args.num_generations, args.max_new_tokens) == (16, g, 256)
    # the default captures the decode step as a CUDA graph; the eager pair says --no_cuda_graphs
    assert args.cuda_graphs
    eager = mathrl_args(argparse.Namespace(**{**vars(bench), "mathrl_option": [
        "--micro_batch_size=fit", "--no_cuda_graphs"]}))
    assert (eager.cuda_graphs, eager.compile, eager.micro_batch_size) == (False, False, None)
    cpu = trl_options(argparse.Namespace(**{**vars(bench), "device": "cpu", "num_prompts": None,
                                            "max_new_tokens": 64}))
    assert (cpu["use_cpu"], cpu["bf16"], cpu["max_completion_length"]) == (True, False, 64)
    assert cpu["gradient_accumulation_steps"] == 32 // MICRO  # the CPU pair, as it was


def test_decode_sketch_draws_the_tokens_of_generate():
    # dev/lab/decode_sketch.py's speed is only worth comparing if it computes generate's function:
    # the same sampled tokens, its prompt keys read once per group
    from dev.lab.decode_sketch import sketch_rollout

    from common.models.loading import load_tokenizer, tiny_random_model
    from sampling import fast_generate

    model, tok = tiny_random_model(), load_tokenizer("tiny-random")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 1000, (12,), generator=g).tolist() for _ in range(2)]
    prompts = [prompts[i // 3] for i in range(6)]  # 2 groups of 3 rows
    gen = fast_generate(model, tok, prompts, 8, 1.0, 1.0, seeds=list(range(6)))
    sketch = sketch_rollout(model, prompts, 3, 8, list(range(6)))
    mask = gen.response_mask.bool()
    assert mask.sum() > 30  # most rows ran all 8 tokens (an EOS ends a row early in generate)
    assert torch.equal(sketch[:, :mask.shape[1]][mask], gen.response_ids[mask])
    assert len(set(map(tuple, sketch.tolist()))) == 6  # rows of one prompt drew different tokens


def test_every_planted_bug_still_has_its_line_and_its_test():
    # dev/planted_bugs.py plants each bug by replacing one exact line: the line must still be in
    # the file once, and the test aimed at it must exist, or the script would quietly test nothing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))
    from planted_bugs import BUGS, ROOT

    assert len(BUGS) == 19
    for name, (path, right, wrong, test) in BUGS.items():
        assert (ROOT / path).read_text().count(right) == 1, name
        test_file, test_name = test.split("::")
        assert f"def {test_name}(" in (ROOT / test_file).read_text(), name


def test_the_gsm8k_curve_reads_the_equations_a_response_writes():
    text = ("He works 6 + 4 = 10 hours.\nHe earns 10 * 12 = $120.\nThen 3 x 4 = 13 boxes, and "
            "1,000 + 24 = 1,024, and $4.50 + 2 = 6.5.\nThe answer is 120.")
    assert equations(text) == (4, 5)  # 3 x 4 = 13 is the wrong one
    assert equations("The answer is 7.") == (0, 0)  # no equation: nothing to check
    assert equations("It is 10 / 0 = 5") == (0, 0)  # no value: not counted


def test_the_gsm8k_curve_reading_counts_format_correct_and_equations():
    samples = [
        {"response": "2 + 3 = 5\nThe answer is 5.", "answer": "5"},   # right, in format, 1/1
        {"response": "2 + 3 = 6\nThe answer is 6.", "answer": "5"},   # wrong, in format, 0/1
        {"response": "2 + 3 = 5, so 5 apples", "answer": "5"},         # no answer, 1/1
        {"response": "I do not know.", "answer": "5"},                 # nothing
    ]
    assert reading(samples) == {"responses": 4, "in_format": 0.5, "correct": 0.25,
                                "equations_per_response": 0.75, "equations_right": 2 / 3}


def test_roofline_decodes_each_mode_in_a_row_of_its_own_then_side_by_side(monkeypatch, capsys):
    # --modes: one row per shape x rows x mode, printed mode by mode as measured (a cut run keeps
    # the first mode at every shape), then once more sorted by shape, rows and mode. The device's
    # peaks are set, not measured (seconds on this CPU; the device check's tiny run measures them),
    # a few times what this CPU measures (7 GB/s, 60 GFLOP/s), so that a bound is not passed
    import dev.lab.roofline as roofline

    monkeypatch.setattr(roofline, "device_peaks", lambda device: (2e10, {
        torch.float32: 2e11, torch.bfloat16: 2e11}))
    monkeypatch.setattr(sys, "argv", ["roofline.py", "--shapes", "tiny", "--batch", "8", "16",
                                      "--new_tokens", "4", "--prompt_len", "8", "--modes",
                                      "eager", "default", "--rollout_only"])
    roofline.main()
    out = capsys.readouterr().out
    assert "on a CPU the mode `default` decodes eagerly" in out
    body, side = out.split("side by side (shape, rows, new tokens, then mode):")
    rows = [line.split(" | ") for line in body.splitlines() if line.startswith("| tiny")]
    assert [(r[1], r[3]) for r in rows] == [("8", "eager"), ("16", "eager"),
                                             ("8", "default (eager)"), ("16", "default (eager)")]
    sorted_rows = [line.split(" | ") for line in side.splitlines() if line.startswith("| tiny")]
    assert [(r[1], r[3]) for r in sorted_rows] == [("8", "eager"), ("8", "default (eager)"),
                                                    ("16", "eager"), ("16", "default (eager)")]
    for r in rows:  # tokens/s drawn, and a fraction of a bound (below 0.005 at these peaks)
        assert float(r[4]) > 0 and 0 <= float(r[5]) <= 1


def test_the_trl_pair_at_a_shape_draws_every_token_on_both_sides(tmp_path):
    # --shape: a random model of a Qwen2.5 shape, built offline, that both sides load; with it
    # --ignore_eos, which TRL gets as min_new_tokens (its generate masks the EOS until the end)
    import argparse

    from transformers import AutoConfig

    from trl_vs_mathrl import random_model, trl_options

    folder = random_model("tiny", tmp_path, "cpu")
    config = AutoConfig.from_pretrained(folder)
    assert (config.model_type, config.num_hidden_layers) == ("qwen2", 2)
    assert random_model("tiny", tmp_path, "cpu") == folder  # built once
    bench = argparse.Namespace(algo="grpo", steps=2, seed=0, out=str(tmp_path), device="cpu",
                               num_prompts=1, max_new_tokens=8, model_name_or_path=folder,
                               mathrl_option=[], ignore_eos=True)
    assert trl_options(bench)["generation_kwargs"] == {"min_new_tokens": 8}
    assert "generation_kwargs" not in trl_options(argparse.Namespace(**{**vars(bench),
                                                                        "ignore_eos": False}))


def test_the_memory_tables_run_that_runs_out_of_memory_is_a_row(tmp_path):
    # bench/memory.py gpu runs each configuration through `_gpu_one`, which caps the process and
    # runs the file; a file that runs out of memory (here one that says so at once) gives a row
    import json
    import subprocess

    script = tmp_path / "oom.py"
    script.write_text("import torch\nraise torch.OutOfMemoryError('CUDA out of memory.')\n")
    out = tmp_path / "row.json"
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "bench/memory.py", "_gpu_one", "--out", str(out),
                           "--cap_gib", "24", "--", str(script)], cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    row = json.loads(out.read_text())
    assert row["status"] == "out of memory" and row["peak_rss_gib"] > 0


def test_the_memory_table_computes_which_runs_cannot_fit_their_cap():
    # a run whose weights, gradients and AdamW state alone pass its cap is a computed row, not a
    # run: 16 bytes a parameter in fp32 with AdamW, 4 with LoRA's frozen base or ZeRO-Offload
    from memory import CONFIGS, GiB, counts, has_option, state_bytes

    P = {size: counts(size)[0] for size in ("1.5B", "3B", "7B")}
    assert 22 < state_bytes(P["1.5B"], "default") / GiB < 24  # 1.5B in fp32: tried under 24 GiB
    assert state_bytes(P["3B"], "bf16") > 24 * GiB > state_bytes(P["3B"], "lora_r_16")
    assert state_bytes(P["7B"], "fsdp") > 80 * GiB > state_bytes(P["7B"], "bf16_offload_optimizer")
    # every configuration's flags are grpo.py's options
    assert all(has_option(flag) for flags in CONFIGS.values() for flag in flags
               if flag.startswith("--"))


def test_the_cold_start_runs_sft_then_grpo_from_its_checkpoint_on_the_same_problems(tmp_path):
    # bench/cold_start.py --tiny: sft.py for 2 updates on the prompts' worked examples (all 8 fit
    # its budget), then grpo.py for 1 from sft.py's last checkpoint; the three stages are
    # evaluated on the same 3 problems, the start and after SFT by sft.py, after RL by grpo.py
    import json
    import subprocess

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "cold"
    done = subprocess.run([sys.executable, "bench/cold_start.py", "--tiny", "--out", str(out)],
                          cwd=root, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "8 of 8 train solutions fit 256 tokens" in done.stdout
    rl_args = json.loads((out / "grpo" / "args.json").read_text())
    assert rl_args["model_name_or_path"] == str(out / "sft" / "checkpoint-2")
    stages = json.loads((out / "cold_start.json").read_text())["stages"]
    assert [row["step"] for row in stages.values()] == [0, 2, 1]
    assert all(row["eval/gsm8k/num_problems"] == 3 for row in stages.values())
    text = (out / "cold_start.md").read_text()
    assert "| after SFT (2 updates) |" in text and "| after RL (1 more updates) |" in text


def test_the_gsm8k_curve_skips_a_last_line_cut_by_a_crash_and_names_a_damaged_one(tmp_path):
    from gsm8k_curve import read_log_lines
    path = tmp_path / "samples.jsonl"
    path.write_text('{"step": 1, "response": "a"}\n{"step": 2, "response": "b"}\n{"step": 2, "re')
    assert [row["response"] for row in read_log_lines(path)] == ["a", "b"]
    path.write_text('{"step": 1, "resp\n{"step": 2, "response": "b"}\n')
    with pytest.raises(SystemExit) as stopped:
        read_log_lines(path)
    assert str(stopped.value.code) == (f"error: {path}, line 1: not JSON (cut short?): remove the "
                                       "line, or the run's folder to run it again")
    path.write_text('["step", 1]\n{"step": 2}\n')
    with pytest.raises(SystemExit, match="line 1: not an object with an integer step"):
        read_log_lines(path)
