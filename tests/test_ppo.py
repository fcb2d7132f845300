"""ppo.py: rewards, GAE, whitening and both losses against hand-computed values; the ratio on the
first minibatch; micro-batching; and end-to-end runs on the tiny model (single process, torchrun
with 2 CPU processes, resume, the shared critic)."""

import json
import math
import os
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ppo
from common.env import math_env as envlib
from common.run.args import field_docs, parse_args
from common.rl.numerics import explained_variance, masked_whiten
from common.errors import PathError
from common.run.checks import check_options
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


def critic_params(path):
    return torch.load(Path(path) / "trainer_state.pt", map_location="cpu",
                      weights_only=False)["extra"]["critic"]


def max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _test_reward_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_with_test_reward",
                                                  ROOT / "tests/run_with_test_reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def no_whitening(**kw):
    return replace(ppo.Args(), whiten_advantages=False, **kw)


# ---- rewards and GAE ------------------------------------------------------------------------------------------
def test_gae_terminal_reward_gamma_lambda_one():
    # Score 1 on the last of 5 tokens; row 2 is a 3-token response padded to 5 (its padding values
    # are junk). With gamma = lambda = 1 the advantage is (sum of later rewards) - V_t = 1 - V_t and
    # every return is 1.
    args = no_whitening(gamma=1.0, gae_lambda=1.0)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    rewards = ppo.token_rewards(torch.tensor([1.0, 1.0]), torch.tensor([False, False]), mask, args)
    torch.testing.assert_close(rewards, torch.tensor([[0.0, 0, 0, 0, 1], [0, 0, 1, 0, 0]]))
    values = torch.tensor([[0.2, 0.4, 0.5, 0.6, 0.8], [0.5, 0.5, 0.5, 9.0, 9.0]])
    adv, ret = ppo.compute_advantages(rewards, values, mask, args)
    torch.testing.assert_close(adv,
                               torch.tensor([[0.8, 0.6, 0.5, 0.4, 0.2], [0.5, 0.5, 0.5, 0, 0]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1, 1, 1, 1], [1, 1, 1, 0, 0]]))


def test_value_targets_are_the_returns_before_the_advantages_are_whitened():
    # The same rows as above with whitening on (the default): the advantages come out whitened
    # (mean 0 over the real tokens), the critic's targets stay the returns in reward units (all 1).
    args = replace(ppo.Args(), gamma=1.0, gae_lambda=1.0)
    assert args.whiten_advantages
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    rewards = torch.tensor([[0.0, 0, 0, 0, 1], [0, 0, 1, 0, 0]])
    values = torch.tensor([[0.2, 0.4, 0.5, 0.6, 0.8], [0.5, 0.5, 0.5, 9.0, 9.0]])
    adv, ret = ppo.compute_advantages(rewards, values, mask, args)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1, 1, 1, 1], [1, 1, 1, 0, 0]]))
    # unwhitened 0.8 0.6 0.5 0.4 0.2 0.5 0.5 0.5: mean 0.5, squares summing to 0.2, unbiased
    # variance 0.2 / 7
    expected = (torch.tensor([0.8, 0.6, 0.5, 0.4, 0.2, 0.5, 0.5, 0.5]) - 0.5) / (0.2 / 7 + 1e-8) ** 0.5
    torch.testing.assert_close(adv[mask.bool()], expected)


def test_gae_terminal_reward_gamma_09_lambda_08():
    # gamma * lambda = 0.72, V = 0.2 0.4 0.5 0.6 0.8, reward 1 on the last token, V after it = 0:
    #   d4 = 1 - 0.8 = 0.2                A4 = 0.2
    #   d3 = 0.9*0.8 - 0.6 = 0.12         A3 = 0.12 + 0.72*0.2       = 0.264
    #   d2 = 0.9*0.6 - 0.5 = 0.04         A2 = 0.04 + 0.72*0.264     = 0.23008
    #   d1 = 0.9*0.5 - 0.4 = 0.05         A1 = 0.05 + 0.72*0.23008   = 0.2156576
    #   d0 = 0.9*0.4 - 0.2 = 0.16         A0 = 0.16 + 0.72*0.2156576 = 0.315273472
    args = no_whitening(gamma=0.9, gae_lambda=0.8)
    mask = torch.ones(1, 5)
    rewards = ppo.token_rewards(torch.tensor([1.0]), torch.tensor([False]), mask, args)
    values = torch.tensor([[0.2, 0.4, 0.5, 0.6, 0.8]])
    adv, ret = ppo.compute_advantages(rewards, values, mask, args)
    expected = torch.tensor([[0.315273472, 0.2156576, 0.23008, 0.264, 0.2]])
    torch.testing.assert_close(adv, expected)
    # R = A + V: 0.515273472 0.6156576 0.73008 0.864 1.0
    torch.testing.assert_close(ret, expected + values)


