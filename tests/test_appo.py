"""appo.py: step-level GAE, the joint step ratio, the clipped Huber value loss and the KL early stop
against hand-computed values; OpenR's argument names; end-to-end runs on the tiny model (PRM,
torchrun with 2 CPU processes, resume, the OpenR command line, LoRA)."""

import json
import os
import sys
from contextlib import nullcontext
from dataclasses import fields, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import appo
from common.run.args import field_docs, parse_args
from common.run.checks import StepGuard, check_options
from common.models.logprobs import token_logprobs
from common.models.loading import ValueHead, load_policy
from common.models.sampler import Generation
from common.models.sharding import clip_grad_norm
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "6", "--num_envs", "2",
        "--num_steps", "2", "--num_mini_batches", "2", "--micro_batch_size", "1",
        "--critic_hidden_size", "16",
        "--critic_num_layers", "1"]


def run(cmd, env=None):
    # one thread: the tiny model is fastest that way, and two threads on a busy 2-core machine can
    # be 50x slower
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    out = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def params(path):
    return load_file(str(Path(path) / "model.safetensors"))


# ---- advantages -------------------------------------------------------------------------------------------------
def test_step_gae_across_an_episode_boundary_inside_the_segment():
    # env 0: its episode ends at step 1, a new one starts at step 2 and is cut: bootstrapped with V
    # = 0.6. env 1: its episode ends at the segment's last step: the bootstrap value 5.0 must not be
    # used.
    rewards = torch.tensor([[0.0, 1.0, 0.5], [0.0, 0.0, 0.0]])
    values = torch.tensor([[0.2, 0.4, 0.3], [0.1, 0.1, 0.1]])
    dones = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    adv, ret = appo.compute_advantages(rewards, values, None, torch.tensor([0.6, 5.0]), dones,
                                       gamma=0.5, lam=0.5)
    # OpenR's (MAPPO's) GAE, delta_t = r_t + gamma V_t+1 (1 - done_t) - V_t and
    # A_t = delta_t + gamma lam (1 - done_t) A_t+1, worked by hand (gamma lam = 0.25):
    #   env 0: A2 = 0.5 + 0.5*0.6 - 0.3 = 0.5
    #          A1 = 1 - 0.4 = 0.6                         (it ends: no bootstrap, no carry)
    #          A0 = (0.5*0.4 - 0.2) + 0.25*0.6 = 0.15
    #   env 1: A2 = 0 - 0.1 = -0.1                        (it ends: 5.0 unused)
    #          A1 = (0.05 - 0.1) + 0.25*(-0.1) = -0.075
    #          A0 = (0.05 - 0.1) + 0.25*(-0.075) = -0.06875
    torch.testing.assert_close(adv, torch.tensor([[0.15, 0.6, 0.5], [-0.06875, -0.075, -0.1]]))
    torch.testing.assert_close(ret, adv + values)


# ---- losses -----------------------------------------------------------------------------------------------------
def test_ratio_is_the_joint_probability_of_the_step():
    args = replace(appo.Args(), epsilon=0.2, entropy_coef=0.0)
    old = torch.zeros(2, 3)
    # step 0: three tokens, log-ratios 0.1, -0.05, 0.05 -> sum 0.1 ; step 1: two tokens (0.3, 0.2)
    # and padding (5.0)
    logprobs = torch.tensor([[0.1, -0.05, 0.05], [0.3, 0.2, 5.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([1.0, 1.0])
    loss, stats = appo.policy_loss(logprobs, old, adv, mask, torch.zeros(2, 3), 2.0, args)
    # 1.105, 1.649
    rho0, rho1 = torch.exp(torch.tensor(0.1)).item(), torch.exp(torch.tensor(0.5)).item()
    # step 0 is inside the clip range; step 1's ratio 1.649 > 1.2 with A > 0 is clipped
    assert loss.item() == pytest.approx((-rho0 - 1.2) / 2)
    assert stats["clipfrac"] == 0.5
    assert stats["approx_kl"] == pytest.approx(((rho0 - 1 - 0.1) + (rho1 - 1 - 0.5)) / 2)
    loss.backward()
    # every token of step 0 gets d/dlogp = -A * rho0 / 2 (the whole step's ratio); step 1 is
    # clipped: no gradient
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-rho0 / 2] * 3, [0.0, 0.0, 0.0]]))


