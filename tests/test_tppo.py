"""tppo.py: the BAD backup (hand-worked and against a literal transcription of the equations), the
token-level ratio, the token-mean clipped Huber value loss, advantage standardisation over non-pad
tokens and the KL early stop; end-to-end runs on the tiny model (PRM, torchrun with 2 CPU processes,
resume, the OpenR command line)."""

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

import tppo
from common.run.args import field_docs, parse_args
from common.run.checks import StepGuard
from common.models.logprobs import token_logprobs
from common.models.loading import load_policy
from common.rl.numerics import masked_whiten
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


# ---- the BAD backup ---------------------------------------------------------------------------------------------
def test_bad_backup_two_steps_of_three_tokens_by_hand():
    # gamma 0.5, lambda 0.8. env 0: two 3-token steps, cut after step 1 (bootstrap V = 0.4).
    # env 1: step 0 has 2 tokens (+ padding) and ends the episode; step 1 starts a new one, cut (V =
    # 2.0).
    values = torch.tensor([[[0.1, 0.2, 0.3], [0.5, 0.6, 0.7]],
                           [[0.3, 0.6, 9.0], [0.2, 0.4, 0.8]]])
    mask = torch.tensor([[[1, 1, 1], [1, 1, 1]], [[1, 1, 0], [1, 1, 1]]])
    rewards = torch.tensor([[0.2, 1.0], [1.0, 0.0]])
    dones = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    adv, ret = tppo.compute_advantages(rewards, values, mask, torch.tensor([0.4, 2.0]), dones,
                                       gamma=0.5, lam=0.8)
    # OpenR's BAD backup, by hand (d: the token's TD error; inside a step no reward and no discount,
    # A_j = d_j + lam A_j+1; the step's last token takes the reward, gamma and the next step's first
    # value, A = d + gamma lam m A_next, m = 0 where the episode ends):
    #   env 0, step 1: last  d = 1.0 + 0.5*0.4 - 0.7 = 0.5              A = 0.5
    #                  j=1   d = 0.7 - 0.6 = 0.1                        A = 0.1 + 0.8*0.5 = 0.5
    #                  j=0   d = 0.6 - 0.5 = 0.1                        A = 0.5
    #          step 0: last  d = 0.2 + 0.5*0.5 - 0.3 = 0.15             A = 0.15 + 0.5*0.8*0.5 = 0.35
    #                  j=1   d = 0.1                                    A = 0.1 + 0.8*0.35 = 0.38
    #                  j=0   d = 0.1                                    A = 0.1 + 0.8*0.38 = 0.404
    #   env 1, step 1: last  d = 0 + 0.5*2.0 - 0.8 = 0.2                A = 0.2
    #                  j=1   d = 0.8 - 0.4 = 0.4                        A = 0.4 + 0.8*0.2 = 0.56
    #                  j=0   d = 0.4 - 0.2 = 0.2                        A = 0.2 + 0.8*0.56 = 0.648
    #          step 0 (its episode ends, m = 0): the last is j=1, d = 1.0 - 0.6 = 0.4, A = 0.4
    #                  j=0   d = 0.6 - 0.3 = 0.3                        A = 0.3 + 0.8*0.4 = 0.62
    #                  the padding gets 0
    torch.testing.assert_close(adv, torch.tensor([[[0.404, 0.38, 0.35], [0.5, 0.5, 0.5]],
                                                  [[0.62, 0.4, 0.0], [0.648, 0.56, 0.2]]]))
    torch.testing.assert_close(ret, (adv + values) * mask)


def bad_backup_reference(rewards, values, lengths, next_values, dones, gamma, lam):
    """The equations, literally, one env and one token at a time (a Python list walk)."""
    E, T, _ = values.shape
    out = torch.zeros_like(values)
    for e in range(E):
        A = 0.0
        for t in reversed(range(T)):
            m = 1.0 - dones[e, t].item()
            v_next_obs = next_values[e].item() if t == T - 1 else values[e, t + 1, 0].item()
            for j in reversed(range(lengths[e][t])):
                V = values[e, t, j].item()
                # the step's last token: its reward and gamma, masked at the episode end
                if j == lengths[e][t] - 1:
                    A = rewards[e, t].item() + gamma * v_next_obs * m - V + gamma * lam * m * A
                else:  # inside the step: no reward, no discount
                    A = values[e, t, j + 1].item() - V + lam * A
                out[e, t, j] = A
    return out


def test_bad_backup_matches_the_equations_on_random_segments():
    torch.manual_seed(0)
    E, T, R = 3, 4, 5
    lengths = torch.randint(1, R + 1, (E, T)).tolist()
    mask = torch.tensor([[[int(j < lengths[e][t]) for j in range(R)] for t in range(T)] for e in range(E)])
    values, rewards = torch.randn(E, T, R) * mask, torch.rand(E, T)
    dones, next_values = (torch.rand(E, T) < 0.3).float(), torch.randn(E)
    adv, _ = tppo.compute_advantages(rewards, values, mask, next_values, dones, gamma=0.95, lam=0.9)
    expected = bad_backup_reference(rewards, values, lengths, next_values, dones, 0.95, 0.9)
    torch.testing.assert_close(adv, expected, rtol=1e-5, atol=1e-6)