def test_kl_on_every_token_score_and_missing_eos_penalty_on_the_last():
    # Row 1 stopped (EOS is its 3rd token, then padding); row 2 hit the length limit (4 tokens, no
    # EOS).
    args = replace(ppo.Args(), beta=0.1, missing_eos_penalty=0.25)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    # log pi_old - log pi_ref; 7.0 is padding
    kl = torch.tensor([[0.2, -0.1, 0.3, 7.0], [0.1, 0.1, 0.1, 0.1]])
    rewards = ppo.token_rewards(torch.tensor([1.0, 0.5]), torch.tensor([False, True]), mask, args,
                                kl)
    torch.testing.assert_close(rewards, torch.tensor([[-0.02, 0.01, -0.03 + 1.0, 0.0],
                                                      [-0.01, -0.01, -0.01, -0.01 + 0.5 - 0.25]]))
    # with gamma = lambda = 1 and V = 0, the return of the first token is score - kl_coef * sum_t
    # kl_t
    _, ret = ppo.compute_advantages(rewards, torch.zeros(2, 4), mask,
                                    replace(args, whiten_advantages=False))
    torch.testing.assert_close(ret[:, 0], torch.tensor([1.0 - 0.1 * 0.4, 0.5 - 0.25 - 0.1 * 0.4]))


def test_whitening_ignores_masked_entries():
    # Real entries 1 2 3 | 4: mean 2.5, unbiased variance (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3.
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, -50.0, 100.0, 100.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 0, 0, 0]])
    s = (5 / 3) ** 0.5
    expected = torch.tensor([[-1.5 / s, -0.5 / s, 0.5 / s, 0], [1.5 / s, 0, 0, 0]])
    torch.testing.assert_close(masked_whiten(x, mask), expected)
    # shift_mean=False (reward whitening) scales but keeps the mean: a positive score stays
    # positive.
    torch.testing.assert_close(masked_whiten(x, mask, shift_mean=False), (expected + 2.5) * mask)
    # advantage whitening inside compute_advantages: padding stays 0, real tokens have mean 0
    adv, _ = ppo.compute_advantages(x, torch.zeros_like(x), mask, replace(ppo.Args(), gamma=0.0))
    torch.testing.assert_close(adv, expected)


def test_explained_variance():
    mask = torch.tensor([[1.0, 1, 1, 0]])
    returns = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 7.0), returns, mask) == pytest.approx(0.0)
    # errors 1 0 -1 -> variance 1 (unbiased), variance of returns 1 -> 0
    assert explained_variance(torch.tensor([[0.0, 2, 4, 0]]), returns, mask) == pytest.approx(0.0)
    assert explained_variance(torch.tensor([[1.5, 2, 2.5, 0]]), returns,
                              mask) == pytest.approx(0.75)


# ---- losses ---------------------------------------------------------------------------------------------------
def test_clipped_value_loss_by_hand():
    # old V = 0, returns 1, cliprange_value 0.2; token 4 is padding.
    #   V = 0.5: moved toward R past the clip -> V_clip = 0.2: max(0.25, 0.64) = 0.64 (clipped, no
    # gradient)   V = 0.1: inside the clip -> 0.81   V = -0.5: moved away from R -> max(2.25, 1.44)
    # = 2.25 (unclipped, gradient V - R = -1.5)
    args = replace(ppo.Args(), cliprange_value=0.2)
    values = torch.tensor([[0.5, 0.1, -0.5, 100.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1, 1, 0]])
    loss, stats = ppo.value_loss(values, torch.zeros(1, 4), torch.ones(1, 4), mask, 3.0, args)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.81 + 2.25) / 3)
    assert stats["v_loss"] == pytest.approx(0.5 * (0.64 + 0.81 + 2.25) / 3)
    assert stats["vf_clipfrac"] == pytest.approx(1 / 3)
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -0.9 / 3, -1.5 / 3, 0.0]]))


