"""reinforce_stepwise.py: discounted returns per line, the calculator and stepwise episodes with a
scripted policy against hand-computed values; end-to-end runs on the tiny model (torchrun with 2
CPU processes, which is also the smoke run, and an update through the calculator's tokens). The
algorithm it shares with reinforce.py: tests/test_reinforce.py."""

import json
import os
import re
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import reinforce_stepwise
from common.env import math_env as envlib
from common.env.math_env import make_env
from common.env.tasks import TASKS, load_few_shot
from common.models.loading import load_tokenizer
from common.env.stepwise import calculator
from common.models.stepwise import play_episodes, sample_line
from common.run.args import field_docs, make_parser, parse_args
from common.run.checks import check_options
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "8", "--num_eval_problems", "4",
        "--num_prompts", "2", "--num_generations", "4", "--micro_batch_size", "2"]
STEPWISE = ["--sym_calc", "--max_episode_steps", "3", "--num_few_shot", "1"]
LN = {x: replace(reinforce_stepwise.Args(), length_normalize=x) for x in (True, False)}


def run(cmd, **kw):
    out = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def run_in_process(argv, monkeypatch):
    """reinforce_stepwise.main with the test reward of tests/run_with_test_reward.py, here."""
    import run_with_test_reward  # tests/ is on sys.path under pytest

    monkeypatch.setattr(envlib, "make_env", run_with_test_reward.make_env)
    reinforce_stepwise.main(parse_args(reinforce_stepwise.Args, argv))


def params(path):
    return load_file(str(Path(path) / "model.safetensors"))


def metrics(path):
    return [json.loads(x) for x in (Path(path) / "metrics.jsonl").read_text().splitlines()]


# ---- returns --------------------------------------------------------------------------------------------
def test_discounted_per_step_return_in_stepwise_mode():
    # episode 0: three lines, reward 1 on the last; episode 1: two lines (the third column is no
    # step)
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.5, 9.0]])
    steps = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    G = reinforce_stepwise.stepwise_returns(rewards, kl, steps, gamma=0.9, beta=0.5)
    # r - 0.5 KL: [-0.05, -0.1, 0.85] -> G2 = 0.85, G1 = -0.1 + 0.9 * 0.85 = 0.665, G0 = -0.05 + 0.9
    # * 0.665 [-0.25, 0.75] -> G1 = 0.75, G0 = -0.25 + 0.9 * 0.75 = 0.425; no step, no return (and
    # no KL of 9 leaking in)
    assert G.tolist()[0] == pytest.approx([0.5485, 0.665, 0.85])
    assert G.tolist()[1] == pytest.approx([0.425, 0.75, 0.0])


# ---- the calculator and stepwise episodes ----------------------------------------------------------------
def test_calculator_values():
    assert calculator("48/2") == "24"
    assert calculator("7/2") == "3.5"
    assert calculator("1/3") == "0.33"  # 2 decimals, as the seed rounds
    assert calculator("2*(3+4)=15") == "14"  # <<expr=...>>: the model's own value is ignored
    assert calculator(" 12 + 30 ") == "42"
    assert calculator("5-8") == "-3"
    for bad in ("2**10", "x+1", "1/0", "", "print(1)"):
        assert calculator(bad) is None, bad


def test_calculator_refuses_code_without_side_effect(tmp_path):
    target = tmp_path / "pwned"
    assert calculator(f"__import__('os').system('touch {target}')") is None
    assert not target.exists()


@pytest.mark.parametrize("task", ["arithmetic", "gsm8k"])
def test_few_shot_calculator_spans_are_followed_by_the_calculators_value(task):
    # the worked examples are what the model imitates: each <<expr>> must be followed by exactly the
    # text the calculator writes for it, and no more digits
    spans = 0
    for ex in load_few_shot(TASKS[task], 8):
        for m in re.finditer(r"<<([^<>\n]*)>>", ex["solution"]):
            value = calculator(m.group(1))
            after = ex["solution"][m.end():]
            assert value is not None and after.startswith(value) and not after[len(value):][:1].isdigit(), m.group(0)
            spans += 1
    assert spans >= 12


def _scripted(tokenizer, script):
    """A stand-in for the policy's sampler: plays script[(episode, step, call)], log-prob -1 per
    token."""
    def sample(prompts, max_new_tokens, keys):
        out = []
        for key in keys:
            ids = tokenizer(script[key], add_special_tokens=False)["input_ids"][:max_new_tokens]
            out.append((ids, [-1.0] * len(ids)))
        return out
    return sample


