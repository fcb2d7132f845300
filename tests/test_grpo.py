"""grpo.py: the loss against hand-computed values, micro-batching, and end-to-end runs on the tiny
model (single process, torchrun with 2 CPU processes, resume)."""

import json
import math
import os
import re
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import grpo
from common.env import math_env as envlib
from common.run.args import field_docs
from common.models.logprobs import token_logprobs
from common.errors import PathError
from common.run.checks import check_options
from trl_steps import a_batch, moved_policy, trl_training_step
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "8", "--num_eval_problems", "4",
        "--num_prompts", "2", "--num_generations", "4", "--micro_batch_size", "2"]


def run(cmd, **kw):
    out = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def params(path):
    return load_file(str(Path(path) / "model.safetensors"))


# ---- the loss -----------------------------------------------------------------------------------------------
def _batch(lengths, R=4):
    torch.manual_seed(0)
    mask = torch.zeros(len(lengths), R)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    logprobs = (torch.randn(len(lengths), R) - 2).requires_grad_()
    advantages = torch.tensor([1.0, -0.5, 2.0, -1.5])[:len(lengths)]
    return logprobs, mask, advantages


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_loss_at_ratio_one_is_minus_mean_advantage(loss_type):
    # Full-length responses: every aggregation reduces to -mean(A) when the ratio is 1 and beta is
    # 0.
    logprobs, mask, adv = _batch([4, 4, 4, 4])
    args = replace(grpo.Args(), loss_type=loss_type, max_new_tokens=4)
    norm = grpo.loss_normaliser(mask, args, world_size=1)
    loss, stats = grpo.policy_loss(logprobs, logprobs.detach(), adv, mask, norm, args, None)
    assert loss.item() == pytest.approx(-adv.mean().item())  # -(1 - 0.5 + 2 - 1.5) / 4 = -0.25
    assert stats["clipfrac"] == 0 and stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("loss_type,expected", [
    # lengths 1, 2, 3, 4 and advantages 1, -0.5, 2, -1.5
    # per-sequence means, then mean: -mean(A)
    ("grpo", -(1 - 0.5 + 2 - 1.5) / 4),
    ("bnpo", -(1 * 1 - 0.5 * 2 + 2 * 3 - 1.5 * 4) / 10),     # token mean over 10 tokens
    ("dapo", -(1 * 1 - 0.5 * 2 + 2 * 3 - 1.5 * 4) / 10),     # same on one process
    ("dr_grpo", -(1 * 1 - 0.5 * 2 + 2 * 3 - 1.5 * 4) / 16),  # constant: 4 sequences * 4 max tokens
])
def test_loss_aggregation_with_uneven_lengths(loss_type, expected):
    logprobs, mask, adv = _batch([1, 2, 3, 4])
    args = replace(grpo.Args(), loss_type=loss_type, max_new_tokens=4)
    norm = grpo.loss_normaliser(mask, args, world_size=1)
    loss, _ = grpo.policy_loss(logprobs, logprobs.detach(), adv, mask, norm, args, None)
    assert loss.item() == pytest.approx(expected)


def test_loss_clips_only_in_the_direction_of_the_advantage():
    args = replace(grpo.Args(), epsilon=0.2)
    mask = torch.ones(2, 1)
    old = torch.zeros(2, 1)
    new = torch.log(torch.tensor([[1.5], [1.5]])).requires_grad_()  # ratio 1.5 for both
    loss, stats = grpo.policy_loss(new, old, torch.tensor([1.0, -1.0]), mask, 2.0, args, None)
    # A > 0: min(1.5, 1.2) * 1 -> -1.2 (clipped, no gradient); A < 0: max(1.5, 1.2) * 1 -> +1.5
    # (unclipped)
    assert loss.item() == pytest.approx((-1.2 + 1.5) / 2)
    assert stats["clipfrac"] == pytest.approx(0.5)
    loss.backward()
    assert new.grad[0].item() == 0.0 and new.grad[1].item() == pytest.approx(1.5 / 2)