# ---- losses -----------------------------------------------------------------------------------------------------
def test_ratio_is_per_token_and_the_loss_a_token_mean():
    args = replace(tppo.Args(), epsilon=0.2, entropy_coef=0.0)
    old = torch.zeros(2, 3)
    logprobs = torch.tensor([[0.1, -0.05, 0.05], [0.3, 0.2, 5.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, stats = tppo.policy_loss(logprobs, old, torch.ones(2, 3), mask, torch.zeros(2, 3), 5.0,
                                   args)
    e = lambda x: torch.exp(torch.tensor(x)).item()  # noqa: E731
    # ratios e^0.1, e^-0.05, e^0.05 unclipped; e^0.3 = 1.35 and e^0.2 = 1.22 > 1.2 are clipped;
    # padding ignored
    assert loss.item() == pytest.approx((-e(0.1) - e(-0.05) - e(0.05) - 1.2 - 1.2) / 5)
    assert stats["clipfrac"] == pytest.approx(2 / 5)
    assert stats["approx_kl"] == pytest.approx(sum(e(x) - 1 - x for x in (0.1, -0.05, 0.05, 0.3, 0.2)) / 5, rel=1e-5)
    loss.backward()
    torch.testing.assert_close(logprobs.grad,
                               torch.tensor([[-e(0.1) / 5, -e(-0.05) / 5, -e(0.05) / 5],
                                             [0, 0, 0]]))


def test_clipped_huber_value_loss_is_a_token_mean():
    args = replace(tppo.Args(), cliprange_value=0.2, huber_delta=10.0, vf_coef=1.0)
    values = torch.tensor([[1.0, 1.0, 7.0]], requires_grad=True)
    loss, stats = tppo.value_loss(values, torch.zeros(1, 3), torch.tensor([[0.5, 12.0, 0.0]]),
                                  torch.tensor([[1, 1, 0]]), 2.0, args)
    # as in test_appo: 0.125 (unclipped wins) and 68 (clipped wins, Huber beyond delta 10); the
    # padding is out
    assert loss.item() == pytest.approx((0.125 + 68) / 2) and stats["v_loss"] == pytest.approx((0.125 + 68) / 2)
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.25, 0.0, 0.0]]))


def test_both_losses_are_token_means_over_the_minibatch():
    # loss_normaliser counts the minibatch's tokens (APPO's counts its steps): steps of 3 tokens
    # and of 1 make 4. At ratio 1 the policy loss is then minus the mean advantage over those 4
    # tokens, -(1 + 2 + 3 + 6) / 4 = -3, and the value loss the mean of their squared errors / 2.
    args = replace(tppo.Args(), entropy_coef=0.0, cliprange_value=10.0)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    normaliser = tppo.loss_normaliser(mask, args, world_size=1)
    assert normaliser == 4.0
    zeros = torch.zeros(2, 3)
    loss, _ = tppo.policy_loss(zeros, zeros, torch.tensor([[1.0, 2, 3], [6, 9, 9]]), mask, zeros,
                               normaliser, args)
    assert loss.item() == pytest.approx(-3.0)
    loss, _ = tppo.value_loss(zeros, zeros, torch.tensor([[1.0, 2, 1], [2, 5, 5]]), mask,
                              normaliser, args)
    assert loss.item() == pytest.approx((1 + 4 + 1 + 4) / 2 / 4)  # Huber: x^2 / 2 below delta 10