def test_policy_loss_clips_only_in_the_direction_of_the_advantage():
    args = replace(ppo.Args(), epsilon=0.2)
    new = torch.log(torch.tensor([[1.5, 1.5]])).requires_grad_()  # ratio 1.5 on both tokens
    loss, stats = ppo.policy_loss(new, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]),
                                  torch.ones(1, 2), 2.0, args)
    # A > 0: min(1.5, 1.2) -> -1.2 (clipped, no gradient); A < 0: max(1.5, 1.2) -> +1.5 (unclipped)
    assert loss.item() == pytest.approx((-1.2 + 1.5) / 2)
    assert stats["clipfrac"] == pytest.approx(0.5)
    loss.backward()
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, 1.5 / 2]]))


@pytest.mark.parametrize("aggregation,expected", [
    # lengths 1 and 3, per-token advantages [2 | 1 1 4]; at ratio 1 the per-token loss is -A
    ("dapo", -(2 + 1 + 1 + 4) / 4),            # mean over the 4 tokens of the global minibatch
    ("bnpo", -(2 + 1 + 1 + 4) / 4),            # ... of this rank's (one rank here)
    ("grpo", -(2 / 1 + (1 + 1 + 4) / 3) / 2),  # mean per sequence, then over the 2 sequences
    ("dr_grpo", -(2 + 1 + 1 + 4) / (2 * 3)),   # over 2 sequences x max_new_tokens 3
])
def test_loss_aggregation_with_uneven_lengths(aggregation, expected):
    args = replace(ppo.Args(), loss_type=aggregation, max_new_tokens=3)
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1]])
    adv = torch.tensor([[2.0, 9, 9], [1, 1, 4]])
    lp = torch.full((2, 3), -1.0)
    norm = ppo.loss_normaliser(mask, args, world_size=1)
    loss, _ = ppo.policy_loss(lp, lp, adv, mask, norm, args)
    assert loss.item() == pytest.approx(expected)


@pytest.mark.parametrize("aggregation", ["dapo", "grpo"])
def test_micro_batches_1x8_and_8x1_give_the_same_gradient(aggregation):
    from common.models.loading import load_critic, load_policy

    policy, critic = load_policy("tiny-random"), load_critic("tiny-random")
    torch.manual_seed(3)
    # a non-zero head, so the body gets gradients
    torch.nn.init.normal_(critic.head.net[-1].weight, std=0.1)
    ids = torch.randint(3, 1000, (8, 12))
    attn = torch.ones_like(ids)
    R = 6
    mask = torch.ones(8, R)
    for i in range(8):
        mask[i, 1 + i % 5:] = 0  # uneven lengths
    attn[:, -R:] = mask.long()
    adv, ret = torch.randn(8, R), torch.randn(8, R)
    args = replace(ppo.Args(), loss_type=aggregation)
    norm = ppo.loss_normaliser(mask, args, world_size=1)
    grads, losses = [], []
    for mb in (8, 1):
        policy.zero_grad()
        critic.zero_grad()
        total = 0.0
        for i in range(0, 8, mb):
            sl = slice(i, i + mb)
            lp, _, v = ppo.forward(policy, critic, ids[sl], attn[sl], R,
                                   replace(args, temperature=1.0))
            # old log-probs and values perturbed so that both clipping paths are exercised
            pg, _ = ppo.policy_loss(lp, lp.detach() - 0.3, adv[sl], mask[sl], norm, args)
            vf, _ = ppo.value_loss(v, v.detach() + 0.3, ret[sl], mask[sl], norm, args)
            loss = pg + 0.1 * vf
            loss.backward()
            total += loss.item()
        losses.append(total)
        grads.append(torch.cat([p.grad.flatten() for m in (policy,
                                                           critic) for p in m.parameters()]))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert ((grads[0] - grads[1]).norm() / grads[0].norm()).item() < 1e-5


def test_ratio_is_one_on_the_first_minibatch_of_the_first_epoch(tmp_path, monkeypatch):
    # pi_old's log-probs are recomputed by the learner before the update (not taken from the
    # sampler), so the first minibatch sees exactly the policy that produced them; after one
    # optimizer step they differ.
    calls = []
    real = ppo.policy_loss

    def spy(logprobs, old_logprobs, *a, **kw):
        calls.append((logprobs - old_logprobs).abs().max().item())
        return real(logprobs, old_logprobs, *a, **kw)

    monkeypatch.setattr(ppo, "policy_loss", spy)
    # a varying reward: real updates
    monkeypatch.setattr(envlib, "make_env", _test_reward_module().make_env)
    argv = [*TINY, "--micro_batch_size", "4", "--num_mini_batches", "2", "--num_ppo_epochs", "2",
            "--max_steps", "1", "--learning_rate", "1e-3", "--temperature", "1.0", "--output_dir",
            str(tmp_path)]
    ppo.main(parse_args(ppo.Args, argv))
    # one call per minibatch (micro-batch = minibatch): (epoch 0, mb 0), (0, 1), (1, 0), (1, 1)
    assert len(calls) == 4
    assert calls[0] < 1e-5  # |log rho| = 0 up to float noise: rho = 1
    assert min(calls[1:]) > 1e-3  # every later minibatch follows an update: rho != 1


