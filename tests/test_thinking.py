"""Thinking chat models: --chat_template_kwargs in every prompt, the thinking budget (s1's budget
forcing) on the plain and the fast sampler, its tokens out of the loss, the think/ metrics, and
the tiny Qwen3-, R1-distill- and SmolLM3-style templates end to end (tests/thinking_models.py)."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import grpo
from common.env import Reasoning, make_env
from common.errors import UsageError
from common.models import ThinkingBudget, encode_prompts, generate, load_policy, load_tokenizer
from common.models.sampler import read_reasoning, render_prompt
from common.models.templates import read_template_kwargs
from sampling import fast_generate
from thinking_models import save_thinking_model

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{style: folder} of the three tiny thinking models."""
    root = tmp_path_factory.mktemp("thinking")
    return {style: str(save_thinking_model(style, root / style))
            for style in ("qwen3", "r1_distill", "smollm3")}


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny-random")


# ---- template options ----------------------------------------------------------------------------
def test_template_options_reach_every_prompt(models):
    env = make_env("arithmetic", split="test")
    on = load_tokenizer(models["qwen3"], template_kwargs='{"enable_thinking": true}')
    off = load_tokenizer(models["qwen3"], template_kwargs='{"enable_thinking": false}')
    assert render_prompt(on, env.prompt(0)).endswith("<|im_start|>assistant\n<think>\n")
    assert render_prompt(off, env.prompt(0)).endswith("assistant\n<think>\n\n</think>\n\n")
    # the ids the sampler is given, and the reasoning each env is told of
    assert encode_prompts(off, [env.prompt(0)])[0] != encode_prompts(on, [env.prompt(0)])[0]
    assert read_reasoning(on, env).opened and not read_reasoning(off, env).opened
    # SmolLM3's flags: /no_think in the system prompt closes the block in the prompt
    smol = load_tokenizer(models["smollm3"])
    asked = [{"role": "system", "content": "Be brief. /no_think"}, *env.prompt(0)[1:]]
    assert render_prompt(smol, asked).endswith("assistant\n<think>\n\n</think>\n")
    assert "Reasoning Mode: /think" in render_prompt(smol, env.prompt(0))
    r1 = load_tokenizer(models["r1_distill"])
    assert read_reasoning(r1, env) == Reasoning(opened=True)


@pytest.mark.parametrize("given,message", [
    ("enable_thinking", "not JSON"),
    ("[1, 2]", "a JSON list, not an object"),
    ('{"tokenize": true}', "tokenize is apply_chat_template's own argument"),
])
def test_a_malformed_template_option_is_one_line(given, message):
    with pytest.raises(UsageError, match=message):
        read_template_kwargs(given)


def test_a_template_option_is_checked_against_the_template(models, capsys):
    with pytest.raises(UsageError, match="--template plain builds prompts without one"):
        read_template_kwargs('{"enable_thinking": true}', template="plain")
    load_tokenizer(models["qwen3"], template_kwargs='{"enable_thinkin": false}')
    assert "never reads 'enable_thinkin'; it has no effect" in capsys.readouterr().out
    tok = load_tokenizer("tiny-random")  # SmolLM2's template reads no such option either
    assert tok.chat_template_kwargs == {}


