"""sapo.py: SAPO's gate against hand-worked values (its value and slope at ratio 1, which
temperature takes which sign of the advantage, clipfrac's half slope), its option check, a short run
on the tiny model, and (second tier) its loss and gradient against TRL's GRPOTrainer with
loss_type="sapo". The rest of the file is grpo.py's, held to its text by tests/test_layers.py's
copies."""

import json
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import grpo
import sapo
from common.errors import UsageError
from common.run.checks import check_options
from trl_steps import a_batch, file_step, trl_training_step
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "8", "--num_eval_problems", "0",
        "--num_prompts", "2", "--num_generations", "4", "--max_steps", "1",
        "--learning_rate", "1e-3", "--temperature", "1.0"]


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


# ---- the gate ---------------------------------------------------------------------------------
def test_each_sign_of_the_advantage_takes_its_own_temperature():
    # tau+ 1, tau- 2; ratio 1.5 (pi_old 0.2, pi 0.3) on two one-token responses, A = +1 and -1;
    # per-sequence means, then their mean over 2.
    # A > 0, tau 1: f = sigmoid(0.5) 4 / 1 = 2.48984; A < 0, tau 2: f = sigmoid(1) 4 / 2 = 1.46212.
    # L = (-2.48984 + 1.46212) / 2 = -0.51386.
    # df/dlog pi = 4 s (1 - s) rho: 4 (0.62246)(0.37754)(1.5) = 1.41002 and
    # 4 (0.73106)(0.26894)(1.5) = 1.17967; dL/dlog pi = -A (that) / 2 = -0.70501, +0.58984.
    args = replace(sapo.Args(), sapo_temperature_pos=1.0, sapo_temperature_neg=2.0)
    old = torch.log(torch.full((2, 1), 0.2))
    new = torch.log(torch.full((2, 1), 0.3)).requires_grad_()
    loss, stats = sapo.policy_loss(new, old, torch.tensor([1.0, -1.0]), torch.ones(2, 1), 2.0,
                                   args)
    assert loss.item() == pytest.approx((-sigmoid(0.5) * 4 + sigmoid(1.0) * 2) / 2)
    assert loss.item() == pytest.approx(-0.51386, abs=1e-5)
    loss.backward()
    slopes = [4 * sigmoid(0.5) * (1 - sigmoid(0.5)), 4 * sigmoid(1.0) * (1 - sigmoid(1.0))]
    assert new.grad[:, 0].tolist() == pytest.approx([-slopes[0] * 1.5 / 2, slopes[1] * 1.5 / 2])
    assert new.grad[:, 0].tolist() == pytest.approx([-0.70501, 0.58984], abs=1e-5)
    assert stats["clipfrac"] == 0  # slopes 0.94 and 0.79: over a half


@pytest.mark.parametrize("tau", [1.0, 1.05, 3.0])
def test_at_ratio_one_the_slope_is_grpos_and_the_value_two_over_tau(tau):
    # f(1) = sigmoid(0) 4 / tau = 2 / tau (GRPO's rho A is 1 A: a constant apart, no gradient in
    # it); f'(1) = 4 (1/2)(1/2) = 1, GRPO's: on policy the gradient is -A d(log pi), whatever tau.
    args = replace(sapo.Args(), sapo_temperature_pos=tau, sapo_temperature_neg=tau)
    lp = torch.log(torch.tensor([[0.25]])).requires_grad_()
    loss, _ = sapo.policy_loss(lp, lp.detach(), torch.tensor([1.0]), torch.ones(1, 1), 1.0, args)
    assert loss.item() == pytest.approx(-2 / tau)
    loss.backward()
    assert lp.grad.item() == pytest.approx(-1.0)


def test_at_ratio_one_the_gradient_is_grpo_pys():
    # A batch of uneven lengths with the KL in the loss: the same gradient as grpo.py's, per-sequence
    # means (the default of both), with TRL's temperatures
    mask = torch.ones(4, 5)
    mask[1, 3:] = mask[3, 1:] = 0
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5])
    grads = []
    for module in (sapo, grpo):
        lp = (torch.randn(4, 5, generator=torch.Generator().manual_seed(1)) - 2).requires_grad_()
        args = replace(module.Args(), beta=0.1)
        norm = module.loss_normaliser(mask, args, world_size=1)
        loss, _ = module.policy_loss(lp, lp.detach(), adv, mask, norm, args, lp.detach() - 0.3)
        loss.backward()
        grads.append(lp.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-6, atol=1e-7)


