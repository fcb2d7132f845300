"""online_dpo.py: the DPO and IPO losses and their statistics against hand-computed values, pairs from
the verifier's scores, pairs of weight 0 that keep ranks in step, and end-to-end runs on the tiny model
(single process, torchrun with 2 CPU processes, resume)."""

import json
import math
import os
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import online_dpo
from common.run.args import field_docs
from common.run.checks import check_options
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "8", "--num_eval_problems", "4",
        "--num_prompts", "4", "--micro_batch_size", "2"]


def run(cmd, **kw):
    out = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def params(path):
    return load_file(str(Path(path) / "model.safetensors"))


def metrics(path):
    return [json.loads(x) for x in (Path(path) / "metrics.jsonl").read_text().splitlines()]


# ---- the loss ---------------------------------------------------------------------------------
def _two_pairs():
    """Rows chosen, rejected, chosen, rejected; a response's log pi is the sum over its mask:
    pair 0: log pi(w) = -2 (ref -3), log pi(l) = -4 (ref -3.5): h = 1 - (-0.5) = 1.5;
    pair 1: log pi(w) = -1 (ref -1), log pi(l) = -2 (ref -2.5): h = 0 - 0.5 = -0.5."""
    logprobs = torch.tensor([[-1.0, -1.0, 0.0], [-2.0, -2.0, -9.0], [-1.0, 0.0, 0.0],
                             [-0.5, -1.5, 0.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.5, 0.0], [-3.5, 0.0, 0.0], [-1.0, 0.0, 0.0], [-2.5, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0], [1, 1, 0]])  # -9: padding, not counted
    return logprobs, ref, mask


@pytest.mark.parametrize("preference_loss,expected", [
    ("sigmoid", (math.log(1 + math.exp(-0.15)) + math.log(1 + math.exp(0.05))) / 2),
    ("ipo", ((1.5 - 5) ** 2 + (-0.5 - 5) ** 2) / 2),  # (h - 1 / (2 beta))^2, beta 0.1
])
def test_the_loss_of_two_pairs_by_hand(preference_loss, expected):
    logprobs, ref, mask = _two_pairs()
    args = replace(online_dpo.Args(), beta=0.1, preference_loss=preference_loss)
    loss, stats = online_dpo.dpo_loss(logprobs, ref, mask, torch.ones(2), 2.0, args)
    assert loss.item() == pytest.approx(expected)
    # implicit rewards beta log(pi / pi_ref): chosen 0.1 and 0, rejected -0.05 and 0.05
    assert stats["rewards/chosen"] == pytest.approx(0.05)
    assert stats["rewards/rejected"] == pytest.approx(0.0)
    assert stats["rewards/margins"] == pytest.approx(0.05)
    assert stats["rewards/accuracies"] == 0.5  # pair 0's chosen response has the higher reward
    assert stats["logps/chosen"] == pytest.approx(-1.5) and stats["logps/rejected"] == -3.0
    if preference_loss == "sigmoid":  # d/d log pi(w token) = -beta sigmoid(-beta h) / 2 pairs
        loss.backward()
        torch.testing.assert_close(logprobs.grad[0], torch.full((3,), -0.1 / 2 * torch.sigmoid(
            torch.tensor(-0.15)).item()) * mask[0])


def test_pairs_of_weight_0_change_neither_the_loss_nor_the_statistics():
    logprobs, ref, mask = _two_pairs()
    args = replace(online_dpo.Args(), beta=0.1)
    loss, stats = online_dpo.dpo_loss(logprobs, ref, mask, torch.ones(2), 2.0, args)
    padded = [torch.cat([x, x[:2]]) for x in (logprobs, ref, mask)]  # pair 0 again, weight 0
    loss2, stats2 = online_dpo.dpo_loss(*padded, torch.tensor([1.0, 1.0, 0.0]), 2.0, args)
    assert loss2.item() == pytest.approx(loss.item()) and stats2 == pytest.approx(stats)
    # a micro-batch of weight-0 pairs only: no statistics, a loss of 0
    loss3, stats3 = online_dpo.dpo_loss(*[x[:2] for x in padded], torch.zeros(1), 2.0, args)
    assert loss3.item() == 0.0 and stats3 == {}


