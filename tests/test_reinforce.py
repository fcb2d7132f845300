"""reinforce.py: baselines, KL-regularised returns and the loss against hand-computed values;
end-to-end runs on the tiny model (single process, torchrun with 2 CPU processes, resume with a
refreshed reference). Its stepwise sibling's: tests/test_reinforce_stepwise.py."""

import json
import math
import os
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import reinforce
from common.env import math_env as envlib
from common.run.args import field_docs, make_parser, parse_args
from common.models.logprobs import token_logprobs
from common.errors import PathError
from common.run.checks import check_options
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "8", "--num_eval_problems", "4",
        "--num_prompts", "2", "--num_generations", "4", "--micro_batch_size", "2"]


LN = {x: replace(reinforce.Args(), length_normalize=x) for x in (True, False)}  # the loss's args


def run(cmd, **kw):
    out = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def run_in_process(argv, monkeypatch):
    """reinforce.main with the test reward of tests/run_with_test_reward.py, in this process (no
    import cost)."""
    import run_with_test_reward  # tests/ is on sys.path under pytest

    monkeypatch.setattr(envlib, "make_env", run_with_test_reward.make_env)
    reinforce.main(parse_args(reinforce.Args, argv))


def params(path):
    return load_file(str(Path(path) / "model.safetensors"))


def metrics(path):
    return [json.loads(x) for x in (Path(path) / "metrics.jsonl").read_text().splitlines()]


# ---- baselines and returns -------------------------------------------------------------------------------
def test_rloo_baseline_on_a_hand_worked_group():
    returns = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0])  # two prompts, k = 4
    b = reinforce.compute_baselines(returns, 4, "rloo")
    # group 1 sums to 2: b_i = (2 - r_i) / 3; group 2 sums to 1: b_i = (1 - r_i) / 3
    assert b.tolist() == pytest.approx([1 / 3, 2 / 3, 2 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3, 0.0])
    assert (returns - b).tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, -1 / 3, -1 / 3,
                                                    -1 / 3, 1.0])
    # a group whose samples all agree gets advantage 0 whatever the reward
    assert (torch.ones(4) - reinforce.compute_baselines(torch.ones(4), 4, "rloo")).abs().max() == 0
    assert reinforce.compute_baselines(returns, 4, "mean").tolist() == pytest.approx([3 / 8] * 8)
    assert reinforce.compute_baselines(returns, 4, "none").tolist() == [0.0] * 8


def test_kl_regularised_return_on_a_hand_worked_example():
    # one response of 2 tokens (a third column is padding), reward 1, kl_coeff 0.1
    old = torch.tensor([[-1.0, -2.0, -5.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.1]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # k1 per token: 0.5 and -1.0 (padding ignored) -> sum -0.5, mean -0.25
    kl_sum = reinforce.sequence_logprobs(old - ref, mask, length_normalize=False)
    kl_mean = reinforce.sequence_logprobs(old - ref, mask, length_normalize=True)
    assert kl_sum.item() == pytest.approx(-0.5) and kl_mean.item() == pytest.approx(-0.25)
    rewards = torch.tensor([1.0])
    G = reinforce.kl_regularised_returns(rewards, kl_mean, beta=0.1)
    assert G.item() == pytest.approx(1 - 0.1 * -0.25)  # 1.025
    G = reinforce.kl_regularised_returns(rewards, kl_sum, beta=0.1)
    assert G.item() == pytest.approx(1.05)


# ---- the loss -----------------------------------------------------------------------------------------------
def test_loss_is_minus_advantage_times_sequence_logprob():
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -7.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    # length-normalised: log pi = [-1.5, -0.5] -> -(1 * -1.5 + -2 * -0.5) / 2 = 0.25
    loss, stats = reinforce.policy_loss(logprobs, logprobs.detach(), adv, mask, 2.0, LN[True])
    assert loss.item() == pytest.approx(0.25) and stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    loss.backward()
    # d/d logprob = -A / (|o| * N): -1 / 4 on both tokens of row 0, +2 / 2 on row 1's token, 0 on
    # padding
    assert logprobs.grad.flatten().tolist() == pytest.approx([-0.25, -0.25, 1.0, 0.0])
    # plain sum: log pi = [-3, -0.5] -> -(-3 + 1) / 2 = 1
    loss, _ = reinforce.policy_loss(logprobs, logprobs.detach(), adv, mask, 2.0, LN[False])
    assert loss.item() == pytest.approx(1.0)


def test_a_constant_baseline_is_free_with_sums_but_favours_short_responses_when_length_normalised():
    # A policy with one logit theta over two responses: o1 is one token (prob p = sigmoid(theta)),
    # o2 is two tokens (1 - p, then a sure token). The exact expected gradient of -c * log pi(o)
    # over the policy's own samples is 0 for any constant c (that is why a baseline is allowed).
    # With length normalisation it is
    # -c * (p(1-p) - p(1-p)/2) = -c p(1-p)/2: at p = 1/2, c = 1, -1/8, so descent raises theta, the
    # short response. Subtracting b from every return therefore also pushes toward longer responses
    # by b/8 here.
    theta = torch.zeros((), requires_grad=True)
    p = torch.sigmoid(theta)
    logprobs = torch.stack([torch.stack([p.log(), torch.zeros(())]),
                            torch.stack([(1 - p).log(), torch.zeros(())])])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    # c = 1, and E over o: each response weighted by its probability
    weights = torch.stack([p, 1 - p]).detach()
    for length_normalize, expected in [(False, 0.0), (True, -1 / 8)]:
        theta.grad = None
        loss, _ = reinforce.policy_loss(logprobs, logprobs.detach(), weights, mask, 1.0,
                                        LN[length_normalize])
        loss.backward(retain_graph=True)
        assert theta.grad.item() == pytest.approx(expected, abs=1e-7)


def test_micro_batches_1x8_and_8x1_give_the_same_gradient():
    from common.models.loading import load_policy

    policy = load_policy("tiny-random")
    torch.manual_seed(3)
    ids = torch.randint(3, 1000, (8, 12))
    attn = torch.ones_like(ids)
    R = 6
    mask = torch.ones(8, R)
    for i in range(8):
        mask[i, 1 + i % 5:] = 0  # uneven lengths
    attn[:, -R:] = mask.long()
    adv = torch.linspace(-1, 1, 8)
    grads, losses = [], []
    for mb in (8, 1):
        policy.zero_grad()
        total = 0.0
        for i in range(0, 8, mb):
            sl = slice(i, i + mb)
            lp, _ = token_logprobs(policy, ids[sl], attn[sl], R)
            loss, _ = reinforce.policy_loss(lp, lp.detach(), adv[sl], mask[sl], 8.0, LN[True])
            loss.backward()
            total += loss.item()
        losses.append(total)
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters()]))
    # advantages of both signs: the loss is near 0
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
    assert ((grads[0] - grads[1]).norm() / grads[0].norm()).item() < 1e-5