def test_stepwise_episode_with_calculator_masks_its_tokens(tmp_path):
    tok = load_tokenizer("tiny-random")
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"question": "What is 12 + 30?", "answer": "42"}) + "\n")
    env = make_env("arithmetic", path=data, stepwise=True, max_steps=3)
    target = tmp_path / "pwned"
    script = {
        (0, 0, 0): "12 + 30 = <<12+30>>", (0, 0, 1): " so 42 apples.\n",   # calculator writes "42"
        (0, 1, 0): "The answer is 42.\n",
        (1, 0, 0): "I guess 41.\n",
        (1, 1, 0): f"<<__import__('os').system('touch {target}')>>", (1, 1, 1): " hm.\n",  # refused
        (1, 2, 0): "The answer is 41.\n",
    }
    ro = play_episodes(_scripted(tok, script), tok, env, [0], 2, 128, True, torch.device("cpu"),
                       {tok.eos_token_id})
    assert not target.exists()
    assert ro.texts == ["12 + 30 = <<12+30>>42 so 42 apples.\nThe answer is 42.",
                        f"I guess 41.\n<<__import__('os').system('touch {target}')>> hm.\nThe "
                        "answer is 41."]
    assert ro.rewards.tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    assert ro.step_mask.tolist() == [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    assert ro.correct.tolist() == [1.0, 0.0] and ro.truncated.tolist() == [False, False]
    assert ro.calc_fired == 0.5 and ro.calc_refused == 0.5  # per episode
    gen = ro.gen
    assert gen.prompt_ids.shape[0] == 5  # 2 + 3 lines, episode by episode
    # row 0 is episode 0's first line: exactly the calculator's "42" is out of the loss (and has no
    # log-prob)
    calc = (gen.response_mask[0] == 1) & (ro.loss_mask[0] == 0)
    assert tok.decode(gen.response_ids[0][calc]) == "42"
    assert gen.logprobs[0][calc].tolist() == [0.0, 0.0]
    n_before = len(tok("12 + 30 = <<12+30>>", add_special_tokens=False)["input_ids"])
    assert calc.nonzero().flatten().tolist() == [n_before, n_before + 1]
    # the refused span writes nothing: every token of episode 1's second line (row 3) is the
    # policy's
    assert ro.loss_mask[3].sum() == gen.response_mask[3].sum()
    # row 1 (episode 0's second line) was sampled after the state that holds the calculator's value
    assert tok.decode(gen.prompt_ids[1][gen.prompt_mask[1].bool()]).endswith("<<12+30>>42 so 42 "
                                                                             "apples.\n")
    # returns: episode 0 is rewarded on its second line, so G = [gamma, 1]
    G = reinforce_stepwise.stepwise_returns(ro.rewards, torch.zeros(2, 3), ro.step_mask, gamma=0.9,
                                         beta=0.1)
    assert G.tolist()[0] == pytest.approx([0.9, 1.0, 0.0])
    # and the loss gives the calculator's tokens no gradient
    logprobs = torch.randn(gen.response_ids.shape, requires_grad=True)
    adv = torch.ones(5)
    loss, _ = reinforce_stepwise.policy_loss(logprobs, logprobs.detach(), adv, ro.loss_mask.float(), 5.0,
                                    LN[True])
    loss.backward()
    assert logprobs.grad[0][calc].abs().sum() == 0 and logprobs.grad[0][~calc & gen.response_mask[0].bool()].ne(0).all()


def test_a_line_stops_after_four_calculations():
    tok = load_tokenizer("tiny-random")
    script = {(0, 0, c): "<<1+1>>" for c in range(5)}
    (action,) = sample_line(_scripted(tok, script), tok, [[1, 2]], [(0, 0)], 64, True,
                            {tok.eos_token_id})
    assert tok.decode(action.ids) == "<<1+1>>2" * 4 + "<<1+1>>" and action.fired == 4


# ---- argument checks ----------------------------------------------------------------------------------------
def test_help_documents_every_field_and_the_seeds_names():
    out = make_parser(reinforce_stepwise.Args).format_help()
    for f in fields(reinforce_stepwise.Args):
        assert f"--{f.name}" in out, f.name
        assert field_docs(reinforce_stepwise.Args).get(f.name), f"{f.name} has no docstring"
    args = parse_args(reinforce_stepwise.Args, ["--n_few_shot_examples", "3",
                                                "--max_trajectory_steps", "5"])
    assert (args.num_few_shot, args.max_episode_steps) == (3, 5)  # LLM_RL's names


def test_bad_arguments_fail_before_any_model_loads():
    with pytest.raises(ValueError, match="rloo needs --num_generations >= 2"):
        check_options(replace(reinforce_stepwise.Args(), num_generations=1, micro_batch_size=4),
                      reinforce_stepwise.check_args, world_size=1)
    with pytest.raises(ValueError, match="--beta is 0"):
        check_options(replace(reinforce_stepwise.Args(), beta=0.0, ref_model_sync_steps=2),
                      reinforce_stepwise.check_args, world_size=1)


# ---- end to end -----------------------------------------------------------------------------------------------
KEYS = ("reward/mean", "reward/std", "accuracy", "response_len/mean", "truncated_frac", "entropy",
        "approx_kl", "kl_ref", "pg_loss", "return/mean", "grad_norm", "lr", "tokens_per_s",
        "time/rollout_s", "time/update_s", "episode_steps/mean", "calc/fired", "calc/refused")


@pytest.mark.slow  # the second tier: torchrun
def test_torchrun_two_processes_match_one_process(tmp_path, monkeypatch):
    # Same global batch, the mean baseline (a global mean) and the KL term, lr large enough that the
    # update is visible: the parameters after 2 updates with the calculator on must agree to fp32
    # tolerance. This is also the file's smoke run.
    common = [*TINY, "--max_steps", "2", "--learning_rate", "1e-3", "--temperature", "1.0",
              "--baseline", "mean", "--beta", "0.1", "--no_eval_on_start", *STEPWISE]
    run_in_process([*common, "--output_dir", str(tmp_path / "one")], monkeypatch)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
         "29522", "tests/run_with_test_reward.py", "reinforce_stepwise", *common, "--output_dir",
         str(tmp_path / "two")], env=env)
    one, two = params(tmp_path / "one/checkpoint-2"), params(tmp_path / "two/checkpoint-2")
    from common.models.loading import tiny_random_model

    start = tiny_random_model().state_dict()
    assert max((one[k] - start[k]).abs().max().item() for k in one) > 1e-4  # the update did something
    # Adam's first steps move every weight by about lr (1e-3), so a wrong average, normaliser or
    # baseline shows as ~1e-3; fp32 rounding as up to ~3e-5 (stepwise states differ a lot in
    # length, so padding differs more between the layouts than in reinforce.py's test).
    assert max((one[k] - two[k]).abs().max().item() for k in one) < 1e-4
    m1, m2 = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert [m["reward/mean"] for m in m1] == pytest.approx([m["reward/mean"] for m in m2])
    assert [x["step"] for x in m1] == [1, 2]
    for key in KEYS:
        assert key in m1[0], key
    assert 1 <= m1[0]["episode_steps/mean"] <= 3
    assert m1[0]["episode_steps/mean"] == pytest.approx(m2[0]["episode_steps/mean"])
    assert [json.loads(x)["step"] for x in (tmp_path / "one/eval.jsonl").read_text().splitlines()] == [2]