def test_sigmoid_loss_is_torch_log_sigmoid_of_beta_times_the_margin():
    h = torch.tensor([-3.0, 0.0, 2.0])
    logprobs = torch.stack([h, torch.zeros(3)], 1).reshape(6, 1)  # chosen h, rejected 0
    args = replace(online_dpo.Args(), beta=0.5)
    loss, _ = online_dpo.dpo_loss(logprobs, torch.zeros(6, 1), torch.ones(6, 1), torch.ones(3),
                                  3.0, args)
    assert loss.item() == pytest.approx(-F.logsigmoid(0.5 * h).mean().item())


# ---- pairs ------------------------------------------------------------------------------------
def test_pairs_come_from_responses_whose_scores_differ():
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0])  # 4 prompts x 2 responses
    chosen, rejected = online_dpo.preference_pairs(scores, 2)
    assert chosen.tolist() == [0, 5] and rejected.tolist() == [1, 4]  # ties give no pair
    chosen, rejected = online_dpo.preference_pairs(scores, 2, ties="first")  # TRL's rule
    assert chosen.tolist() == [0, 2, 5, 6] and rejected.tolist() == [1, 3, 4, 7]
    # 4 responses: the best against the worst, the first of equals
    chosen, rejected = online_dpo.preference_pairs(torch.tensor([0.5, 1.0, 1.0, 0.0]), 4)
    assert chosen.tolist() == [1] and rejected.tolist() == [3]


def test_a_rank_with_fewer_pairs_adds_pairs_of_weight_0(monkeypatch):
    # this rank has 1 pair, another 3: it runs 3, the 2 added made of rows 0 and 1, weight 0
    monkeypatch.setattr(online_dpo, "all_gather_objects", lambda n: [n, 3])
    rows, weights = online_dpo.rows_in_step(torch.tensor([5]), torch.tensor([4]))
    assert rows.tolist() == [5, 4, 0, 1, 0, 1] and weights.tolist() == [1.0, 0.0, 0.0]
    monkeypatch.setattr(online_dpo, "all_gather_objects", lambda n: [n])
    rows, weights = online_dpo.rows_in_step(torch.tensor([0, 5]), torch.tensor([1, 4]))
    assert rows.tolist() == [0, 1, 5, 4] and weights.tolist() == [1.0, 1.0]


# ---- arguments --------------------------------------------------------------------------------
def test_bad_arguments_fail_before_any_model_loads():
    with pytest.raises(ValueError, match="num_generations must be >= 2"):
        check_options(replace(online_dpo.Args(), num_generations=1), online_dpo.check_args, world_size=1)
    with pytest.raises(ValueError, match="beta must be > 0"):
        check_options(replace(online_dpo.Args(), beta=0.0), online_dpo.check_args, world_size=1)
    with pytest.raises(ValueError, match="divisible by the number of processes"):
        check_options(replace(online_dpo.Args(), num_prompts=3), online_dpo.check_args, world_size=2)
    check_options(online_dpo.Args(), online_dpo.check_args, world_size=1)


def test_help_documents_every_field():
    out = run([sys.executable, "online_dpo.py", "--help"]).stdout
    docs = field_docs(online_dpo.Args)
    for f in fields(online_dpo.Args):
        assert f"--{f.name}" in out, f.name
        assert docs.get(f.name), f"{f.name} has no docstring"


# ---- end to end -------------------------------------------------------------------------------
def test_two_updates_write_two_metric_lines_and_a_loadable_checkpoint(tmp_path):
    common = ["tests/run_with_test_reward.py", "online_dpo", *TINY, "--max_steps", "2",
              "--output_dir", str(tmp_path)]
    run([sys.executable, *common])
    lines = metrics(tmp_path)
    assert [x["step"] for x in lines] == [1, 2]
    for key in ("reward/mean", "reward/std", "accuracy", "pairs/frac", "rewards/chosen",
                "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
                "logps/rejected", "entropy", "kl_ref", "grad_norm", "lr", "tokens_per_s"):
        assert key in lines[0], key
    # update 1: the policy is the reference, so every implicit reward is 0
    assert lines[0]["rewards/margins"] == 0.0 and abs(lines[0]["kl_ref"]) < 1e-6
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint-2")
    assert model.config.num_hidden_layers == 2


