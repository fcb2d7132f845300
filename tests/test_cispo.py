"""cispo.py: CISPO's surrogate against hand-worked values (the capped weight, detached, still passes
a gradient), its option check, a short run on the tiny model, and (second tier) its loss and
gradient against TRL's GRPOTrainer with loss_type="cispo". The rest of the file is grpo.py's, held
to its text by tests/test_layers.py's copies."""

import json
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import cispo
import grpo
from common.errors import UsageError
from common.run.checks import check_options
from trl_steps import a_batch, file_step, trl_training_step
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "8", "--num_eval_problems", "0",
        "--num_prompts", "2", "--num_generations", "4", "--max_steps", "1",
        "--learning_rate", "1e-3", "--temperature", "1.0"]


# ---- the surrogate ------------------------------------------------------------------------------
def three_tokens():
    """One token a row, pi_old 0.2 each; ratios 0.5, 3 and 3, advantages +1, +1 and -1."""
    old = torch.log(torch.full((3, 1), 0.2))
    new = torch.log(torch.tensor([[0.1], [0.6], [0.6]])).requires_grad_()
    return new, old, torch.tensor([1.0, 1.0, -1.0]), torch.ones(3, 1)


def test_the_capped_weight_still_passes_a_gradient():
    # epsilon_high 2, a token mean over 3 tokens. The weights: min(0.5, 2) = 0.5, min(3, 2) = 2,
    # min(3, 2) = 2. L = -(0.5 * 1 * log 0.1 + 2 * 1 * log 0.6 + 2 * (-1) * log 0.6) / 3: the last
    # two cancel, L = -0.5 log 0.1 / 3 = 0.38376. dL/dlog pi = -w A / 3 = -0.5/3, -2/3, +2/3: the
    # second token, capped (A > 0, ratio 3 > 2), keeps a gradient of 2/3, where grpo.py's clip
    # (1 + 0.2) gives it none.
    new, old, adv, mask = three_tokens()
    args = replace(cispo.Args(), epsilon_high=2.0, loss_type="bnpo")
    loss, stats = cispo.policy_loss(new, old, adv, mask, 3.0, args)
    assert loss.item() == pytest.approx(-0.5 * math.log(0.1) / 3)
    loss.backward()
    assert new.grad[:, 0].tolist() == pytest.approx([-0.5 / 3, -2 / 3, 2 / 3])
    # TRL's cispo_clip_ratio: capped where A > 0 (the third token's A < 0 is not counted)
    assert stats["clipfrac"] == pytest.approx(1 / 3)
    clipped = new.detach().requires_grad_()
    grpo_loss, _ = grpo.policy_loss(clipped, old, adv, mask, 3.0,
                                    replace(grpo.Args(), loss_type="bnpo"))
    grpo_loss.backward()
    assert clipped.grad[1, 0].item() == 0.0


def test_the_weight_is_detached():
    # Were the weight not detached, d(-rho A log pi)/dlog pi = -A rho (1 + log pi): for the first
    # token -0.5 (1 + log 0.1) / 3 = +0.217, not -0.5 / 3. The gradient is the weight's, times A.
    new, old, adv, mask = three_tokens()
    args = replace(cispo.Args(), epsilon_high=2.0, loss_type="bnpo")
    loss, _ = cispo.policy_loss(new, old, adv, mask, 3.0, args)
    loss.backward()
    assert new.grad[0, 0].item() == pytest.approx(-0.5 / 3)
    assert new.grad[0, 0].item() != pytest.approx(-0.5 * (1 + math.log(0.1)) / 3)


def test_at_ratio_one_the_gradient_is_grpo_pys_token_mean():
    # rho = 1: every weight is 1, and -A log pi has grpo.py's gradient -A rho d(log pi). The loss
    # values differ (CISPO's holds log pi), the gradients do not.
    torch.manual_seed(0)
    mask = torch.ones(4, 5)
    mask[1, 3:] = mask[3, 1:] = 0
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5])
    grads = []
    for module in (cispo, grpo):
        lp = (torch.randn(4, 5, generator=torch.Generator().manual_seed(1)) - 2).requires_grad_()
        args = replace(module.Args(), loss_type="dapo", beta=0.1)
        norm = module.loss_normaliser(mask, args, world_size=1)
        loss, stats = module.policy_loss(lp, lp.detach(), adv, mask, norm, args, lp.detach() - 0.3)
        loss.backward()
        grads.append(lp.grad)
        assert stats["clipfrac"] == 0
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-6, atol=1e-7)