# ---- the update loop's wiring ------------------------------------------------------------------------------
def _spy(monkeypatch, name, record):
    """Wrap reinforce_stepwise.<name> so that record(result, *args) sees each call's result."""
    real = getattr(reinforce_stepwise, name)

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        record(out, *args, **kwargs)
        return out
    monkeypatch.setattr(reinforce_stepwise, name, spy)


def test_an_update_gives_the_calculators_tokens_no_gradient(tmp_path, monkeypatch):
    # A scripted policy: episode 0 calls the calculator and answers right, episode 1 answers wrong,
    # so the update has a gradient. The calculator's value ("42") is context, not the policy's
    # choice: the loss's gradient on its log-probs is exactly 0, on the policy's own tokens not.
    tok = load_tokenizer("tiny-random")
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"question": "What is 12 + 30?", "answer": "42", "level": 1}) + "\n")
    script = {(0, 0, 0): "12 + 30 = <<12+30>>", (0, 0, 1): " so 42.\n",
              (0, 1, 0): "The answer is 42.\n", (1, 0, 0): "The answer is 41.\n"}
    monkeypatch.setattr(reinforce_stepwise, "policy_sampler", lambda *a, **kw: _scripted(tok, script))
    episodes, logprobs = [], []
    _spy(monkeypatch, "rollout", lambda ep, *a, **kw: episodes.append(ep))

    def keep(out, *a, **kw):  # the training forward's log-probs, to read their gradient
        if out[0].requires_grad:
            out[0].retain_grad()
            logprobs.append(out[0])
    _spy(monkeypatch, "token_logprobs", keep)
    reinforce_stepwise.main(parse_args(reinforce_stepwise.Args, [
        "--model_name_or_path", "tiny-random", "--dataset_path", str(data), "--sym_calc", "--max_episode_steps", "2", "--max_new_tokens", "32", "--num_prompts", "1",
        "--num_generations", "2", "--num_eval_problems", "0", "--max_steps", "1",
        "--output_dir", str(tmp_path / "run")]))
    ep = episodes[0]
    grad = torch.cat([lp.grad for lp in logprobs])  # [n, R], the actions in the order of gen
    calculator_tokens = ep.gen.response_mask.bool() & ~ep.loss_mask.bool()
    assert ep.correct.tolist() == [1.0, 0.0] and calculator_tokens.sum() >= 1
    assert (grad[calculator_tokens] == 0).all()
    assert (grad[ep.loss_mask.bool()] != 0).all()