@pytest.mark.slow  # the second tier: torchrun
def test_torchrun_two_processes_match_one_process(tmp_path):
    # Ties give no pair, so the two ranks hold different numbers of pairs (the one with fewer adds
    # pairs of weight 0); the loss is a mean over every rank's pairs: the weights after two updates
    # and the gradient's norm agree with one process's.
    common = ["tests/run_with_test_reward.py", "online_dpo", *TINY, "--max_steps", "2",
              "--learning_rate", "1e-3", "--temperature", "1.0", "--no_eval_on_start"]
    run([sys.executable, *common, "--output_dir", str(tmp_path / "one")])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
         "29533", *common, "--output_dir", str(tmp_path / "two")], env=env)
    one, two = params(tmp_path / "one/checkpoint-2"), params(tmp_path / "two/checkpoint-2")
    from common.models.loading import tiny_random_model

    start = tiny_random_model().state_dict()
    assert max((one[k] - start[k]).abs().max().item() for k in one) > 1e-4
    assert max((one[k] - two[k]).abs().max().item() for k in one) < 1e-4
    m1, m2 = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert [m["pairs/frac"] for m in m1] == pytest.approx([m["pairs/frac"] for m in m2])
    assert [m["grad_norm"] for m in m2] == pytest.approx([m["grad_norm"] for m in m1], rel=1e-3)


def test_an_update_without_a_pair_logs_its_pair_statistics_as_null_and_takes_no_step(tmp_path):
    # every response scores 0.5: no prompt gives a pair, so nothing is measured and nothing moves
    run([sys.executable, "tests/run_with_test_reward.py", "online_dpo", *TINY, "--max_steps", "1",
         "--no_eval_on_start", "--output_dir", str(tmp_path)], env={**os.environ, "TEST_REWARD": "tie"})
    (line,) = metrics(tmp_path)
    assert line["pairs/frac"] == 0.0 and line["grad_norm"] == 0.0
    assert {k: line[k] for k in online_dpo.PAIR_STATS} == dict.fromkeys(online_dpo.PAIR_STATS)
    from common.models.loading import tiny_random_model

    start, end = tiny_random_model().state_dict(), params(tmp_path / "checkpoint-1")
    assert all(torch.equal(start[k], end[k]) for k in end)


def test_the_pair_statistics_are_the_keys_the_update_measures():
    # PAIR_STATS (what an update without a pair logs as null) names what dpo_loss and the loop log
    args = online_dpo.Args()
    logprobs = torch.tensor([[-1.0, -2.0], [-3.0, -1.0]])
    _, stats = online_dpo.dpo_loss(logprobs, logprobs - 0.1, torch.ones(2, 2), torch.ones(1), 1.0,
                                   args)
    assert set(online_dpo.PAIR_STATS) == {*stats, "entropy", "kl_ref"}


@pytest.mark.slow  # the second tier: torchrun
def test_a_rank_without_a_pair_of_its_own_neither_hangs_nor_dilutes_the_statistics(tmp_path):
    # rank 1's prompts all tie: it runs only pairs of weight 0 and measures nothing, so the logged
    # statistics are rank 0's pairs alone, those of one process on rank 0's two prompts (a key
    # missing on one rank used to hang the mean over ranks)
    common = ["tests/run_with_test_reward.py", "online_dpo", *TINY, "--max_steps", "1",
              "--temperature", "1.0", "--no_eval_on_start"]
    run([sys.executable, *common, "--num_prompts", "2", "--output_dir", str(tmp_path / "one")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TEST_REWARD": "tie_on_rank:1"}
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
         "29534", *common, "--output_dir", str(tmp_path / "two")], env=env)
    (one,), (two,) = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert one["pairs/frac"] > 0 and two["pairs/frac"] == pytest.approx(one["pairs/frac"] / 2)
    for k in online_dpo.PAIR_STATS:
        assert two[k] == pytest.approx(one[k], rel=1e-4, abs=1e-6), k