def test_entropy_bonus_is_the_mean_over_the_step_tokens():
    args = replace(appo.Args(), entropy_coef=0.01)
    lp = torch.zeros(1, 3)
    entropy = torch.tensor([[1.0, 2.0, 9.0]])
    loss, stats = appo.policy_loss(lp, lp, torch.tensor([0.0]), torch.tensor([[1, 1, 0]]), entropy,
                                   1.0, args)
    assert loss.item() == pytest.approx(-0.01 * 1.5) and stats["entropy"] == pytest.approx(1.5)


def test_clipped_huber_value_loss():
    args = replace(appo.Args(), cliprange_value=0.2, huber_delta=10.0, vf_coef=1.0)
    old = torch.tensor([0.0, 0.0])
    values = torch.tensor([1.0, 1.0], requires_grad=True)
    returns = torch.tensor([0.5, 12.0])
    loss, stats = appo.value_loss(values, old, returns, None, 2.0, args)
    # V_clip = 0 + clip(1 - 0, -0.2, 0.2) = 0.2
    # transition 0: huber(0.5 - 0.2) = 0.045, huber(0.5 - 1) = 0.125 -> 0.125 (the unclipped one)
    # transition 1: |12 - 0.2| = 11.8 > 10: 10 * (11.8 - 5) = 68 ; |12 - 1| = 11: 10 * (11 - 5) = 60
    # -> 68 (clipped)
    assert loss.item() == pytest.approx((0.125 + 68) / 2)
    assert stats["v_loss"] == pytest.approx((0.125 + 68) / 2)
    loss.backward()
    # d/dV of 0.5 (V - R)^2 = V - R = 0.5, over 2; the clipped branch of transition 1 passes no
    # gradient
    torch.testing.assert_close(values.grad, torch.tensor([0.25, 0.0]))