# ---- argument checks ----------------------------------------------------------------------------------------
def test_bad_arguments_fail_before_any_model_loads():
    with pytest.raises(ValueError, match="rloo needs --num_generations >= 2"):
        check_options(replace(reinforce.Args(), num_generations=1, micro_batch_size=4), reinforce.check_args, world_size=1)
    check_options(replace(reinforce.Args(), num_generations=1, micro_batch_size=4,
                                 baseline="none"), reinforce.check_args, 1)
    with pytest.raises(ValueError, match="--beta is 0"):
        check_options(replace(reinforce.Args(), beta=0.0, ref_model_sync_steps=2), reinforce.check_args, world_size=1)
    with pytest.raises(ValueError, match="the reference is the frozen base"):
        check_options(replace(reinforce.Args(), lora_r=8, ref_model_sync_steps=2), reinforce.check_args, world_size=1)
    with pytest.raises(ValueError, match="divisible by the number of processes"):
        check_options(replace(reinforce.Args(), num_prompts=3), reinforce.check_args, world_size=2)
    with pytest.raises(PathError, match="no such folder"):
        check_options(replace(reinforce.Args(), model_name_or_path="./no/such/model"), reinforce.check_args, world_size=1)


def test_help_documents_every_field_and_the_seeds_few_shot_name():
    out = make_parser(reinforce.Args).format_help()  # what `python reinforce.py --help` prints
    for f in fields(reinforce.Args):
        assert f"--{f.name}" in out, f.name
        assert field_docs(reinforce.Args).get(f.name), f"{f.name} has no docstring"
    # LLM_RL's name
    assert parse_args(reinforce.Args, ["--n_few_shot_examples", "3"]).num_few_shot == 3


# ---- end to end -----------------------------------------------------------------------------------------------
KEYS = ("reward/mean", "reward/std", "accuracy", "response_len/mean", "truncated_frac", "entropy",
        "approx_kl",
        "kl_ref", "pg_loss", "return/mean", "grad_norm", "lr", "tokens_per_s", "time/rollout_s",
        "time/update_s")