def test_the_defaults_are_trls_advice():
    args = cispo.Args()
    # TRL's epsilon_high None would fall back to epsilon 0.2: a cap of 0.2 on every weight
    assert (args.epsilon_high, args.loss_type, args.beta) == (5.0, "dapo", 0.0)
    assert not hasattr(args, "epsilon") and not hasattr(args, "importance_sampling_level")


@pytest.mark.parametrize("change,message", [
    ({"epsilon_high": 1.0}, "--epsilon_high 1.0 caps the weight rho, not rho - 1"),
    ({"epsilon_high": 0.28}, "--epsilon_high 0.28 caps the weight rho, not rho - 1"),
    ({"epsilon_high": 0.0}, "--epsilon_high 0.0: must be > 0"),
])
def test_option_errors_name_the_fix(change, message, tmp_path):
    args = replace(cispo.Args(), output_dir=str(tmp_path / "run"), **change)
    with pytest.raises(UsageError) as e:
        check_options(args, cispo.check_args, world_size=1)
    assert str(e.value).startswith(message)


# ---- end to end --------------------------------------------------------------------------------------
def run(algo, flags, out):
    cmd = [sys.executable, "tests/run_with_test_reward.py", algo, *TINY, *flags,
           "--output_dir", str(out)]
    done = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                    env={**os.environ, "TEST_REWARD": "length"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[0]), done.stdout


def test_one_epoch_is_grpo_pys_update_and_a_second_caps_weights(tmp_path):
    # One epoch of one minibatch: every weight is 1, so the update is grpo.py's --loss_type dapo
    # (the same gradient norm; pg_loss differs, as CISPO's holds log pi). A second epoch at a cap
    # just above 1 caps the weights of the tokens with A > 0 whose ratio rose: some, never more
    # than the half of the micro-batches that the second epoch is.
    ours, printed = run("cispo", [], tmp_path / "cispo")
    theirs, _ = run("grpo", ["--loss_type", "dapo"], tmp_path / "grpo")
    assert "CISPO | 1 process(es) on cpu" in printed
    assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-5) and ours["grad_norm"] > 0
    assert ours["clipfrac"] == 0 and ours["pg_loss"] != pytest.approx(theirs["pg_loss"])
    capped, _ = run("cispo", ["--num_ppo_epochs", "2", "--epsilon_high", "1.001"],
                    tmp_path / "capped")
    assert 0 < capped["clipfrac"] < 0.5 and capped["approx_kl"] > 0


# ---- against TRL's own code -------------------------------------------------------------------
@pytest.mark.slow  # the second tier: TRL's code
def test_the_loss_and_gradient_equal_trls_cispo_on_the_same_batch(tmp_path):
    # cispo.py's group advantages, k3 KL in the loss, capped detached weight and token mean over
    # the batch, against GRPOTrainer's training_step with loss_type="cispo" on the same weights
    # and batch (beta 0.04, temperature 0.7, epsilon_high cispo.py's 5.0, the KL without TRL's
    # ratio: use_bias_correction_kl False). One epoch of one minibatch: the ratio is 1 on both
    # sides, the cap is checked by hand above.
    pytest.importorskip("trl")
    from trl import GRPOConfig, GRPOTrainer

    batch = a_batch()
    args = replace(cispo.Args(), beta=0.04, temperature=0.7, num_generations=4, max_new_tokens=5)
    loss, policy = file_step(cispo, batch, args)
    trl_loss, trl_model, trl_advantages = trl_training_step(
        GRPOTrainer, GRPOConfig, tmp_path, batch, beta=0.04, temperature=0.7, loss_type="cispo",
        epsilon_high=args.epsilon_high, use_bias_correction_kl=False)
    torch.testing.assert_close(trl_advantages, cispo.group_advantages(batch.scores, 4),
                               atol=1e-6, rtol=0)
    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-5, abs=1e-8)  # fp32 rounding
    for (name, ours), theirs in zip(policy.named_parameters(), trl_model.parameters()):
        # fp32 rounding, and TRL's chunked log-softmax: under 1e-6 of the gradient's norm
        assert ((ours.grad - theirs.grad).norm() / theirs.grad.norm()).item() < 2e-6, name