@pytest.mark.slow  # the second tier: two runs and a resume
def test_resume_continues_exactly(tmp_path):
    common = ["tests/run_with_test_reward.py", "online_dpo", *TINY, "--learning_rate", "1e-3",
              "--no_eval_on_start", "--num_eval_problems", "0"]
    run([sys.executable, *common, "--max_steps", "3", "--output_dir", str(tmp_path / "straight")])
    run([sys.executable, *common, "--max_steps", "2", "--output_dir", str(tmp_path / "split")])
    run([sys.executable, *common, "--max_steps", "3", "--output_dir", str(tmp_path / "split"),
         "--resume"])
    a, b = params(tmp_path / "straight/checkpoint-3"), params(tmp_path / "split/checkpoint-3")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [x["step"] for x in metrics(tmp_path / "split")] == [1, 2, 3]


# ---- the update loop's wiring ------------------------------------------------------------------
def test_the_reference_is_the_starting_policy_once_the_policy_moved(tmp_path, monkeypatch):
    # Update 2 pairs the samples of a policy that update 1 moved (learning rate 1e-2): the loss
    # still measures them against the starting model, so the reference log-probs it gets are the
    # starting model's own on those pairs, and the logged kl_ref, the k1 mean of log pi - log
    # pi_ref over the pairs' tokens, is not 0.
    import run_with_test_reward  # tests/ is on sys.path under pytest: a reward that gives pairs

    from common.env import math_env as envlib
    from common.models.logprobs import batched_token_logprobs
    from common.models.loading import load_policy
    from common.rl.numerics import masked_mean

    monkeypatch.setattr(envlib, "make_env", run_with_test_reward.make_env)
    refs, losses = [], []

    def spy(name, record):  # online_dpo.name, with each call's arguments and result recorded
        real = getattr(online_dpo, name)

        def call(*a, **kw):
            out = real(*a, **kw)
            record(a, out)
            return out
        monkeypatch.setattr(online_dpo, name, call)
    spy("batched_token_logprobs", lambda a, out: refs.append((a[1], out)))  # (pairs, log-probs)
    spy("dpo_loss", lambda a, out: losses.append(a[:3]))  # (logprobs, ref_logprobs, loss_mask)
    online_dpo.main(replace(online_dpo.Args(), model_name_or_path="tiny-random", max_new_tokens=6,
                            num_eval_problems=0, num_prompts=4, micro_batch_size=8, max_steps=2,
                            learning_rate=1e-2, temperature=1.0, output_dir=str(tmp_path)))
    pairs, ref = refs[1]
    logprobs, _, mask = losses[1]
    start = batched_token_logprobs(load_policy("tiny-random"), pairs, 1.0, 8)
    torch.testing.assert_close(ref, start, atol=1e-5, rtol=1e-5)
    kl = masked_mean(logprobs.detach() - start, mask.float()).item()
    assert abs(kl) > 1e-3  # the policy moved: a reference taken from it would give 0
    assert metrics(tmp_path)[1]["kl_ref"] == pytest.approx(kl, rel=1e-4)