def test_two_updates_write_two_metric_lines_and_a_loadable_checkpoint(tmp_path):
    run([sys.executable, "reinforce.py", *TINY, "--max_steps", "2", "--output_dir", str(tmp_path)])
    lines = metrics(tmp_path)
    assert [x["step"] for x in lines] == [1, 2]
    for key in KEYS:
        assert key in lines[0], key
    # sampler and trainer agree in fp32 eager: only the kernels' rounding differs
    for line in lines:
        assert 0 <= line["mismatch/abs"] < 1e-4 and abs(line["mismatch/kl"]) < 1e-6
    assert [json.loads(x)["step"] for x in (tmp_path / "eval.jsonl").read_text().splitlines()] == [0, 2]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint-2")
    assert model.config.num_hidden_layers == 2


@pytest.mark.slow  # the second tier: torchrun
def test_torchrun_two_processes_match_one_process(tmp_path, monkeypatch):
    # Same global batch, the mean baseline (a global mean) and the KL term, lr large enough that the
    # update is visible: the parameters after the updates must agree to fp32 tolerance.
    steps = "1"
    common = [*TINY, "--max_steps", steps, "--learning_rate", "1e-3", "--temperature", "1.0",
              "--baseline", "mean", "--beta", "0.1", "--no_eval_on_start"]
    run_in_process([*common, "--output_dir", str(tmp_path / "one")], monkeypatch)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
         "29521",
         "tests/run_with_test_reward.py", "reinforce", *common, "--output_dir",
         str(tmp_path / "two")], env=env)
    one, two = params(tmp_path / f"one/checkpoint-{steps}"), params(tmp_path / f"two/checkpoint-{steps}")
    from common.models.loading import tiny_random_model

    start = tiny_random_model().state_dict()
    # the update did something
    assert max((one[k] - start[k]).abs().max().item() for k in one) > 1e-4
    # Adam's first steps move every weight by about lr (1e-3) whatever the size of its gradient, so
    # a wrong average, normaliser or baseline shows as ~1e-3; fp32 rounding, which differs between 1
    # and 2 processes and between CPUs, shows as up to ~3e-5 on the few weights whose gradient is
    # almost 0 (as in test_appo.py).
    assert max((one[k] - two[k]).abs().max().item() for k in one) < 1e-4
    m1, m2 = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert [m["reward/mean"] for m in m1] == pytest.approx([m["reward/mean"] for m in m2])


def test_resume_continues_exactly_with_a_refreshed_reference(tmp_path, monkeypatch):
    # The reference is refreshed after update 2; the run stops after update 3 and resumes for update
    # 4, whose KL is to the policy after update 2: the checkpoint must carry that reference. A large
    # kl_coeff makes any difference show.
    common = [*TINY, "--learning_rate", "1e-3", "--beta", "1.0", "--ref_model_sync_steps", "2",
              "--no_eval_on_start"]
    run_in_process([*common, "--max_steps", "4", "--output_dir", str(tmp_path / "straight")],
                   monkeypatch)
    run_in_process([*common, "--max_steps", "3", "--output_dir", str(tmp_path / "split")],
                   monkeypatch)
    run_in_process([*common, "--max_steps", "4", "--output_dir", str(tmp_path / "split"),
                    "--resume"], monkeypatch)
    a, b = params(tmp_path / "straight/checkpoint-4"), params(tmp_path / "split/checkpoint-4")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6
    straight, split = metrics(tmp_path / "straight"), metrics(tmp_path / "split")
    assert [x["step"] for x in split] == [1, 2, 3, 4]
    # right after a refresh the sampler is the reference (KL 0); one update later it is not
    assert abs(straight[2]["kl_ref"]) < 1e-5 and abs(straight[3]["kl_ref"]) > 1e-4
    assert straight[3]["kl_ref"] == pytest.approx(split[3]["kl_ref"])


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_in_the_return_and_in_the_loss_by_hand(estimator):
    # one action of 2 tokens: log pi = (-1, -2), log pi_ref = (-1.5, -1); length-normalised KL = mean
    from common.rl.numerics import kl_estimate

    logp, ref, mask = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), torch.ones(1, 2)
    kl = {"k1": [0.5, -1.0], "k2": [0.125, 0.5], "k3": [math.exp(-0.5) - 0.5, math.e - 2]}[estimator]
    action_kl = reinforce.sequence_logprobs(kl_estimate(logp, ref, estimator), mask, True)  # [1]
    G = reinforce.kl_regularised_returns(torch.tensor([1.0]), action_kl, 0.1)
    assert G.item() == pytest.approx(1.0 - 0.1 * sum(kl) / 2)  # in the return: r - beta KL
    args = replace(reinforce.Args(), beta=0.1, kl_estimator=estimator, kl_penalty="loss")
    loss, stats = reinforce.policy_loss(logp, logp, torch.zeros(1), mask, 1.0, args, ref)
    assert loss.item() == pytest.approx(0.1 * sum(kl) / 2)  # in the loss: beta KL of the action