def test_k3_penalty_is_added_per_token():
    args = replace(grpo.Args(), beta=0.1)
    lp = torch.log(torch.tensor([[0.5]])).requires_grad_()
    ref = torch.log(torch.tensor([[0.25]]))
    loss, stats = grpo.policy_loss(lp, lp.detach(), torch.tensor([0.0]), torch.ones(1, 1), 1.0,
                                   args, ref)
    k3 = 0.5 - 1 - torch.log(torch.tensor(0.5)).item()  # q/p - 1 - log(q/p), q/p = 0.5
    assert loss.item() == pytest.approx(0.1 * k3) and stats["kl_ref"] == pytest.approx(k3)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_micro_batches_1x8_and_8x1_give_the_same_gradient(loss_type):
    from common.models.loading import load_policy

    policy = load_policy("tiny-random")
    torch.manual_seed(3)
    ids = torch.randint(3, 1000, (8, 12))
    attn = torch.ones_like(ids)
    R = 6
    response_mask = torch.ones(8, R)
    for i in range(8):
        response_mask[i, 1 + i % 5:] = 0  # uneven lengths
    attn[:, -R:] = response_mask.long()
    adv = torch.linspace(-1, 1, 8)
    args = replace(grpo.Args(), loss_type=loss_type, max_new_tokens=R)
    norm = grpo.loss_normaliser(response_mask, args, world_size=1)
    grads, losses = [], []
    for mb in (8, 1):
        policy.zero_grad()
        total = 0.0
        for i in range(0, 8, mb):
            sl = slice(i, i + mb)
            lp, _ = token_logprobs(policy, ids[sl], attn[sl], R)
            # perturb the ratio away from 1 so the clipping path is exercised too
            loss, _ = grpo.policy_loss(lp, lp.detach() - 0.3, adv[sl], response_mask[sl], norm,
                                       args, None)
            loss.backward()
            total += loss.item()
        losses.append(total)
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters()]))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert ((grads[0] - grads[1]).norm() / grads[0].norm()).item() < 1e-5


def test_group_advantages_by_hand_and_dr_grpo_without_std():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    # group 1: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3); group 2: all equal -> exactly
    # 0
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    torch.testing.assert_close(grpo.group_advantages(rewards, 4),
                               torch.tensor([a, -a, a, -a, 0, 0, 0, 0.0]))
    torch.testing.assert_close(grpo.group_advantages(rewards, 4, scale=False),
                               torch.tensor([0.5, -0.5, 0.5, -0.5, 0, 0, 0, 0.0]))


@pytest.mark.parametrize("loss_type,expected",
                         [("grpo", 2.0), ("bnpo", 5.0), ("dapo", 5.0), ("dr_grpo", 8.0)])
def test_dropped_groups_leave_the_normaliser(loss_type, expected):
    # 4 rows of lengths 3, 2, 1, 4 (max 4); the second group (rows 2, 3) is dropped: its mask is
    # zeroed. Kept: 2 sequences, 5 tokens; dr_grpo: 2 sequences x 4 max tokens.
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float)
    mask[2:] = 0
    args = replace(grpo.Args(), loss_type=loss_type, max_new_tokens=4)
    assert grpo.loss_normaliser(mask, args, world_size=1) == expected


# ---- argument checks ----------------------------------------------------------------------------------------
def test_bad_sizes_fail_before_any_model_loads():
    with pytest.raises(ValueError, match="divisible by the number of processes"):
        check_options(replace(grpo.Args(), num_prompts=3), grpo.check_args, world_size=2)
    # micro-batches of up to 5: fine
    check_options(replace(grpo.Args(), micro_batch_size=5), grpo.check_args, world_size=1)
    with pytest.raises(ValueError, match="num_generations must be >= 2"):
        check_options(replace(grpo.Args(), num_generations=1), grpo.check_args, world_size=1)
    with pytest.raises(PathError, match="no such folder"):
        check_options(replace(grpo.Args(), model_name_or_path="./no/such/model"), grpo.check_args, world_size=1)