def test_each_optimizer_step_takes_its_own_minibatchs_gradient_alone(tmp_path, monkeypatch):
    # With a zero learning rate nothing moves, so the rollout's gradient over one minibatch equals the
    # mean of its gradients over two halves (the sequence mean: each half divides by its own rows):
    # which holds only if each optimizer step starts from zeroed gradients.
    from transformers import PreTrainedModel

    from common.run.run import Run

    grads = []
    real = Run.sync_gradients

    def spy(run, model):
        if isinstance(model, PreTrainedModel):  # the policy's, not the critic's
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        return real(run, model)

    monkeypatch.setattr(Run, "sync_gradients", spy)
    monkeypatch.setattr(envlib, "make_env", _test_reward_module().make_env)
    argv = [*TINY, "--micro_batch_size", "4", "--max_steps", "1", "--learning_rate", "0",
            "--critic_learning_rate", "0", "--loss_type", "grpo", "--max_grad_norm", "1e9",
            "--num_eval_problems", "0"]
    ppo.main(parse_args(ppo.Args, [*argv, "--num_mini_batches", "2", "--output_dir",
                                   str(tmp_path / "two")]))
    ppo.main(parse_args(ppo.Args, [*argv, "--num_mini_batches", "1", "--output_dir",
                                   str(tmp_path / "one")]))
    halves, whole = grads[:2], grads[2]
    assert len(grads) == 3 and (halves[0] - halves[1]).norm() > 1e-3 * whole.norm()
    torch.testing.assert_close((halves[0] + halves[1]) / 2, whole, atol=1e-6, rtol=1e-4)


def test_values_are_read_at_the_position_before_each_token():
    # CRUCIAL: V(s_t) of response token t is the critic's output at the position before it. A critic
    # that outputs each position's index must give T - R - 1 ... T - 2 for the R response tokens;
    # the shared head must read the policy's hidden states there.
    from common.models.logprobs import token_logprobs
    from common.models.loading import load_policy

    policy = load_policy("tiny-random")
    ids = torch.randint(3, 1000, (2, 9), generator=torch.Generator().manual_seed(0))
    attn, R = torch.ones_like(ids), 3

    class Positions(torch.nn.Module):
        def forward(self, input_ids, attention_mask, prompt_len):
            return torch.arange(input_ids.shape[1], dtype=torch.float).expand(len(input_ids), -1)

    args = replace(ppo.Args(), critic_type="separate", temperature=1.0)
    _, _, values = ppo.forward(policy, Positions(), ids, attn, R, args)
    torch.testing.assert_close(values, torch.tensor([[5.0, 6, 7], [5, 6, 7]]))
    head = lambda hidden: hidden.sum(-1)  # noqa: E731 (a value head that shows what it read)
    _, _, values = ppo.forward(policy, head, ids, attn, R, replace(args, critic_type="shared"))
    with torch.no_grad():
        hidden = token_logprobs(policy, ids, attn, R, return_hidden=True)[2]  # [2, 9, H]
    torch.testing.assert_close(values, hidden[:, 5:8].sum(-1))


# ---- argument checks ----------------------------------------------------------------------------------------
def test_bad_sizes_fail_before_any_model_loads():
    with pytest.raises(ValueError, match="divisible by the number of processes"):
        check_options(replace(ppo.Args(), num_prompts=3), ppo.check_args, world_size=2)
    with pytest.raises(ValueError, match="--num_mini_batches 3 must divide"):
        check_options(replace(ppo.Args(), num_mini_batches=3), ppo.check_args, world_size=1)
    # micro-batches of up to 5: fine
    check_options(replace(ppo.Args(), micro_batch_size=5), ppo.check_args, world_size=1)
    with pytest.raises(ValueError, match=r"--gae_lambda 1.5: must be in \[0, 1\]"):
        check_options(replace(ppo.Args(), gae_lambda=1.5), ppo.check_args, world_size=1)
    with pytest.raises(PathError, match="no such folder"):
        check_options(replace(ppo.Args(), model_name_or_path="./no/such/model"), ppo.check_args, world_size=1)