# ---- the update loop's wiring ------------------------------------------------------------------------------
def _spy(monkeypatch, name, record):
    """Wrap reinforce.<name> so that record(result, *args) sees each call's arguments and result."""
    real = getattr(reinforce, name)

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        record(out, *args, **kwargs)
        return out
    monkeypatch.setattr(reinforce, name, spy)


def test_the_kl_enters_the_return_times_beta(tmp_path, monkeypatch):
    # --kl_penalty reward, beta 0.5: update 2 samples from a policy that update 1 moved, so the KL is
    # not 0. The logged return/mean is mean(score - beta * KL), the KL the sampler's k1 to the
    # reference, a token mean per response (--length_normalize), by hand.
    episodes, refs = [], []
    _spy(monkeypatch, "rollout", lambda ep, *a, **kw: episodes.append(ep))
    _spy(monkeypatch, "batched_token_logprobs", lambda lp, *a, **kw: refs.append(lp))
    run_in_process([*TINY, "--max_steps", "2", "--learning_rate", "1e-2", "--temperature", "1.0",
                    "--beta", "0.5", "--num_eval_problems", "0", "--output_dir", str(tmp_path)],
                   monkeypatch)
    ep, ref = episodes[1], refs[1]
    mask = ep.gen.response_mask.float()
    kl = ((ep.gen.logprobs - ref) * mask).sum(1) / mask.sum(1)  # [N]
    assert kl.abs().max() > 1e-3
    expected = (ep.scores - 0.5 * kl).mean()
    assert metrics(tmp_path)[1]["return/mean"] == pytest.approx(expected.item(), rel=1e-4)


# ---- against TRL's own code -------------------------------------------------------------------
@pytest.mark.slow  # the second tier: TRL's code
def test_rloo_loss_and_gradient_equal_trls_rloo_trainer_on_the_same_batch(tmp_path):
    # reinforce.py --baseline rloo as TRL's RLOOTrainer runs it (the bench's pair): the k1 KL
    # summed over each response and taken from its reward (beta 0.05), the leave-one-out baseline,
    # summed log-probs (--no_length_normalize), advantages unnormalised. TRL's loss is the clipped
    # sequence ratio, which is 1 on the policy's own samples: its gradient is REINFORCE's. The
    # sampler's log-probs are the policy's own at the temperature, as TRL recomputes them.
    pytest.importorskip("trl")
    from trl import RLOOConfig, RLOOTrainer

    from common.models.logprobs import batched_token_logprobs
    from common.models.loading import load_policy
    from common.rl.numerics import kl_estimate
    from trl_steps import a_batch, moved_policy, trl_training_step

    batch, T = a_batch(), 0.7
    args = replace(reinforce.Args(), baseline="rloo", beta=0.05, kl_estimator="k1",
                   kl_penalty="reward", length_normalize=False, temperature=T,
                   num_generations=batch.group_size)
    policy = moved_policy()
    gen = batch.gen()
    mask = gen.response_mask
    input_ids, attention_mask = gen.sequences()
    with torch.no_grad():
        sampled, _ = token_logprobs(policy, input_ids, attention_mask, mask.shape[1], T)
    gen = batch.gen(logprobs=sampled)
    ref_logprobs = batched_token_logprobs(load_policy("tiny-random"), gen, T, 8)
    kl = reinforce.sequence_logprobs(kl_estimate(gen.logprobs, ref_logprobs, "k1"), mask.float(),
                                     False)  # [N] summed over each response
    returns = reinforce.kl_regularised_returns(batch.scores, kl, args.beta)
    advantages = returns - reinforce.compute_baselines(returns, batch.group_size, "rloo")
    norm = reinforce.loss_normaliser(mask, args, world_size=1)
    logprobs, _ = token_logprobs(policy, input_ids, attention_mask, mask.shape[1], T)
    loss, _ = reinforce.policy_loss(logprobs, gen.logprobs, advantages, mask, norm, args)
    loss.backward()
    trl_loss, trl_model, trl_advantages = trl_training_step(
        RLOOTrainer, RLOOConfig, tmp_path, batch, beta=0.05, temperature=T,
        normalize_advantages=False)
    # the same advantages (the KL from both sides' log-probs, fp32 rounding); REINFORCE's loss is
    # -A log pi, TRL's -A rho with rho = 1: equal gradients, not values
    torch.testing.assert_close(trl_advantages, advantages, atol=1e-6, rtol=0)
    assert advantages.abs().sum() > 0 and kl.abs().min() > 0
    assert trl_loss.item() == pytest.approx(-advantages.mean().item(), abs=1e-7)
    for (name, ours), theirs in zip(policy.named_parameters(), trl_model.parameters()):
        assert ((ours.grad - theirs.grad).norm() / theirs.grad.norm()).item() < 2e-6, name