def test_value_head_under_bf16_autocast_gives_fp32_values_and_the_huber_gradient():
    # --bf16 autocasts the head's Linear; its values must leave in fp32, or the Huber loss against
    # fp32 returns fails in the backward (appo/tppo --bf16 crashed so)
    head = ValueHead(2, depth=0)  # zero-initialised: V = 0
    hidden = torch.tensor([[1.0, 2.0], [3.0, -1.0]], dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        values = head(hidden)
    assert values.dtype == torch.float32
    args = replace(appo.Args(), cliprange_value=0.2, huber_delta=10.0, vf_coef=1.0)
    loss, _ = appo.value_loss(values, torch.zeros(2), torch.tensor([1.0, -2.0]), None, 2.0, args)
    # huber(0 - 1) = 0.5, huber(0 + 2) = 2, over 2 transitions
    assert loss.item() == pytest.approx(1.25)
    loss.backward()
    # dL/dV = (V - R) / 2 = [-0.5, 1.0]; dL/dw = sum_i dL/dV_i h_i = -0.5 [1, 2] + [3, -1]
    torch.testing.assert_close(head.net[-1].weight.grad, torch.tensor([[2.5, -2.0]]))
    torch.testing.assert_close(head.net[-1].bias.grad, torch.tensor([0.5]))


# ---- the KL early stop ----------------------------------------------------------------------------------------
def _tiny_batch(policy, shift):
    torch.manual_seed(0)
    ids = torch.randint(3, 1000, (4, 10))
    attn = torch.ones_like(ids)
    response_mask = torch.ones(4, 4, dtype=torch.long)
    with torch.no_grad():
        lp, _ = token_logprobs(policy, ids, attn, 4, temperature=0.7)
    done = torch.ones(4, dtype=torch.bool)
    gen = Generation(ids[:, :6], attn[:, :6], ids[:, 6:], response_mask, lp, done, ~done)
    return gen, lp - shift, torch.tensor([1.0, -1.0, 0.5, -0.5])


@pytest.mark.parametrize("shift,skipped", [(0.0, False), (0.1, True)])
def test_kl_early_stop_skips_the_policy_step(shift, skipped):
    # shift 0.1 per token: joint log-ratio 0.4 per step, approx_kl = e^0.4 - 1 - 0.4 = 0.092 > 0.02
    policy = load_policy("tiny-random")
    before = [p.detach().clone() for p in policy.parameters()]
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    args = replace(appo.Args(), micro_batch_size=2, skip_kl=0.02)
    stats = appo.update_policy(policy, optimizer, *_tiny_batch(policy, shift), torch.arange(4), 2,
                               args, SimpleNamespace(autocast=nullcontext(), guard=StepGuard(),
                                                     device=torch.device("cpu"), world=1,
                                               sync_gradients=lambda m: clip_grad_norm(m, args.max_grad_norm)))
    moved = max((p - b).abs().max().item() for p, b in zip(policy.parameters(), before))
    assert stats["early_stop_frac"] == float(skipped)
    assert stats["approx_kl"] == pytest.approx(0.0 if not skipped else float(torch.exp(torch.tensor(0.4)) - 1.4), abs=1e-5)
    assert (moved == 0.0) if skipped else (moved > 1e-4)


def test_each_micro_batch_is_compared_with_the_sampling_log_probs_of_its_own_rows():
    # A minibatch is rows of the rollout in any order (env_minibatches draws them), split into
    # micro-batches: a micro-batch's old log-probs are its rows' (old_logprobs[rows]) and its
    # advantages are at its positions in the minibatch (advantages[in_batch]). Rows 3 and 1 in
    # micro-batches of 1, on the policy's own log-probs: every ratio is exactly 1, so approx_kl is
    # 0 and the step is taken.
    policy = load_policy("tiny-random")
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in policy.parameters()]
    args = replace(appo.Args(), micro_batch_size=1, skip_kl=0.02)
    stats = appo.update_policy(policy, optimizer, *_tiny_batch(policy, 0.0), torch.tensor([3, 1]),
                               1, args, SimpleNamespace(autocast=nullcontext(), guard=StepGuard(),
                                                        device=torch.device("cpu"), world=1,
                                               sync_gradients=lambda m: clip_grad_norm(m, args.max_grad_norm)))
    moved = max((p - b).abs().max().item() for p, b in zip(policy.parameters(), before))
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert stats["clipfrac"] == 0.0 and stats["early_stop_frac"] == 0.0 and moved > 1e-4