def test_help_documents_every_field():
    out = run([sys.executable, "ppo.py", "--help"]).stdout
    for f in fields(ppo.Args):
        assert f"--{f.name}" in out, f.name
        assert field_docs(ppo.Args).get(f.name), f"{f.name} has no docstring"


# ---- end to end -----------------------------------------------------------------------------------------------
def test_two_updates_write_two_metric_lines_and_a_loadable_checkpoint(tmp_path):
    run([sys.executable, "ppo.py", *TINY, "--max_steps", "2", "--output_dir", str(tmp_path)])
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    for key in ("reward/mean", "reward/std", "accuracy", "response_len/mean", "truncated_frac",
                "entropy",
                "approx_kl", "clipfrac", "grad_norm", "lr", "tokens_per_s", "time/rollout_s",
                "time/update_s",
                "v_loss", "explained_variance", "vf_clipfrac", "critic_grad_norm"):
        assert key in lines[0], key
    # sampler and trainer agree in fp32 eager: only the kernels' rounding differs
    for line in lines:
        assert 0 <= line["mismatch/abs"] < 1e-4 and abs(line["mismatch/kl"]) < 1e-6
    assert [json.loads(x)["step"] for x in (tmp_path / "eval.jsonl").read_text().splitlines()] == [0, 2]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint-2")
    assert model.config.num_hidden_layers == 2
    # the separate critic is saved too
    assert "head.net.0.weight" in critic_params(tmp_path / "checkpoint-2")


def test_shared_critic_with_every_option_on(tmp_path):
    # A 1-hidden-layer value head on the policy's body, with the KL reward (loads a reference), the
    # non-stop penalty, reward whitening, the entropy bonus, per-sequence aggregation, gamma/lambda
    # < 1.
    run([sys.executable, "tests/run_with_test_reward.py", "ppo", *TINY, "--max_steps", "1",
         "--critic_type", "shared", "--critic_num_layers", "1", "--critic_hidden_size", "16",
         "--beta", "0.05",
         "--missing_eos_penalty", "0.5", "--whiten_rewards", "--entropy_coef", "0.01", "--loss_type",
         "grpo", "--gamma", "0.9", "--gae_lambda", "0.95", "--output_dir", str(tmp_path)])
    line = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    # pi_old is still pi_ref before the first update
    assert line["kl_ref"] == pytest.approx(0.0, abs=1e-5)
    assert line["v_loss"] > 0 and line["grad_norm"] > 0 and line["critic_grad_norm"] > 0
    head = critic_params(tmp_path / "checkpoint-1")
    assert set(head) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}
    assert head["net.2.weight"].abs().max() > 0  # the zero-initialised output layer learned


@pytest.mark.slow  # the second tier: torchrun
def test_torchrun_two_processes_match_one_process(tmp_path):
    # Same global batch (2 prompts x 4 samples), two epochs, the KL reward on: whitening, the
    # token-mean denominator and explained variance are global, so policy and critic after one
    # update must agree.
    common = ["tests/run_with_test_reward.py", "ppo", *TINY, "--max_steps", "1", "--learning_rate",
              "1e-3",
              "--critic_learning_rate", "1e-3", "--temperature", "1.0", "--num_mini_batches", "1",
              "--num_ppo_epochs", "2", "--beta", "0.05"]
    run([sys.executable, *common, "--output_dir", str(tmp_path / "one")])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
         "29523",
         *common, "--output_dir", str(tmp_path / "two")], env=env)
    one, two = params(tmp_path / "one/checkpoint-1"), params(tmp_path / "two/checkpoint-1")
    from common.models.loading import tiny_random_model

    start = tiny_random_model().state_dict()
    assert max_diff(one, {k: start[k] for k in one}) > 1e-4  # the update did something
    # Adam's first steps move every weight by about lr (1e-3) whatever the size of its gradient, so
    # a wrong average, normaliser or baseline shows as ~1e-3; fp32 rounding, which differs between 1
    # and 2 processes and between CPUs, shows as up to ~3e-5 on the few weights whose gradient is
    # almost 0 (as in test_appo.py).
    assert max_diff(one, two) < 1e-4
    c1, c2 = critic_params(tmp_path / "one/checkpoint-1"), critic_params(tmp_path / "two/checkpoint-1")
    assert c1["head.net.0.weight"].abs().max() > 1e-4  # the critic learned too
    assert max_diff(c1, c2) < 1e-6
    m1 = json.loads((tmp_path / "one/metrics.jsonl").read_text().splitlines()[0])
    m2 = json.loads((tmp_path / "two/metrics.jsonl").read_text().splitlines()[0])
    for key in ("reward/mean", "explained_variance"):
        assert m1[key] == pytest.approx(m2[key], abs=1e-5)