# ---- against TRL's own code -------------------------------------------------------------------
@pytest.mark.slow  # the second tier: TRL's code
@pytest.mark.parametrize("preference_loss", ["sigmoid", "ipo"])
def test_the_loss_and_gradient_equal_trls_training_step_on_the_same_batch(tmp_path, preference_loss):
    # TRL 1.16's OnlineDPOTrainer.training_step computes its loss inline, between its own sampling
    # and its reward calls. Here its sampler is replaced by the batch below and its reward function
    # returns the verifier's scores below, so it trains on exactly what online_dpo.py's update gets.
    # Three prompts x 2 responses of uneven lengths; scores (1, 0), (0, 1) and a tie (1, 1), which
    # TRL's rule (--ties first) gives to the first response. Prompts of one length: TRL's forward
    # takes positions from the sequence, online_dpo.py from the attention mask, which agree only
    # without left padding.
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    from common.models.logprobs import batched_token_logprobs, token_logprobs
    from common.models.loading import load_policy, load_tokenizer
    from common.models.sampler import Generation
    from trl_steps import moved_policy  # the same moved weights as the GRPO and RLOO tests

    tok = load_tokenizer("tiny-random")
    pad = tok.pad_token_id
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(10, 400, (3, 6), generator=g)  # [3, P]
    # row j answers prompt j % 3 (TRL's order: every prompt's first response, then the seconds)
    completion_ids = torch.randint(10, 400, (6, 5), generator=g)
    completion_mask = torch.ones(6, 5, dtype=torch.long)
    for j, n in enumerate((5, 3, 4, 2, 5, 1)):
        completion_mask[j, n:] = 0
        completion_ids[j, n:] = pad
    scores_trl = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]  # first responses of prompts 0-2, then the seconds
    beta = 0.1

    # mathrl: consecutive rows share a prompt (row 2k + i: prompt k, response i)
    order = torch.tensor([0, 3, 1, 4, 2, 5])  # TRL's row of each mathrl row
    gen = Generation(prompt_ids=prompt_ids.repeat_interleave(2, 0),
                     prompt_mask=torch.ones(6, 6, dtype=torch.long),
                     response_ids=completion_ids[order], response_mask=completion_mask[order],
                     logprobs=torch.zeros(6, 5), finished=torch.ones(6, dtype=torch.bool),
                     truncated=torch.zeros(6, dtype=torch.bool))
    scores = torch.tensor(scores_trl)[order]
    args = replace(online_dpo.Args(), beta=beta, preference_loss=preference_loss, ties="first")


    policy, ref = moved_policy(), load_policy("tiny-random")
    chosen, rejected = online_dpo.preference_pairs(scores, 2, args.ties)
    assert chosen.tolist() == [0, 3, 4] and rejected.tolist() == [1, 2, 5]
    rows, weights = online_dpo.rows_in_step(chosen, rejected)
    pairs = gen.rows(rows)
    input_ids, attention_mask = pairs.sequences()
    loss_mask = pairs.response_mask
    ref_logprobs = batched_token_logprobs(ref, pairs, 1.0, 8)
    norm = online_dpo.loss_normaliser(loss_mask, args, world_size=1)
    logprobs, _ = token_logprobs(policy, input_ids, attention_mask, loss_mask.shape[1])
    loss, stats = online_dpo.dpo_loss(logprobs, ref_logprobs, loss_mask, weights, norm, args)
    loss.backward()

    # TRL, on the same weights
    trl_policy = moved_policy()
    config = OnlineDPOConfig(output_dir=str(tmp_path), beta=beta, loss_type=preference_loss,
                             per_device_train_batch_size=3, max_new_tokens=5, max_length=512,
                             gradient_checkpointing=False, report_to="none", use_cpu=True,
                             bf16=False)  # TRL's default on a CPU that has bf16: autocast
    trainer = OnlineDPOTrainer(model=trl_policy, ref_model=load_policy("tiny-random"),
                               reward_funcs=[lambda completions, **kw: scores_trl], args=config,
                               train_dataset=Dataset.from_dict({"prompt": ["a"] * 3}),
                               processing_class=tok)
    trainer._generate = lambda model, prompts, images=None: (  # each prompt's 2 responses
        prompt_ids.repeat(2, 1), torch.ones(6, 6, dtype=torch.long), completion_ids,
        completion_mask, None)
    trl_loss = trainer.training_step(trainer.model, {"prompt": ["a", "b", "c"]})

    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-6, abs=1e-6)  # fp32 rounding
    for (name, ours), theirs in zip(policy.named_parameters(), trainer.model.parameters()):
        # fp32 rounding: at most 5.5e-7 of the gradient's norm, in any tensor
        assert ((ours.grad - theirs.grad).norm() / theirs.grad.norm()).item() < 1e-6, name
    # the implicit rewards TRL logs are ours too
    assert stats["rewards/margins"] == pytest.approx(trainer.stats["rewards/margins"][-1], abs=1e-6)
    assert stats["rewards/accuracies"] == trainer.stats["rewards/accuracies"][-1]