def test_help_documents_every_field():
    out = run([sys.executable, "grpo.py", "--help"]).stdout
    docs = field_docs(grpo.Args)
    for f in fields(grpo.Args):
        assert f"--{f.name}" in out, f.name
        assert docs.get(f.name), f"{f.name} has no docstring"


# ---- end to end -----------------------------------------------------------------------------------------------
def test_two_updates_write_two_metric_lines_and_a_loadable_checkpoint(tmp_path):
    err = run([sys.executable, "grpo.py", *TINY, "--max_steps", "2", "--eval_batch_size", "2",
               "--output_dir", str(tmp_path)]).stderr
    # the held-out evaluation before the first update shows its progress, batch by batch, before
    # the updates bar advances (a first evaluation can take minutes on a busy CPU)
    evaluated = [re.search(rf"held-out eval: +\d+%\|[^|]*\| {n}/4 \[", err) for n in (2, 4)]
    assert all(evaluated), err
    assert evaluated[0].start() < evaluated[1].start() < err.index("| 1/2 ["), err
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    for key in ("reward/mean", "reward/std", "accuracy", "response_len/mean", "truncated_frac",
                "entropy",
                "approx_kl", "clipfrac", "grad_norm", "lr", "tokens_per_s", "time/rollout_s",
                "time/update_s",
                "zero_std_frac"):
        assert key in lines[0], key
    # sampler and trainer agree in fp32 eager: only the kernels' rounding differs
    for line in lines:
        assert 0 <= line["mismatch/abs"] < 1e-4 and abs(line["mismatch/kl"]) < 1e-6
    assert [json.loads(x)["step"] for x in (tmp_path / "eval.jsonl").read_text().splitlines()] == [0, 2]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint-2")
    assert model.config.num_hidden_layers == 2