def test_clipfrac_counts_the_tokens_whose_slope_is_under_a_half():
    # 4 s (1 - s) = 1/2 at |tau (rho - 1)| = log((1 + 2^-1/2) / (1 - 2^-1/2)) = 1.7627. tau 1:
    # rho 3 (x = 2, slope 0.420) counts, rho 2.5 (x = 1.5, slope 0.597) not; a negative advantage
    # at tau- 2 and rho 2 (x = 2) counts.
    args = replace(sapo.Args(), sapo_temperature_pos=1.0, sapo_temperature_neg=2.0)
    old = torch.log(torch.full((3, 1), 0.1))
    new = torch.log(torch.tensor([[0.3], [0.25], [0.2]]))
    _, stats = sapo.policy_loss(new, old, torch.tensor([1.0, 1.0, -1.0]), torch.ones(3, 1), 3.0,
                                args)
    assert stats["clipfrac"] == pytest.approx(2 / 3)


def test_the_defaults_are_trls():
    args = sapo.Args()
    assert (args.sapo_temperature_pos, args.sapo_temperature_neg) == (1.0, 1.05)
    assert (args.loss_type, args.importance_sampling_level, args.beta) == ("grpo", "token", 0.0)
    assert not hasattr(args, "epsilon")


@pytest.mark.parametrize("change,message", [
    ({"sapo_temperature_pos": 0.0}, "--sapo_temperature_pos 0.0: the gate divides by it"),
    ({"sapo_temperature_neg": -1.05}, "--sapo_temperature_neg -1.05: the gate divides by it"),
])
def test_option_errors_name_the_fix(change, message, tmp_path):
    args = replace(sapo.Args(), output_dir=str(tmp_path / "run"), **change)
    with pytest.raises(UsageError) as e:
        check_options(args, sapo.check_args, world_size=1)
    assert str(e.value).startswith(message)


# ---- end to end --------------------------------------------------------------------------------------
def run(algo, flags, out):
    cmd = [sys.executable, "tests/run_with_test_reward.py", algo, *TINY, *flags,
           "--output_dir", str(out)]
    done = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                    env={**os.environ, "TEST_REWARD": "length"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[0]), done.stdout


def test_one_epoch_is_grpo_pys_update_and_a_hot_gate_fades_the_second(tmp_path):
    # One epoch of one minibatch: the ratio is 1, the gate's slope 1, the update grpo.py's (the
    # same gradient norm; pg_loss is -2 A / tau, not -A). A second epoch at temperatures of 1000
    # halves the slope of every token whose ratio left 1 by more than 0.0018, none in the first.
    ours, printed = run("sapo", [], tmp_path / "sapo")
    theirs, _ = run("grpo", [], tmp_path / "grpo")
    assert "SAPO | 1 process(es) on cpu" in printed
    assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-5) and ours["grad_norm"] > 0
    assert ours["clipfrac"] == 0 and ours["pg_loss"] != pytest.approx(theirs["pg_loss"])
    hot, _ = run("sapo", ["--num_ppo_epochs", "2", "--sapo_temperature_pos", "1000",
                          "--sapo_temperature_neg", "1000"], tmp_path / "hot")
    assert 0.25 < hot["clipfrac"] <= 0.5 and hot["approx_kl"] > 0


# ---- against TRL's own code -------------------------------------------------------------------
@pytest.mark.slow  # the second tier: TRL's code
@pytest.mark.parametrize("temperatures", [(1.0, 1.05), (0.5, 2.0)])
def test_the_loss_and_gradient_equal_trls_sapo_on_the_same_batch(tmp_path, temperatures):
    # sapo.py's group advantages, k3 KL in the loss, gate and per-sequence means, against
    # GRPOTrainer's training_step with loss_type="sapo" on the same weights and batch (beta 0.04,
    # temperature 0.7, the KL without TRL's ratio: use_bias_correction_kl False), at TRL's
    # temperatures and at two far apart (the loss, 2 / tau A a token, tells which sign took which).
    # One epoch of one minibatch: the ratio is 1 on both sides, the gate off 1 is checked by hand.
    pytest.importorskip("trl")
    from trl import GRPOConfig, GRPOTrainer

    pos, neg = temperatures
    batch = a_batch()
    args = replace(sapo.Args(), beta=0.04, temperature=0.7, num_generations=4, max_new_tokens=5,
                   sapo_temperature_pos=pos, sapo_temperature_neg=neg)
    loss, policy = file_step(sapo, batch, args)
    trl_loss, trl_model, trl_advantages = trl_training_step(
        GRPOTrainer, GRPOConfig, tmp_path, batch, beta=0.04, temperature=0.7, loss_type="sapo",
        sapo_temperature_pos=pos, sapo_temperature_neg=neg, use_bias_correction_kl=False)
    torch.testing.assert_close(trl_advantages, sapo.group_advantages(batch.scores, 4),
                               atol=1e-6, rtol=0)
    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-5, abs=1e-8)  # fp32 rounding
    for (name, ours), theirs in zip(policy.named_parameters(), trl_model.parameters()):
        # fp32 rounding, and TRL's chunked log-softmax: under 1e-6 of the gradient's norm
        assert ((ours.grad - theirs.grad).norm() / theirs.grad.norm()).item() < 2e-6, name