# ---- the thinking budget -------------------------------------------------------------------------
class Ids:
    """A tokenizer of the two tags alone: <think> is id 1, </think> ids 2 3."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": {"<think>": [1], "</think>": [2, 3]}[text]}


def test_the_budget_closes_a_block_after_its_tokens_and_only_then():
    # Row 0 opens the block at its 2nd token and thinks 3 tokens: the sampler writes </think> (2 3)
    # over the next two draws. Row 1 closes its block itself after 2: nothing is forced. Row 2
    # never opens one. Row 3 starts inside (a prompt that opens it) and is forced at once after 3.
    # Row 4 has written the close's first piece as its 3rd token: the sampler writes the rest.
    budget = ThinkingBudget(Ids(), Reasoning(budget=3), 5, "cpu")
    budget.inside[3] = True
    draws = [[5, 1, 7, 7, 7, 9, 9, 8],
             [1, 7, 2, 3, 9, 9, 9, 9],
             [7, 7, 7, 7, 7, 7, 7, 7],
             [6, 6, 6, 9, 9, 4, 4, 4],
             [1, 7, 7, 2, 9, 9, 9, 9]]
    tokens, logprobs, alive = [], [], torch.ones(5, dtype=torch.bool)
    for t in range(8):
        tokens.append(torch.tensor([row[t] for row in draws]))
        logprobs.append(torch.zeros(5))
        budget.step(tokens, logprobs, alive, torch.zeros(5, 10), torch.arange(5), 1.0)
    got = torch.stack(tokens, 1).tolist()
    assert got[0] == [5, 1, 7, 7, 7, 2, 3, 8]
    assert got[1] == draws[1] and got[2] == draws[2]
    assert got[3] == [6, 6, 6, 2, 3, 4, 4, 4]
    assert got[4] == [1, 7, 7, 2, 3, 9, 9, 9]
    assert budget.forced_mask(8).tolist() == [[0, 0, 0, 0, 0, 1, 1, 0], [0] * 8, [0] * 8,
                                              [0, 0, 0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 1, 0, 0, 0]]
    # every row ends outside a block
    assert not budget.inside.any()


def test_the_plain_and_the_fast_sampler_force_the_same_tokens(tiny, models):
    tok = load_tokenizer(models["r1_distill"])
    env = make_env("arithmetic", split="test")
    reasoning = read_reasoning(tok, env, budget=5)
    prompts = encode_prompts(tok, [env.prompt(i) for i in (0, 0, 1)])
    close = tok("</think>", add_special_tokens=False)["input_ids"]
    kw = dict(temperature=1.0, seeds=[1, 2, 3], reasoning=reasoning)
    plain = generate(tiny, tok, prompts, 16, **kw)
    fast = fast_generate(tiny, tok, prompts, 16, **kw)
    assert fast.response_ids.tolist() == plain.response_ids.tolist()
    assert fast.forced.tolist() == plain.forced.tolist()
    # a random model never closes the block itself: each row's close is written after 5 tokens
    assert plain.response_ids[:, 5:5 + len(close)].tolist() == [close] * 3
    assert plain.forced.tolist() == [[0] * 5 + [1] * len(close) + [0] * (16 - 5 - len(close))] * 3
    assert [t.count("</think>") for t in plain.texts(tok)] == [1, 1, 1]
    # the forced tokens' log-probs are the model's own, as a training forward reads them
    from common.models import token_logprobs
    ids, mask = plain.sequences()
    trained, _ = token_logprobs(tiny, ids, mask, 16, 1.0)
    torch.testing.assert_close(plain.logprobs, trained * plain.response_mask, atol=5e-5, rtol=0)


def test_the_forced_tokens_are_out_of_the_loss_and_the_run_logs_the_thinking(tmp_path, models,
                                                                              monkeypatch):
    seen = []
    loss = grpo.policy_loss

    def spy(logprobs, old, advantages, loss_mask, *rest, **kw):
        seen.append(loss_mask.clone())
        return loss(logprobs, old, advantages, loss_mask, *rest, **kw)
    monkeypatch.setattr(grpo, "policy_loss", spy)
    rollouts = []
    rollout = grpo.rollout
    monkeypatch.setattr(grpo, "rollout", lambda *a, **k: rollouts.append(rollout(*a, **k))
                        or rollouts[-1])
    args = replace(grpo.Args(), model_name_or_path=models["r1_distill"], max_steps=1,
                   num_prompts=2, num_generations=2, max_new_tokens=12, max_thinking_tokens=4,
                   num_eval_problems=0, output_dir=str(tmp_path))
    grpo.main(args)
    gen = rollouts[0].gen
    (loss_mask,) = seen
    close = len(load_tokenizer(models["r1_distill"])("</think>", add_special_tokens=False)
                ["input_ids"])
    assert gen.forced[:, 4:4 + close].all() and gen.forced.sum() == 4 * close
    assert loss_mask.tolist() == (gen.response_mask * (1 - gen.forced)).tolist()
    (line,) = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # every response thought 4 tokens, then the forced close; the rest of its 12 is its answer
    assert line["think/unclosed_frac"] == 0.0 and line["think/len_mean"] == 4 + close
    assert line["think/answer_len_mean"] == 12 - 4 - close


# ---- the three templates end to end --------------------------------------------------------------
@pytest.mark.slow  # the second tier: three runs of each file
@pytest.mark.parametrize("style,options", [
    ("qwen3", ["--chat_template_kwargs", '{"enable_thinking": true}', "--max_thinking_tokens",
               "16"]),
    ("r1_distill", ["--max_thinking_tokens", "8"]),
    ("smollm3", ["--chat_template_kwargs", '{"enable_thinking": false}']),
])
def test_each_template_trains_two_updates_and_evaluates(tmp_path, models, style, options):
    run = tmp_path / "run"
    common = ["--model_name_or_path", models[style], "--max_new_tokens", "32"]
    out = subprocess.run([sys.executable, "grpo.py", *common, *options, "--max_steps", "2",
                          "--num_prompts", "2", "--num_generations", "2",
                          "--num_eval_problems", "4", "--output_dir", str(run)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all("think/len_mean" in x for x in lines)
    if "--max_thinking_tokens" in options:  # every response's block closed by the sampler
        assert all(x["think/unclosed_frac"] == 0.0 for x in lines)
        samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
        assert all("</think>" in s["response"] for s in samples)
    kwargs = [o for o in options if o.startswith("{")]
    evaluated = subprocess.run([sys.executable, "eval.py", "--model_name_or_path",
                                str(run / "checkpoint-2"), "--num_problems", "4",
                                "--max_new_tokens", "16", "--output", str(tmp_path / "e.jsonl"),
                                *(["--chat_template_kwargs", *kwargs] if kwargs else [])],
                               cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]


# ---- bad input: one line, before the weights load ------------------------------------------------
def test_a_budget_not_below_the_response_budget_is_refused_before_any_model_loads(tmp_path):
    from common.run.checks import check_options
    args = replace(grpo.Args(), model_name_or_path="tiny-random", max_new_tokens=64,
                   max_thinking_tokens=64, output_dir=str(tmp_path / "run"))
    with pytest.raises(UsageError, match=r"--max_thinking_tokens 64 must be below "
                                         r"--max_new_tokens 64.*\(e\.g\. to 320\)"):
        check_options(args, grpo.check_args)
    check_options(replace(args, max_thinking_tokens=63), grpo.check_args)


@pytest.mark.parametrize("flags,says", [
    (["--chat_template_kwargs", "{enable_thinking: true}"], "error: --chat_template_kwargs "
     "'{enable_thinking: true}': not JSON (Expecting property name enclosed in double quotes, at "
     "character 1); pass a JSON object"),
    (["--max_thinking_tokens", "64"], "error: --max_thinking_tokens 64 must be below "
                                      "--max_new_tokens 64"),
])
def test_bad_thinking_options_are_one_line(flags, says):
    out = subprocess.run([sys.executable, "grpo.py", "--model_name_or_path", "tiny-random",
                          *flags], cwd=ROOT, capture_output=True, text=True, timeout=120)
    said = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode != 0 and len(said) == 1 and said[0].startswith(says), said


class Template:
    """A tokenizer's chat template alone: `source`, which may raise when rendered."""

    def __init__(self, source, fails=None):
        self.chat_template, self.fails = source, fails

    def apply_chat_template(self, messages, **kwargs):
        if self.fails:
            raise self.fails
        return "rendered"


def test_a_template_that_cannot_take_the_options_is_refused(capsys):
    from common.models.templates import check_template_kwargs
    wanted = {"enable_thinking": True}
    with pytest.raises(UsageError, match="m's tokenizer has no chat template to pass them to"):
        check_template_kwargs(Template(None), wanted, "m")
    with pytest.raises(UsageError, match=r"m's chat template fails with them \(TemplateError: "
                                         r"thinking must be a string\)"):
        from jinja2 import TemplateError
        check_template_kwargs(Template("{{ enable_thinking }}",
                                       TemplateError("thinking must be a string")), wanted, "m")
    assert check_template_kwargs(Template("{% if enable_thinking %}x{% endif %}"), wanted,
                                 "m") == wanted
    assert capsys.readouterr().out == ""  # a template that reads the option: no warning
    assert check_template_kwargs(Template(None), {}, "m") == {}  # nothing given, nothing checked