@pytest.mark.slow  # the second tier: two runs and a resume
def test_resume_continues_exactly(tmp_path):
    common = ["tests/run_with_test_reward.py", "ppo", *TINY, "--learning_rate", "1e-3",
              "--critic_learning_rate", "1e-3"]
    run([sys.executable, *common, "--max_steps", "2", "--output_dir", str(tmp_path / "straight")])
    run([sys.executable, *common, "--max_steps", "1", "--output_dir", str(tmp_path / "split")])
    run([sys.executable, *common, "--max_steps", "2", "--output_dir", str(tmp_path / "split"),
         "--resume"])
    a, b = tmp_path / "straight/checkpoint-2", tmp_path / "split/checkpoint-2"
    assert max_diff(params(a), params(b)) < 1e-6
    assert max_diff(critic_params(a), critic_params(b)) < 1e-6
    steps = [json.loads(x)["step"] for x in (tmp_path / "split/metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_in_the_loss_by_hand(estimator):
    # tokens: log pi = (-1, -2), log pi_ref = (-1.5, -1); zero advantage, so the loss is beta * KL alone
    from common.rl.numerics import kl_estimate

    logp, ref, mask = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), torch.ones(1, 2)
    kl = {"k1": [0.5, -1.0], "k2": [0.125, 0.5], "k3": [math.exp(-0.5) - 0.5, math.e - 2]}[estimator]
    torch.testing.assert_close(kl_estimate(logp, ref, estimator), torch.tensor([kl]))
    args = replace(ppo.Args(), beta=0.1, kl_estimator=estimator, kl_penalty="loss", loss_type="dapo")
    loss, stats = ppo.policy_loss(logp, logp, torch.zeros(1, 2), mask, 2.0, args, ref)
    assert loss.item() == pytest.approx(0.1 * sum(kl) / 2) and stats["kl_ref"] == pytest.approx(sum(kl) / 2)
    # in the reward instead: every token's reward is -beta KL_t, the score on the last
    rewards = ppo.token_rewards(torch.tensor([1.0]), torch.tensor([False]), mask, args,
                                kl_estimate(logp, ref, estimator))
    torch.testing.assert_close(rewards, torch.tensor([[-0.1 * kl[0], -0.1 * kl[1] + 1.0]]))


def test_target_kl_stops_the_remaining_minibatches(tmp_path):
    # 2 epochs x 2 minibatches at a learning rate that moves the policy far: the stop leaves a step out
    common = ["tests/run_with_test_reward.py", "ppo", *TINY, "--max_steps", "1", "--learning_rate", "5e-2",
              "--temperature", "1.0", "--num_ppo_epochs", "2", "--num_mini_batches", "2"]
    run([sys.executable, *common, "--output_dir", str(tmp_path / "free")])
    run([sys.executable, *common, "--target_kl", "1e-6", "--output_dir", str(tmp_path / "stopped")])
    free, stopped = params(tmp_path / "free/checkpoint-1"), params(tmp_path / "stopped/checkpoint-1")
    assert max_diff(free, stopped) > 1e-4  # fewer optimizer steps: other weights


# ------------------------------------------------------------------------------------------------
# Reference: TRL 1.12's PPOTrainer (trl/experimental/ppo/ppo_trainer.py; TRL 1.16 has no PPO), its
# rollout's steps 3-6 and its loss written out here from its equations, on the same tensors
# ------------------------------------------------------------------------------------------------
def trl_112_ppo(logprobs, ref_logprobs, values, scores, lengths, has_eos, new_logprobs, new_values,
                kl_coef, gamma, lam, cliprange, cliprange_value, vf_coef, missing_eos_penalty):
    """TRL 1.12's PPO on one minibatch of one micro-batch. logprobs: the sampler's (pi_old);
    values: V_old [N, R] of every column; lengths: real tokens per row. -> (loss, advantages,
    returns, pg_loss, vf_loss). TRL's names in the comments."""
    N, R = logprobs.shape
    col = torch.arange(R).expand(N, R)
    last = lengths - 1  # sequence_lengths: the last real token (EOS, or column R - 1)
    pad = col > last[:, None]  # padding_mask
    pad_p1 = col > (last + 1)[:, None]  # padding_mask_p1: one state more, past the last token
    invalid = 1.0  # INVALID_LOGPROB: on padding, so that the KL there is 0
    logprobs, ref_logprobs = logprobs.masked_fill(pad, invalid), ref_logprobs.masked_fill(pad, invalid)
    values = values.masked_fill(pad_p1, 0)
    scores = scores - missing_eos_penalty * (~has_eos).float()
    rewards = -kl_coef * (logprobs - ref_logprobs)  # k1
    # the score sits one column past the last real token (sequence_lengths_p1) when there is one
    end = torch.where(last + 1 < R, last + 1, last)
    rewards[torch.arange(N), end] += scores
    # GAE over every column: no end of episode but the zeros of the masked values
    adv, running = torch.zeros(N, R), torch.zeros(N)
    for t in reversed(range(R)):
        next_value = values[:, t + 1] if t < R - 1 else 0.0
        running = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * running
        adv[:, t] = running
    returns = adv + values

    def masked_mean(x, keep):
        return (x * keep).sum() / keep.sum()

    keep = (~pad).float()
    mean = masked_mean(adv, keep)
    var = masked_mean((adv - mean) ** 2, keep) * keep.sum() / (keep.sum() - 1)  # unbiased
    adv = ((adv - mean) * torch.rsqrt(var + 1e-8)).masked_fill(pad, 0)
    # the loss
    new_logprobs = new_logprobs.masked_fill(pad, invalid)
    vpred = new_values.masked_fill(pad_p1, 0)
    vpred_clipped = torch.clamp(vpred, values - cliprange_value, values + cliprange_value)
    vf_loss = 0.5 * masked_mean(torch.max((vpred - returns) ** 2, (vpred_clipped - returns) ** 2),
                                (~pad_p1).float())
    ratio = torch.exp(new_logprobs - logprobs)
    pg_loss = masked_mean(torch.max(-adv * ratio, -adv * ratio.clamp(1 - cliprange, 1 + cliprange)),
                          keep)
    return pg_loss + vf_coef * vf_loss, adv, returns, pg_loss, vf_loss


def _ppo_reference_batch(lengths):
    """moved tiny-random and a tiny-random critic on 6 rows of a 5-token prompt and R = 6: the new
    log-probs and values with their graph, pi_old's and V_old (the new ones moved by fixed noise, so
    that both clips act), the reference's log-probs, and scores."""
    from common.models.logprobs import token_logprobs
    from common.models.loading import load_critic, load_policy
    from trl_steps import moved_policy

    policy, ref_policy, critic = moved_policy(), load_policy("tiny-random"), load_critic("tiny-random")
    with torch.no_grad():  # a non-zero head, so the critic's body gets gradients
        critic.head.net[-1].weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(0)
    N, P, R = len(lengths), 5, 6
    lengths = torch.tensor(lengths)
    mask = (torch.arange(R)[None] < lengths[:, None]).long()
    ids = torch.cat([torch.randint(10, 400, (N, P), generator=g),
                     torch.randint(10, 400, (N, R), generator=g) * mask], 1)
    attn = torch.cat([torch.ones(N, P, dtype=torch.long), mask], 1)
    args = replace(ppo.Args(), temperature=0.7)
    logprobs, _, values = ppo.forward(policy, critic, ids, attn, R, args)
    with torch.no_grad():
        ref_logprobs = token_logprobs(ref_policy, ids, attn, R, args.temperature)[0]
    old_logprobs = logprobs.detach() + 0.3 * torch.randn(N, R, generator=g)
    old_values = values.detach() + 0.3 * torch.randn(N, R, generator=g)
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    return (policy, critic, mask, logprobs, values, old_logprobs, old_values, ref_logprobs, scores,
            lengths)


def _both_ppo_losses(lengths, gae_lambda):
    """ppo.py's loss and TRL 1.12's on one batch, each with its gradient."""
    from common.rl.numerics import kl_estimate

    (policy, critic, mask, logprobs, values, old_logprobs, old_values, ref_logprobs, scores,
     lengths) = _ppo_reference_batch(lengths)
    has_eos = lengths < mask.shape[1]  # a row shorter than R stopped with EOS
    args = replace(ppo.Args(), beta=0.05, kl_penalty="reward", kl_estimator="k1", gamma=1.0,
                   gae_lambda=gae_lambda, epsilon=0.2, cliprange_value=0.2, vf_coef=0.1,
                   missing_eos_penalty=1.0, loss_type="dapo")  # TRL's values, but lambda
    out = {}
    rewards = ppo.token_rewards(scores, ~has_eos, mask, args,
                                kl_estimate(old_logprobs, ref_logprobs, "k1"))
    adv, ret = ppo.compute_advantages(rewards, old_values, mask, args)
    norm = ppo.loss_normaliser(mask, args, world_size=1)
    pg, _ = ppo.policy_loss(logprobs, old_logprobs, adv, mask, norm, args)
    vf, _ = ppo.value_loss(values, old_values, ret, mask, norm, args)
    trl = trl_112_ppo(old_logprobs, ref_logprobs, old_values, scores, lengths, has_eos, logprobs,
                      values, kl_coef=0.05, gamma=1.0, lam=gae_lambda, cliprange=0.2,
                      cliprange_value=0.2, vf_coef=0.1, missing_eos_penalty=1.0)
    for name, (loss, a, r, p, v) in {"mathrl": (pg + 0.1 * vf, adv, ret, pg, vf), "trl": trl}.items():
        policy.zero_grad()
        critic.zero_grad()
        p.backward(retain_graph=True)
        pg_grad = torch.cat([q.grad.flatten() for q in policy.parameters()])
        critic.zero_grad()
        v.backward(retain_graph=True)
        vf_grad = torch.cat([q.grad.flatten() for q in critic.parameters()])
        out[name] = dict(loss=loss.item(), adv=a.detach(), ret=r.detach(), pg=p.item(), vf=v.item(),
                         pg_grad=pg_grad, vf_grad=vf_grad)
    return out, mask, values.detach(), old_values, scores, lengths


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_the_loss_and_gradient_equal_trl_112s_ppo_when_every_response_is_cut():
    # every row sampled all R tokens without EOS: TRL's extra state past the last token does not
    # exist, so at TRL's lambda 0.95 all of it is the same, the missing-EOS penalty included
    out, mask, *_ = _both_ppo_losses([6, 6, 6, 6, 6, 6], gae_lambda=0.95)
    ours, trl = out["mathrl"], out["trl"]
    keep = mask.bool()
    torch.testing.assert_close(ours["adv"][keep], trl["adv"][keep], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours["ret"][keep], trl["ret"][keep], rtol=1e-5, atol=1e-5)
    assert ours["loss"] == pytest.approx(trl["loss"], rel=1e-5)
    assert _rel(ours["pg_grad"], trl["pg_grad"]) < 1e-5 and _rel(ours["vf_grad"], trl["vf_grad"]) < 1e-5


def test_against_trl_112s_ppo_responses_that_stop_differ_only_by_trls_state_past_the_eos():
    # TRL puts the score one column past a stopped row's EOS and trains the value of that state
    # too (its return is the score); ppo.py ends the episode at the EOS. At gamma = lambda = 1 the
    # advantages, returns and the policy loss with its gradient are the same; the value loss is
    # TRL's over n tokens plus one state per stopped row, which this test adds by hand.
    lengths = [6, 3, 4, 1, 6, 2]  # rows 1, 2, 3 and 5 stop with EOS before column R - 1
    out, mask, values, old_values, scores, lengths = _both_ppo_losses(lengths, gae_lambda=1.0)
    ours, trl = out["mathrl"], out["trl"]
    keep = mask.bool()
    torch.testing.assert_close(ours["adv"][keep], trl["adv"][keep], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours["ret"][keep], trl["ret"][keep], rtol=1e-5, atol=1e-5)
    assert ours["pg"] == pytest.approx(trl["pg"], rel=1e-5)
    assert _rel(ours["pg_grad"], trl["pg_grad"]) < 1e-5
    stopped = [k for k in range(6) if lengths[k] < 6]
    extra = 0.0  # the states past the EOS: return = the score, V_old there clips the new value
    for k in stopped:
        L = lengths[k].item()
        v, v_old = values[k, L], old_values[k, L]
        clipped = v_old + (v - v_old).clamp(-0.2, 0.2)
        extra += 0.5 * max((v - scores[k]) ** 2, (clipped - scores[k]) ** 2).item()
    n = mask.sum().item()
    assert trl["vf"] == pytest.approx((ours["vf"] * n + extra) / (n + len(stopped)), rel=1e-5)
    assert abs(trl["vf"] - ours["vf"]) > 1e-3  # the difference is real on this batch