def test_torchrun_two_processes_match_one_process(tmp_path):
    # Same global batch (2 prompts x 4 samples), dapo loss (its normaliser is a global token count),
    # lr large enough that the update is visible: the parameters after one update must agree to fp32
    # tolerance.
    common = ["tests/run_with_test_reward.py", "grpo", *TINY, "--max_steps", "1", "--learning_rate",
              "1e-3",
              "--temperature", "1.0", "--loss_type", "dapo"]
    run([sys.executable, *common, "--output_dir", str(tmp_path / "one")])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
         "29517",
         *common, "--output_dir", str(tmp_path / "two")], env=env)
    one, two = params(tmp_path / "one/checkpoint-1"), params(tmp_path / "two/checkpoint-1")
    from common.models.loading import tiny_random_model

    start = tiny_random_model().state_dict()
    moved = max((one[k] - start[k]).abs().max().item() for k in one)
    assert moved > 1e-4  # the update did something
    # Adam's first steps move every weight by about lr (1e-3) whatever the size of its gradient, so
    # a wrong average, normaliser or baseline shows as ~1e-3; fp32 rounding, which differs between 1
    # and 2 processes and between CPUs, shows as up to ~3e-5 on the few weights whose gradient is
    # almost 0 (as in test_appo.py).
    assert max((one[k] - two[k]).abs().max().item() for k in one) < 1e-4
    m1 = [json.loads(x) for x in (tmp_path / "one/metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(x) for x in (tmp_path / "two/metrics.jsonl").read_text().splitlines()]
    assert m1[0]["reward/mean"] == pytest.approx(m2[0]["reward/mean"])
    # Adam's step hides the gradient's scale; its norm does not: the ranks' gradients are averaged,
    # not summed (a sum would double it)
    assert m2[0]["grad_norm"] == pytest.approx(m1[0]["grad_norm"], rel=1e-3)


def test_resume_continues_exactly(tmp_path):
    common = ["tests/run_with_test_reward.py", "grpo", *TINY, "--learning_rate", "1e-3"]
    run([sys.executable, *common, "--max_steps", "3", "--output_dir", str(tmp_path / "straight")])
    run([sys.executable, *common, "--max_steps", "2", "--output_dir", str(tmp_path / "split")])
    run([sys.executable, *common, "--max_steps", "3", "--output_dir", str(tmp_path / "split"),
         "--resume"])
    a, b = params(tmp_path / "straight/checkpoint-3"), params(tmp_path / "split/checkpoint-3")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6
    steps = [json.loads(x)["step"] for x in (tmp_path / "split/metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


# ---- variants: GSPO, KL placements ----------------------------------------------------------------------
def test_gspo_ratio_is_the_exp_of_the_mean_token_log_ratio():
    # 2 responses: log-ratios (0.1, 0.3) and (0.2, 9.0 on padding); advantages 1 and -1, no clipping (eps 10)
    args = replace(grpo.Args(), importance_sampling_level="sequence", epsilon=10.0)
    old = torch.zeros(2, 2)
    new = torch.tensor([[0.1, 0.3], [0.2, 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, _ = grpo.policy_loss(new, old, torch.tensor([1.0, -1.0]), mask, 2.0, args)
    r1, r2 = math.exp(0.2), math.exp(0.2)  # mean(0.1, 0.3) = 0.2; the padding's 9.0 is not in the mean
    assert loss.item() == pytest.approx((-r1 + r2) / 2, abs=1e-6)  # each response: the mean of its tokens
    loss.backward()
    # d/d log pi_t of -A exp(mean log-ratio): -A rho / |o| on each of the response's tokens
    torch.testing.assert_close(new.grad, torch.tensor([[-r1 / 2 / 2, -r1 / 2 / 2], [r2 / 2, 0.0]]))


@pytest.mark.parametrize("estimator,kl", [("k1", [0.5, -1.0]), ("k2", [0.125, 0.5]),
                                          ("k3", [math.exp(-0.5) - 0.5, math.e - 2])])
def test_kl_in_the_reward_and_in_the_loss(estimator, kl):
    # one response of 2 tokens: log pi = (-1, -2), log pi_ref = (-1.5, -1); beta 0.1
    logp, ref, mask = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), torch.ones(1, 2)
    from common.rl.numerics import kl_estimate

    per_token = kl_estimate(logp, ref, estimator)
    torch.testing.assert_close(per_token, torch.tensor([kl]))
    # in the reward: the score less beta times the response's summed KL
    reward = grpo.kl_penalised(torch.tensor([1.0]), per_token, mask, 0.1)
    assert reward.item() == pytest.approx(1.0 - 0.1 * sum(kl))
    # in the loss: beta times the per-token KL, aggregated like the surrogate (zero advantage here)
    args = replace(grpo.Args(), beta=0.1, kl_estimator=estimator, loss_type="grpo")
    loss, stats = grpo.policy_loss(logp, logp, torch.tensor([0.0]), mask, 1.0, args, ref)
    assert loss.item() == pytest.approx(0.1 * sum(kl) / 2) and stats["kl_ref"] == pytest.approx(sum(kl) / 2)


# ---- the update loop's wiring ------------------------------------------------------------------------------
def _test_reward_make_env():
    import run_with_test_reward  # tests/ is on sys.path under pytest

    return run_with_test_reward.make_env


def _spy(monkeypatch, module, name, record):
    """Wrap module.name so that record(result, *args) sees each call's arguments and result."""
    real = getattr(module, name)

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        record(out, *args, **kwargs)
        return out
    monkeypatch.setattr(module, name, spy)


def test_each_group_of_the_update_is_scored_against_its_own_mean(tmp_path, monkeypatch):
    # 2 prompts x 4 samples (num_prompts != num_generations) with scripted scores: the advantages
    # the loss gets are each group's z-scores, by hand.
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    advantages = []

    def script(batch, *args, **kwargs):
        batch.scores = scores.clone()
    _spy(monkeypatch, grpo, "rollout", script)
    _spy(monkeypatch, grpo, "policy_loss", lambda out, lp, old, adv, *a: advantages.append(adv))
    grpo.main(replace(grpo.Args(), model_name_or_path="tiny-random", max_new_tokens=4,
                      num_eval_problems=0, num_prompts=2, num_generations=4, micro_batch_size=8,
                      max_steps=1, output_dir=str(tmp_path)))
    # each group: mean 1/4 (3/4), unbiased std sqrt(3/16 * 4/3) = 1/2
    a, b = 0.75 / (0.5 + 1e-4), 0.25 / (0.5 + 1e-4)
    torch.testing.assert_close(advantages[0], torch.tensor([a, -b, -b, -b, b, b, -a, b]))


def test_the_kl_in_the_reward_is_the_samplers_to_the_references_once_the_policy_moved(
        tmp_path, monkeypatch):
    # --kl_penalty reward: update 2 samples from a policy that update 1 moved, so the estimate is
    # not 0, and k3 is not symmetric: the logged kl_ref is KL(sampler || reference), by hand.
    monkeypatch.setattr(envlib, "make_env", _test_reward_make_env())
    rollouts, refs = [], []
    _spy(monkeypatch, grpo, "rollout", lambda batch, *a, **kw: rollouts.append(batch))
    _spy(monkeypatch, grpo, "batched_token_logprobs", lambda lp, *a, **kw: refs.append(lp))
    grpo.main(replace(grpo.Args(), model_name_or_path="tiny-random", max_new_tokens=6,
                      num_eval_problems=0, num_prompts=2, num_generations=4, max_steps=2,
                      learning_rate=1e-2, temperature=1.0, beta=0.1, kl_penalty="reward",
                      output_dir=str(tmp_path)))
    gen, ref = rollouts[1].gen, refs[1]
    mask = gen.response_mask.float()
    log_ratio = ref - gen.logprobs  # log pi_ref / pi on the sampled tokens
    expected = ((torch.exp(log_ratio) - 1 - log_ratio) * mask).sum() / mask.sum()
    logged = [json.loads(x)["kl_ref"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged[0] == pytest.approx(0.0, abs=1e-6) and expected > 1e-3
    assert logged[1] == pytest.approx(expected.item(), rel=1e-4)


# ---- against TRL's own code -------------------------------------------------------------------
def grpo_step(batch, args, bias_corrected=False):
    """grpo.py's advantages, normaliser and loss on `batch` (trl_steps.a_batch), one micro-batch,
    as its update runs them (pi_old is the policy itself, detached: one epoch of one minibatch).
    bias_corrected adds TRL's use_bias_correction_kl (the KL times the ratio: 1 in value, not in
    gradient). -> (the loss, the policy, whose .grad hold the gradient)"""
    from common.models.logprobs import batched_token_logprobs
    from common.models.loading import load_policy

    gen, scores, policy = batch.gen(), batch.scores, moved_policy()
    ref_logprobs = batched_token_logprobs(load_policy("tiny-random"), gen, args.temperature, 8)
    advantages = grpo.group_advantages(scores, args.num_generations,
                                       scale=args.loss_type != "dr_grpo")
    mask = gen.response_mask
    norm = grpo.loss_normaliser(mask, args, world_size=1)
    input_ids, attention_mask = gen.sequences()
    logprobs, _ = token_logprobs(policy, input_ids, attention_mask, mask.shape[1], args.temperature)
    loss, _ = grpo.policy_loss(logprobs, logprobs.detach(), advantages, mask, norm, args,
                               ref_logprobs)
    if bias_corrected:  # + beta KL (rho - 1): 0 in value, beta KL d(log pi) in gradient
        kl = grpo.kl_estimate(logprobs, ref_logprobs, "k3").detach()
        ratio_minus_1 = torch.exp(logprobs - logprobs.detach()) - 1
        loss = loss + grpo.aggregate(args.beta * kl * ratio_minus_1, mask.float(), args.loss_type,
                                     norm)
    loss.backward()
    return loss, policy


@pytest.mark.slow  # the second tier: TRL's code
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_the_loss_and_gradient_equal_trls_grpo_trainer_on_the_same_batch(tmp_path, loss_type):
    # grpo.py's group advantages, k3 KL in the loss, clipped ratio and each of TRL's four
    # aggregations, against GRPOTrainer's training_step on the same weights and batch (beta 0.04,
    # temperature 0.7; Dr.GRPO keeps the std out of the advantage, TRL's scale_rewards "none").
    # TRL 1.16's default multiplies the KL by the ratio (use_bias_correction_kl): the test after.
    pytest.importorskip("trl")
    from trl import GRPOConfig, GRPOTrainer

    batch = a_batch()
    args = replace(grpo.Args(), beta=0.04, temperature=0.7, loss_type=loss_type,
                   num_generations=4, max_new_tokens=5)
    loss, policy = grpo_step(batch, args)
    trl_loss, trl_model, trl_advantages = trl_training_step(
        GRPOTrainer, GRPOConfig, tmp_path, batch, beta=0.04, temperature=0.7,
        loss_type=loss_type, scale_rewards="none" if loss_type == "dr_grpo" else "group",
        use_bias_correction_kl=False)
    advantages = grpo.group_advantages(batch.scores, 4, scale=loss_type != "dr_grpo")
    torch.testing.assert_close(trl_advantages, advantages, atol=1e-6, rtol=0)
    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-5, abs=1e-8)  # fp32 rounding
    for (name, ours), theirs in zip(policy.named_parameters(), trl_model.parameters()):
        # fp32 rounding, and TRL's chunked log-softmax: under 1e-6 of the gradient's norm
        assert ((ours.grad - theirs.grad).norm() / theirs.grad.norm()).item() < 2e-6, name


@pytest.mark.slow  # the second tier: TRL's code
def test_trls_default_kl_differs_from_grpo_py_by_the_ratio_in_the_gradient_only(tmp_path):
    # With TRL's default use_bias_correction_kl the loss is grpo.py's (the ratio is 1 on the
    # policy's own samples) and the gradient is grpo.py's plus beta KL_t d(log pi_t), about 1 %
    # of the gradient here: grpo.py keeps the GRPO paper's KL term, and this is the one term by
    # which TRL 1.16's default differs.
    pytest.importorskip("trl")
    from trl import GRPOConfig, GRPOTrainer

    batch = a_batch()
    args = replace(grpo.Args(), beta=0.04, temperature=0.7, loss_type="dapo",
                   num_generations=4, max_new_tokens=5)
    trl_loss, trl_model, _ = trl_training_step(GRPOTrainer, GRPOConfig, tmp_path, batch,
                                               beta=0.04, temperature=0.7, loss_type="dapo")
    plain, policy = grpo_step(batch, args)
    corrected, corrected_policy = grpo_step(batch, args, bias_corrected=True)
    assert plain.item() == pytest.approx(trl_loss.item(), rel=1e-5, abs=1e-8)
    assert corrected.item() == pytest.approx(plain.item(), rel=1e-6, abs=1e-9)
    parts = zip(policy.parameters(), corrected_policy.parameters(), trl_model.parameters())
    for ours, ours_corrected, theirs in parts:
        assert ((ours_corrected.grad - theirs.grad).norm() / theirs.grad.norm()).item() < 2e-6
        assert ((ours.grad - theirs.grad).norm() / theirs.grad.norm()).item() > 1e-3