def test_advantages_are_standardised_over_non_pad_tokens():
    adv = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    # mean 2, unbiased std 1 over the three real tokens; the padding comes back as 0
    torch.testing.assert_close(masked_whiten(adv, mask.float(), eps_on_std=True),
                               torch.tensor([[-1.0, 0.0], [1.0, 0.0]]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("shift,skipped", [(0.1, False), (0.3, True)])
def test_kl_early_stop_skips_the_policy_step(shift, skipped):
    # per token: e^0.1 - 1.1 = 0.005 < 0.02 (kept), e^0.3 - 1.3 = 0.050 > 0.02 (skipped)
    policy = load_policy("tiny-random")
    torch.manual_seed(0)
    ids = torch.randint(3, 1000, (4, 10))
    attn = torch.ones_like(ids)
    with torch.no_grad():
        lp, _ = token_logprobs(policy, ids, attn, 4, temperature=0.7)
    done = torch.ones(4, dtype=torch.bool)
    gen = Generation(ids[:, :6], attn[:, :6], ids[:, 6:], torch.ones(4, 4, dtype=torch.long), lp,
                     done, ~done)
    before = [p.detach().clone() for p in policy.parameters()]
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    args = replace(tppo.Args(), micro_batch_size=2, skip_kl=0.02)
    stats = tppo.update_policy(policy, optimizer, gen, lp - shift, torch.randn(4, 4),
                               torch.arange(4), 2, args,
                               SimpleNamespace(autocast=nullcontext(), guard=StepGuard(),
                                               device=torch.device("cpu"), world=1,
                                               sync_gradients=lambda m: clip_grad_norm(m, args.max_grad_norm)))
    moved = max((p - b).abs().max().item() for p, b in zip(policy.parameters(), before))
    assert stats["approx_kl"] == pytest.approx(float(torch.exp(torch.tensor(shift)) - 1 - shift),
                                               abs=1e-5)
    assert stats["early_stop_frac"] == float(skipped)
    assert (moved == 0.0) if skipped else (moved > 1e-4)


# ---- arguments ----------------------------------------------------------------------------------------------------
def test_algorithm_name_and_help():
    parse_args(tppo.Args, ["--algorithm_name", "tppo"])
    with pytest.raises(ValueError, match="this file is TPPO; run appo.py"):
        parse_args(tppo.Args, ["--algorithm_name", "APPO"])
    out = run([sys.executable, "tppo.py", "--help"]).stdout
    for f in fields(tppo.Args):
        assert f"--{f.name}" in out, f.name
        assert field_docs(tppo.Args).get(f.name), f"{f.name} has no docstring"


# ---- end to end -----------------------------------------------------------------------------------------------
def test_two_updates_with_a_tiny_prm_write_metrics_and_a_loadable_checkpoint(tmp_path):
    run([sys.executable, "tppo.py", *TINY, "--prm_model_name_or_path", "tiny-random",
         "--outcome_reward_coef", "1",
         "--max_steps", "2", "--num_eval_problems", "2", "--output_dir", str(tmp_path)])
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
    assert 0 < lines[0]["prm_reward"] < 1
    assert [json.loads(x)["step"] for x in (tmp_path / "eval.jsonl").read_text().splitlines()] == [0, 2]
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint-2").config.num_hidden_layers == 2


@pytest.mark.slow  # the second tier: torchrun
def test_torchrun_two_processes_match_one_process_and_resume_continues_exactly(tmp_path):
    common = ["tests/run_with_test_reward.py", "tppo", *TINY, "--learning_rate", "1e-3",
              "--critic_learning_rate", "1e-3",
              "--temperature", "1.0", "--num_eval_problems", "0", "--max_episode_steps", "3",
              "--skip_kl", "0",
              # the entropy bonus gives every weight a real gradient: with none, Adam blows the 1-
              # vs 2-process rounding on the weights whose gradient is ~0 up to 1.6e-4, too close to
              # a real error (~1e-3)
              "--entropy_coef", "0.01"]
    run([sys.executable, *common, "--max_steps", "2", "--save_interval", "1", "--output_dir",
         str(tmp_path / "one")])
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", "29526"]
    run([*torchrun, *common, "--max_steps", "1", "--output_dir", str(tmp_path / "two")])
    run([*torchrun, *common, "--max_steps", "2", "--output_dir", str(tmp_path / "two"), "--resume"])
    from common.models.loading import tiny_random_model

    start = tiny_random_model().state_dict()
    for k in (1, 2):
        one, two = params(tmp_path / f"one/checkpoint-{k}"), params(tmp_path / f"two/checkpoint-{k}")
        assert max((one[n] - start[n]).abs().max().item() for n in one) > 1e-3
        # see test_appo: Adam on ~0 gradients
        assert max((one[n] - two[n]).abs().max().item() for n in one) < 1e-4
    c1 = torch.load(tmp_path / "one/checkpoint-2/trainer_state.pt",
                    weights_only=False)["extra"]["critic"]
    c2 = torch.load(tmp_path / "two/checkpoint-2/trainer_state.pt",
                    weights_only=False)["extra"]["critic"]
    assert max((c1[n] - c2[n]).abs().max().item() for n in c1) < 1e-4


def test_openr_command_line_runs(tmp_path):
    math500 = tmp_path / "math_500.jsonl"
    math500.write_text("".join(json.dumps({"problem": f"What is ${i} + {i}$?",
                                           "final_answer": str(2 * i)}) + "\n"
                               for i in range(10)))
    out = run([sys.executable, "tppo.py", "--dataset_path", str(math500), "--model_name_or_path",
               "tiny-random",
               "--prm_model_name_or_path", "tiny-random", "--algorithm_name", "TPPO",
               "--num_mini_batch", "4",
               "--ppo_epoch", "1", "--num_env_steps", "32", "--episode_length", "8",
               "--n_rollout_threads", "4",
               "--max_new_tokens", "4", "--num_eval_problems", "0", "--output_dir",
               str(tmp_path / "run")])
    # 32 env steps / (8 x 4)
    assert "reading it as math" in out.stdout and "--max_steps 1" in out.stdout
    assert "--ppo_epoch is OpenR's name for --num_ppo_epochs" in out.stdout
    assert len((tmp_path / "run/metrics.jsonl").read_text().splitlines()) == 1