# ---- minibatches and arguments ---------------------------------------------------------------------------------
def test_minibatches_take_the_same_steps_from_every_env_on_any_number_of_ranks():
    one = appo.env_minibatches(step=3, epoch=0, num_envs=4, first_env=0, num_steps=4,
                           num_mini_batches=2, seed=0)
    assert sorted(torch.cat(one).tolist()) == list(range(16))  # every transition once per epoch
    for mb in one:
        # 2 steps of each env
        assert sorted(i // 4 for i in mb.tolist()) == [0, 0, 1, 1, 2, 2, 3, 3]
    # rank 1 of 2 owns envs 2, 3: its minibatches are the same (env, step) pairs as in the
    # one-process run
    two = appo.env_minibatches(step=3, epoch=0, num_envs=2, first_env=2, num_steps=4,
                           num_mini_batches=2, seed=0)
    for a, b in zip(one, two):
        assert [i for i in a.tolist() if i >= 8] == [i + 8 for i in b.tolist()]


def test_bad_sizes_fail_before_any_model_loads(tmp_path):
    with pytest.raises(ValueError, match="divisible by the number of processes"):
        check_options(replace(appo.Args(), num_envs=3), appo.check_args, world_size=2)
    with pytest.raises(ValueError, match="--num_mini_batches 3 must divide --num_steps 4"):
        check_options(replace(appo.Args(), num_mini_batches=3), appo.check_args, world_size=1)
    # micro-batches of up to 3: fine
    check_options(replace(appo.Args(), micro_batch_size=3), appo.check_args, world_size=1)
    with pytest.raises(ValueError, match="good token 'good token' is 2 tokens"):
        check_options(replace(appo.Args(), prm_model_name_or_path="tiny-random",
                                prm_good_token="good token"), appo.check_args, world_size=1)


def test_openr_names_are_translated(capsys):
    args = parse_args(appo.Args,
                      ["--lr", "1e-6", "--num_env_steps", "50000", "--episode_length", "8",
                                  "--n_rollout_threads", "4", "--num_mini_batch", "4",
                                  "--algorithm_name", "appo",
                                  "--clip_param", "0.1", "--value_loss_coef", "0.5", "--critic_lr",
                                  "5e-5"])
    assert args.learning_rate == 1e-6 and args.max_steps == 50000 // 8 // 4 == 1562  # OpenR's count
    assert (args.num_steps, args.num_envs, args.num_mini_batches) == (8, 4, 4)
    assert (args.epsilon, args.cliprange_value, args.vf_coef,
            args.critic_learning_rate) == (0.1, 0.1, 0.5, 5e-5)
    out = capsys.readouterr().out
    assert "--lr is OpenR's name for --learning_rate" in out and "--n_rollout_threads is OpenR's name for --num_envs" in out
    assert parse_args(appo.Args, ["--lr", "1e-6", "--learning_rate", "1e-3"]).learning_rate == 1e-3  # own name
    assert "--learning_rate given: it wins over --lr" in capsys.readouterr().out
    with pytest.raises(ValueError, match="this file is APPO; run tppo.py"):
        parse_args(appo.Args, ["--algorithm_name", "TPPO"])


def test_help_documents_every_field():
    out = run([sys.executable, "appo.py", "--help"]).stdout
    for f in fields(appo.Args):
        assert f"--{f.name}" in out, f.name
        assert field_docs(appo.Args).get(f.name), f"{f.name} has no docstring"


# ---- end to end -----------------------------------------------------------------------------------------------
def test_two_updates_with_a_tiny_prm_write_metrics_and_a_loadable_checkpoint(tmp_path):
    run([sys.executable, "appo.py", *TINY, "--prm_model_name_or_path", "tiny-random", "--max_steps",
         "2",
         "--num_eval_problems", "2", "--output_dir", str(tmp_path), "--use_recurrent_policy"])
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    for key in ("reward/mean", "reward/std", "prm_reward", "response_len/mean", "truncated_frac",
                "entropy",
                "approx_kl", "clipfrac", "v_loss", "value/mean", "early_stop_frac",
                "critic_grad_norm", "lr",
                "tokens_per_s", "time/rollout_s", "time/update_s", "episodes"):
        assert key in lines[0], key
    # sampler and trainer agree in fp32 eager: only the kernels' rounding differs
    for line in lines:
        assert 0 <= line["mismatch/abs"] < 1e-4 and abs(line["mismatch/kl"]) < 1e-6
    assert 0 < lines[0]["prm_reward"] < 1 and lines[0]["reward/mean"] == lines[0]["prm_reward"]
    assert [json.loads(x)["step"] for x in (tmp_path / "eval.jsonl").read_text().splitlines()] == [0, 2]
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint-2").config.num_hidden_layers == 2
    state = torch.load(tmp_path / "checkpoint-2" / "trainer_state.pt", weights_only=False)
    assert sorted(state["optimizers"]) == ["critic", "policy"] and len(state["extra"]["envs"]) == 2
    # the frozen body is not saved
    assert all(k.startswith("head.") for k in state["extra"]["critic"])


@pytest.mark.slow  # the second tier: torchrun
def test_torchrun_two_processes_match_one_process_and_resume_continues_exactly(tmp_path):
    # one process: 2 updates, a checkpoint after each. Two processes: 1 update, then --resume for
    # the 2nd. The episodes carry over the update boundary, so the resumed run must restore them
    # too.
    common = ["tests/run_with_test_reward.py", "appo", *TINY, "--learning_rate", "1e-3",
              "--critic_learning_rate", "1e-3",
              "--temperature", "1.0", "--num_eval_problems", "0", "--max_episode_steps", "3",
              "--skip_kl", "0"]
    run([sys.executable, *common, "--max_steps", "2", "--save_interval", "1", "--output_dir",
         str(tmp_path / "one")])
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", "29525"]
    run([*torchrun, *common, "--max_steps", "1", "--output_dir", str(tmp_path / "two")])
    run([*torchrun, *common, "--max_steps", "2", "--output_dir", str(tmp_path / "two"), "--resume"])
    from common.models.loading import tiny_random_model

    start = tiny_random_model().state_dict()
    for k in (1, 2):
        one, two = params(tmp_path / f"one/checkpoint-{k}"), params(tmp_path / f"two/checkpoint-{k}")
        # the updates did something
        assert max((one[n] - start[n]).abs().max().item() for n in one) > 1e-3
        # fp32 rounding differs between 1- and 2-row batches (~1e-7 in the log-probs). Adam divides
        # by the gradient's own size, so on a weight whose gradient is almost 0 that rounding moves
        # it by up to lr (1e-3; one embedding row here differs by 1.3e-4). A wrong average or
        # minibatch would move nearly every weight: fewer than 1 in 1000 may differ by 1e-5.
        differ = sum(((one[n] - two[n]).abs() > 1e-5).sum().item() for n in one)
        assert differ < 1e-3 * sum(one[n].numel() for n in one)
        assert max((one[n] - two[n]).abs().max().item() for n in one) < 1e-3
    c1 = torch.load(tmp_path / "one/checkpoint-2/trainer_state.pt",
                    weights_only=False)["extra"]["critic"]
    c2 = torch.load(tmp_path / "two/checkpoint-2/trainer_state.pt",
                    weights_only=False)["extra"]["critic"]
    assert max((c1[n] - c2[n]).abs().max().item() for n in c1) < 1e-5
    m1 = [json.loads(x) for x in (tmp_path / "one/metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(x) for x in (tmp_path / "two/metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in m2] == [1, 2]
    for a, b in zip(m1, m2):
        assert a["reward/mean"] == pytest.approx(b["reward/mean"]) and a["episodes"] == b["episodes"]


def test_openr_command_line_runs_with_openr_lora(tmp_path):
    math500 = tmp_path / "math_500.jsonl"
    math500.write_text("".join(json.dumps({"problem": f"What is ${i} + {i}$?",
                                           "final_answer": str(2 * i)}) + "\n"
                               for i in range(10)))
    # OpenR: train_math.py --dataset_path math_500.jsonl --model_name_or_path Qwen2.5-Math-1.5B
    #   --prm_model_name_or_path Qwen2.5-Math-7B-Instruct --algorithm_name APPO --num_mini_batch 4
    # --ppo_epoch 1
    out = run([sys.executable, "appo.py", "--dataset_path", str(math500), "--model_name_or_path",
               "tiny-random",
               "--prm_model_name_or_path", "tiny-random", "--algorithm_name", "APPO",
               "--num_mini_batch", "4",
               "--ppo_epoch", "1",
               # tiny: one update of OpenR's 8 steps x 4 threads, short steps, no held-out eval
               # (OpenR has none)
               "--num_env_steps", "32", "--episode_length", "8", "--n_rollout_threads", "4",
               "--max_new_tokens", "4",
               "--num_eval_problems", "0", "--output_dir", str(tmp_path / "run"),
               # OpenR trains LoRA adapters (r 8) and its critic reads the base model with the
               # adapters off
               "--lora_r", "8", "--learning_rate", "1e-2"])
    # 32 env steps / (8 x 4)
    assert "reading it as math" in out.stdout and "--max_steps 1" in out.stdout
    assert "--ppo_epoch is OpenR's name for --num_ppo_epochs" in out.stdout
    assert len((tmp_path / "run/metrics.jsonl").read_text().splitlines()) == 1
    state = torch.load(tmp_path / "run/checkpoint-1/trainer_state.pt", weights_only=False)
    # the critic's body is not trained
    assert all(k.startswith("head.") for k in state["extra"]["critic"])
    saved = load_file(str(tmp_path / "run/checkpoint-1/adapter_model.safetensors"))
    # OpenR's adapters: q_proj and v_proj of the 2 layers, A and B
    assert len(saved) == 8 and all("lora_" in k for k in saved)
    # B starts at 0: it learned
    assert any(v.abs().max() > 0 for k, v in saved.items() if "lora_B" in k)
