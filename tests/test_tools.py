"""tools.py and common/env/toolbox.py: the tools against hand-worked answers (errors and timeouts
included), the multi-turn loop with a scripted sampler (the training ids are exactly the sampled ids
and the tools' ids, both answers of two calls are in the context, a failing tool is an answer), the
tools' tokens getting exactly zero gradient, a run whose tool never fires training exactly what
grpo.py trains, TRL 1.16's tool loop and loss on the same scripted batch, and a run that learns to
call the tool."""

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import grpo
import tools
import warm  # tests/warm.py: `python X.py` runs forked from a warm process
from common.env import toolbox
from common.env.grader import math_equal
from common.models.logprobs import token_logprobs
from common.models.loading import load_policy, load_tokenizer
from common.models.sampler import Generation, left_pad

ROOT = Path(__file__).resolve().parents[1]


# ---- the tools ---------------------------------------------------------------------------------
def test_the_calculator_gives_exact_values_and_an_error_text_for_anything_else():
    assert toolbox.calc("214 + 23 * 105") == "2629"
    assert toolbox.calc("(7 - 2) / 4") == "5/4"
    assert toolbox.calc("1,234 * 2") == "2468"  # a thousands comma, not a tuple
    for text in ("2 ** 10", "__import__('os')", "x + 1", "1 / 0", ""):
        assert toolbox.calc(text).startswith("error: not arithmetic"), text


def test_sympy_tools_answer_in_a_worker_and_say_what_went_wrong():
    run = toolbox.run_tool
    assert run("factor", "x^2 - 1") == "(x - 1)*(x + 1)"
    assert run("factor", "x**2 - 5*x + 6") == "(x - 3)*(x - 2)"  # Python's power is read too
    assert run("solve", "x^2 = 4") == "[-2, 2]"
    assert run("solve", "2x + 3") == "[-3/2]"  # an expression is solved for = 0
    assert run("simplify", "(x^2 - 1)/(x - 1)") == "x + 1"
    assert run("factor", "__import__('os').system('ls')").startswith("error: cannot read")
    assert run("factor", "x = 1") == "error: one = at most, and only for solve"
    # sympy runs to the grader's budget of CPU time (1 s) and stops: a text, not a hang
    assert run("factor", "(x+y+z+1)^{30} - 1") == "error: out of time"
    assert run("factor", "x^2 - 4") == "(x - 2)*(x + 2)"  # and the worker still answers


def test_sympy_tools_read_a_sum_as_the_grader_does():
    run = toolbox.run_tool
    # the = of \sum_{k=1} is the sum's own, not an equation's (issue 69: it was refused)
    assert run("simplify", "\\sum_{k=1}^{10} k") == "55"
    assert math_equal("\\sum_{k=1}^{10} k", "55")  # what the grader reads
    assert run("factor", "\\sum_{k=1}^{n} k") == "n*(n + 1)/2"
    assert run("solve", "\\sum_{k=1}^{n} k = 55") == "[-11, 10]"
    assert run("factor", "\\sum_{k=1}^{n} k = 55") == "error: one = at most, and only for solve"
    # a sum too long to add up stops at the budget, with a text
    start = time.monotonic()
    assert run("simplify", "\\sum_{k=1}^{10^{6}} \\sin(k)") == "error: out of time"
    assert time.monotonic() - start < 5.0  # 1 s of the worker's CPU time
    assert run("simplify", "\\sum_{k=1}^{3} k^2") == "14"


def test_a_call_is_found_only_where_the_stop_string_ended_the_text():
    find = toolbox.find_call
    assert find("So <calc>214 + 23 * 105</calc>", ("calc",)) == ("calc", "214 + 23 * 105")
    # the closing tag's last token may carry a character or two more
    assert find("<calc>1+1</calc><", ("calc",)) == ("calc", "1+1")
    assert find("<calc>1+1</calc> then much more text", ("calc",)) is None
    assert find("<factor>x^2-1</factor>", ("calc", "factor")) == ("factor", "x^2-1")
    assert find("x </calc>", ("calc",)) == ("calc", None)  # no opening tag: an error answer
    assert toolbox.run_tool("calc", None) == "error: no <calc>"
    assert toolbox.run_tool("calc", "1" * 301).startswith("error: the argument is longer")


def test_a_tool_that_raises_answers_with_its_error(monkeypatch):
    monkeypatch.setitem(toolbox.TOOLS, "calc", ("", lambda text: 1 / 0))
    assert toolbox.run_tool("calc", "1 + 1") == "error: ZeroDivisionError"


def test_tools_option_names_known_tools_once():
    assert toolbox.parse_tools("calc,factor") == ("calc", "factor")
    assert toolbox.parse_tools("none") == ()
    for bad in ("calc,calc", "python", "calc,exec"):
        with pytest.raises(ValueError, match="a comma list of calc, solve, simplify, factor"):
            toolbox.parse_tools(bad)


# ---- the loop, with a scripted sampler ---------------------------------------------------------
class Script:
    """A scripted sampler: row r of the batch says scripts[r][k] at its k-th turn. The first call
    gets every row in order; a later context is row r's if it starts with prompts[r] and r's first
    turn. Each token's sampler log-prob is -(turn + 1) / 100 - position / 1000. As tools.generate,
    it records every call's contexts and stop strings; `trl_turn` is TRL's _generate_single_turn."""

    def __init__(self, tokenizer, prompts, scripts):
        self.tok, self.prompts, self.scripts = tokenizer, prompts, scripts
        self.turns, self.contexts, self.stops = [0] * len(scripts), [], []

    def ids(self, r, k):
        text, eos = self.scripts[r][k]
        return self.tok.encode(text, add_special_tokens=False) + ([self.tok.eos_token_id] if eos
                                                                  else [])

    def say(self, contexts):
        """-> (the rows, what each says now, as ids)"""
        self.contexts.append([list(c) for c in contexts])
        if len(self.contexts) == 1:
            rows = list(range(len(contexts)))
            self.prompts = self.prompts or [list(c) for c in contexts]  # None: learnt here
        else:
            rows = [next(r for r, p in enumerate(self.prompts) if c[:len(p) + len(self.ids(r, 0))]
                         == p + self.ids(r, 0)) for c in contexts]
        said = [self.ids(r, self.turns[r]) for r in rows]
        for r in rows:
            self.turns[r] += 1
        return rows, said

    def __call__(self, policy, tokenizer, contexts, max_new_tokens, temperature, top_p,
                 stop_strings=(), seeds=None, decoder=None):
        self.stops.append(stop_strings)
        rows, said = self.say(contexts)
        width = max(len(s) for s in said)
        ids = torch.full((len(said), width), tokenizer.pad_token_id)
        mask, logprobs = torch.zeros(len(said), width, dtype=torch.long), torch.zeros(len(said), width)
        for j, (r, s) in enumerate(zip(rows, said)):
            ids[j, :len(s)], mask[j, :len(s)] = torch.tensor(s), 1
            logprobs[j, :len(s)] = torch.tensor([-(self.turns[r]) / 100 - t / 1000
                                                 for t in range(len(s))])
        prompt_ids, prompt_mask = left_pad(contexts, tokenizer.pad_token_id)
        finished = torch.ones(len(said), dtype=torch.bool)  # EOS or the stop string
        return Generation(prompt_ids, prompt_mask, ids, mask, logprobs, finished, ~finished)

    def trl_turn(self, prompt_ids, images, multimodal_fields, num_generations, **kw):
        return self.say(prompt_ids)[1], None  # no sampler log-probs: TRL recomputes them


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny-random"), load_tokenizer("tiny-random")


def scripted_play(monkeypatch, tiny, scripts, tools_="calc", **args):
    policy, tok = tiny
    prompts = [tok.encode(f"question {r}:", add_special_tokens=False) for r in range(len(scripts))]
    script = Script(tok, prompts, scripts)
    monkeypatch.setattr(tools, "generate", script)
    run_args = replace(tools.Args(), **{"max_new_tokens": 200, "max_turns": 3, "tools": tools_,
                                        **args})
    out = tools.play(policy, tok, prompts, [0] * len(prompts), run_args, 1.0,
                     torch.autocast("cpu", enabled=False))
    return script, prompts, out


TWO_CALLS = [("<calc>2 * 3</calc>", False), ("So <calc>6 + 1</calc>", False),
             ("The answer is 7.", True)]
NO_CALL = [("The answer is 9.", True)]


def test_the_training_ids_are_the_sampled_ids_and_the_tool_s_ids_byte_for_byte(monkeypatch, tiny):
    tok = tiny[1]
    script, prompts, (gen, tool_mask, texts, calls, failures) = scripted_play(
        monkeypatch, tiny, [TWO_CALLS, NO_CALL])
    said = [script.ids(0, k) for k in range(3)]
    out6, out7 = (tok.encode(f"<output>{v}</output>", add_special_tokens=False) for v in (6, 7))
    row = said[0] + out6 + said[1] + out7 + said[2]
    n = len(row)
    assert gen.response_ids[0, :n].tolist() == row and gen.response_mask[0].sum() == n
    assert tool_mask[0, :n].tolist() == ([1] * len(said[0]) + [0] * len(out6) + [1] * len(said[1])
                                         + [0] * len(out7) + [1] * len(said[2]))
    # the sampler's log-probs where the model wrote, 0 on the tool's tokens
    expected = ([-0.01 - t / 1000 for t in range(len(said[0]))] + [0.0] * len(out6)
                + [-0.02 - t / 1000 for t in range(len(said[1]))] + [0.0] * len(out7)
                + [-0.03 - t / 1000 for t in range(len(said[2]))])
    torch.testing.assert_close(gen.logprobs[0, :n], torch.tensor(expected))
    # both answers are in the context of the turns after them: the ids, not re-tokenised text
    assert script.contexts[1][0] == prompts[0] + said[0] + out6
    assert script.contexts[2][0] == prompts[0] + said[0] + out6 + said[1] + out7
    assert len(script.contexts[1]) == 1  # the row that answered at once left after one turn
    # the last turn's call would go unanswered: it is sampled without the stop string
    assert script.stops == [("</calc>",), ("</calc>",), ()]
    # the reward reads the model's own text; the transcript has the tools' answers too
    assert texts[0] == "<calc>2 * 3</calc>So <calc>6 + 1</calc>The answer is 7."
    assert texts[1] == "The answer is 9." and gen.response_ids[1, len(script.ids(1, 0)):].eq(
        tok.pad_token_id).all()
    assert calls.tolist() == [2, 0] and failures.tolist() == [0, 0]
    assert gen.finished.tolist() == [True, True]


def test_a_failing_or_slow_tool_is_answered_with_an_error_and_the_response_goes_on(monkeypatch,
                                                                                   tiny):
    monkeypatch.setitem(toolbox.TOOLS, "calc", ("", lambda text: 1 / 0))
    scripts = [[("<calc>1 + 1</calc>", False), ("The answer is 2.", True)],
               [("<factor>(x+y+z+1)^{30} - 1</factor>", False), ("The answer is 0.", True)]]
    script, prompts, (gen, tool_mask, texts, calls, failures) = scripted_play(
        monkeypatch, tiny, scripts, tools_="calc,factor")
    tok = tiny[1]
    for r, error in enumerate(("error: ZeroDivisionError", "error: out of time")):
        answer = tok.encode(f"<output>{error}</output>", add_special_tokens=False)
        assert script.contexts[1][r] == prompts[r] + script.ids(r, 0) + answer
    assert texts == ["<calc>1 + 1</calc>The answer is 2.",
                     "<factor>(x+y+z+1)^{30} - 1</factor>The answer is 0."]
    assert calls.tolist() == [1, 1] and failures.tolist() == [1, 1]


def test_the_budget_counts_the_tool_s_tokens_and_cuts_its_answer(monkeypatch, tiny):
    tok = tiny[1]
    first = tok.encode("<calc>2 * 3</calc>", add_special_tokens=False)
    budget = len(first) + 3  # the answer <output>6</output> is longer than 3 tokens
    script, _, (gen, tool_mask, _, calls, _) = scripted_play(
        monkeypatch, tiny, [TWO_CALLS], max_new_tokens=budget)
    out = tok.encode("<output>6</output>", add_special_tokens=False)
    assert gen.response_ids[0].tolist() == first + out[:3]
    assert tool_mask[0].tolist() == [1] * len(first) + [0] * 3
    assert len(script.contexts) == 1 and calls.tolist() == [1]  # no room left: no second turn
    assert gen.truncated.tolist() == [True]


# ---- the loss ----------------------------------------------------------------------------------
def test_the_tool_s_tokens_get_exactly_zero_gradient(monkeypatch, tiny):
    _, _, (gen, tool_mask, _, _, _) = scripted_play(monkeypatch, tiny, [TWO_CALLS, NO_CALL])
    args = tools.Args()
    policy = load_policy("tiny-random")
    input_ids, attention_mask = gen.sequences()
    R = gen.response_ids.shape[1]
    logprobs, _ = token_logprobs(policy, input_ids, attention_mask, R, 1.0)
    loss_mask = gen.response_mask * tool_mask
    norm = tools.loss_normaliser(loss_mask, args, 1)
    advantages = torch.tensor([1.0, -1.0])
    loss, _ = tools.policy_loss(logprobs, logprobs.detach(), advantages, loss_mask, norm, args)
    (grad,) = torch.autograd.grad(loss, logprobs)
    own, answer = loss_mask.bool(), gen.response_mask.bool() & ~tool_mask.bool()
    assert answer.sum() > 0 and (grad[answer] == 0).all()  # exactly 0 on the tools' answers
    assert (grad[own] != 0).all()  # and not 0 on a single token the model wrote
    # grpo's per-sequence mean, by hand: row 0's model tokens share -A_0 / (its model tokens) / 2
    torch.testing.assert_close(grad[0][own[0]], torch.full((int(own[0].sum()),),
                                                           -1.0 / own[0].sum().item() / 2))


@pytest.mark.slow  # the second tier: two runs
def test_a_run_whose_tool_never_fires_trains_exactly_what_grpo_py_trains(tmp_path):
    # tiny-random never writes </calc>: tools.py's rollout is then grpo.py's, token for token, and
    # so are its loss (a token mean, with the k3 KL to the reference) and its weights, bit for bit.
    # tools.py tells the model of its tool after a --system_prompt too: grpo.py gets that text.
    common = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "12", "--max_steps", "2",
              "--num_prompts", "2", "--num_generations", "4", "--learning_rate", "1e-2",
              "--num_eval_problems", "4", "--num_few_shot", "0", "--loss_type", "dapo",
              "--beta", "0.1"]
    prompts = {"tools": "Answer.", "grpo": toolbox.system_prompt("Answer.", ("calc",))}
    for name in ("grpo", "tools"):  # the length reward, which varies within a group
        out = warm.run([sys.executable, "tests/run_with_test_reward.py", name, *common,
                        "--system_prompt", prompts[name],
                        "--output_dir", str(tmp_path / name)], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env={**os.environ, "TEST_REWARD": "length"})
        assert out.returncode == 0, out.stderr[-3000:]
    logs = {name: [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text()
                   .splitlines()] for name in ("grpo", "tools")}
    assert [x["tools/call_frequency"] for x in logs["tools"]] == [0.0, 0.0]
    for ours, theirs in zip(logs["tools"], logs["grpo"]):
        for key in ("reward/mean", "response_len/mean", "pg_loss", "kl_ref", "grad_norm",
                    "entropy"):
            assert ours[key] == theirs[key], key
        assert ours["grad_norm"] > 0
    from safetensors.torch import load_file
    a, b = (load_file(tmp_path / name / "checkpoint-2" / "model.safetensors")
            for name in ("grpo", "tools"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_an_update_trains_on_the_model_s_tokens_only(tmp_path, monkeypatch, tiny):
    # tools.py's own update loop (main), its sampler scripted: 2 prompts x 4 responses, three of
    # which call the calculator, graded by the length reward. pi_old is the policy, so every token's
    # clipped term is -A_i, and the logged pg_loss is their mean over the tokens in the loss: the
    # model's own, by hand below. The tools' answers (11 tokens each) in the loss would move it.
    import run_with_test_reward
    from common.env import math_env as envlib

    monkeypatch.setattr(envlib, "make_env", run_with_test_reward.make_env)
    monkeypatch.setenv("TEST_REWARD", "length")
    scripts = [[(f"<calc>{k} * 3</calc>", False), (f"The answer is {3 * k}.", True)]
               if k in (0, 3, 5) else [("x" * (k + 1), True)] for k in range(8)]
    script = Script(tiny[1], None, scripts)
    monkeypatch.setattr(tools, "generate", script)
    args = replace(tools.Args(), model_name_or_path="tiny-random", num_prompts=2,
                   num_generations=4, max_steps=1, max_new_tokens=200, micro_batch_size=8,
                   num_eval_problems=0, system_prompt="Answer.", num_few_shot=0,
                   learning_rate=1e-3, output_dir=str(tmp_path))
    tools.main(args)
    (line,) = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    tok = tiny[1]
    own = [[script.ids(k, t) for t in range(len(scripts[k]))] for k in range(8)]
    texts = [tok.decode(sum(turns, []), skip_special_tokens=True) for turns in own]
    rewards = torch.tensor([(len(t) % 5) / 4 for t in texts])
    advantages = tools.group_advantages(rewards, 4)
    n = torch.tensor([float(sum(map(len, turns))) for turns in own])  # the model's tokens
    assert line["tools/call_frequency"] == 3 / 8 and line["response_len/mean"] == n.mean().item()
    assert line["reward/mean"] == pytest.approx(rewards.mean().item())
    assert line["pg_loss"] == pytest.approx((-(advantages * n).sum() / n.sum()).item(), abs=1e-6)
    assert abs(line["pg_loss"]) > 0.01


# ---- option errors -----------------------------------------------------------------------------
@pytest.mark.parametrize("flags,message", [
    (["--tools", "calc,python"], "--tools 'calc,python': a comma list of calc, solve, simplify, "
                                 "factor without repeats, or none"),
    (["--max_turns", "0"], "--max_turns"),
])
def test_option_errors_are_one_line_before_any_model_loads(tmp_path, flags, message):
    out = warm.run([sys.executable, "tools.py", "--model_name_or_path", "no/such-model", *flags,
                    "--output_dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                   timeout=300)
    assert out.returncode != 0 and message in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


# ---- against TRL's own tool loop ---------------------------------------------------------------
ONE_CALL = [("<calc>5 - 1</calc>", False), ("The answer is 4.", True)]
GROUPS = [TWO_CALLS, NO_CALL, ONE_CALL, [("The answer is 5.", True)]]  # 2 prompts x 2 responses


@pytest.mark.slow  # the second tier: TRL's code
def test_trl_s_tool_loop_on_the_same_scripted_batch_gives_the_same_mask_and_loss(tmp_path,
                                                                                 monkeypatch, tiny):
    # TRL 1.16's GRPOTrainer with tools: its _tool_call_loop runs the calls (our calculator, our
    # tags: TRL's response parser and tool-answer template replaced by ours), appends the answers
    # to the ids, samples again (the script), builds tool_mask, and trains on completion_mask *
    # tool_mask. tools.py's play and loss on the same script must give the same ids, mask and loss.
    pytest.importorskip("trl")
    import trl.trainer.grpo_trainer as trl_grpo
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl_steps import moved_policy

    tok = tiny[1]
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    prompts = [tok.encode(f"question {r // 2}:", add_special_tokens=False) for r in range(4)]
    n = len(prompts)

    # ---- TRL
    def parse(tokenizer, ids, prefix=None, tools=None):  # TRL's parse_response, for our tags
        text = tokenizer.decode(ids, skip_special_tokens=True)
        call = toolbox.find_call(text, ("calc",))
        message = {"role": "assistant", "content": text}
        if call is not None:
            message["tool_calls"] = [{"type": "function", "function": {
                "name": "calc", "arguments": {"text": call[1]}}}]
        return message

    def calc(text):
        return toolbox.run_tool("calc", text)

    monkeypatch.setattr(trl_grpo, "parse_response", parse)
    config = GRPOConfig(output_dir=str(tmp_path), beta=0.0, report_to="none", use_cpu=True,
                        bf16=False, per_device_train_batch_size=n, num_generations=2,
                        max_completion_length=200, loss_type="grpo", temperature=0.7)
    trainer = GRPOTrainer(model=moved_policy(), args=config,
                          reward_funcs=[lambda completions, **kw: scores.tolist()],
                          train_dataset=Dataset.from_dict({"prompt": ["a"] * n}),
                          processing_class=load_tokenizer("tiny-random"))
    # the tools, set after __init__, whose check wants a chat template that renders tool calls
    trainer.tools = trainer._standalone_tools = [calc]  # each row's tools: {"calc": calc}
    trainer._tokenizer.response_template = "ours"  # parse completions (with `parse` above)
    trainer._get_tool_suffix_ids = lambda messages: tok.encode(
        toolbox.output_text(messages[0]["content"]), add_special_tokens=False)
    trainer._tokenize_prompts = lambda batch: ([list(p) for p in prompts], None, {})
    trl_script = Script(tok, prompts, GROUPS)
    trainer._generate_single_turn = trl_script.trl_turn
    trainer.current_gradient_accumulation_steps = 1
    trl_loss = trainer.training_step(
        trainer.model, [{"prompt": [{"role": "user", "content": f"q{r // 2}"}]} for r in range(n)],
        None)
    inputs = trainer._buffered_inputs[0]
    trl_rows = [ids[m.bool()].tolist() for ids, m in zip(inputs["completion_ids"],
                                                         inputs["completion_mask"])]
    trl_masks = [(m * t)[m.bool()].tolist() for m, t in zip(inputs["completion_mask"],
                                                            inputs["tool_mask"])]

    # ---- tools.py
    monkeypatch.setattr(tools, "generate", Script(tok, prompts, GROUPS))
    args = replace(tools.Args(), max_new_tokens=200, num_generations=2, temperature=0.7)
    gen, tool_mask, _, calls, _ = tools.play(tiny[0], tok, prompts, [0] * n, args, 0.7,
                                             torch.autocast("cpu", enabled=False))
    ours = [ids[m.bool()].tolist() for ids, m in zip(gen.response_ids, gen.response_mask)]
    loss_mask = gen.response_mask * tool_mask
    masks = [lm[m.bool()].tolist() for lm, m in zip(loss_mask, gen.response_mask)]
    # TRL shuffles the rows it trains on: each is found again by its ids
    order = [ours.index(row) for row in trl_rows]
    assert sorted(order) == list(range(n)) and calls.tolist() == [2, 0, 1, 0]
    assert [masks[k] for k in order] == trl_masks and sum(map(len, trl_masks)) > sum(map(sum, trl_masks))
    policy = moved_policy()
    input_ids, attention_mask = gen.sequences()
    logprobs, _ = token_logprobs(policy, input_ids, attention_mask, gen.response_ids.shape[1], 0.7)
    advantages = tools.group_advantages(scores, 2)
    loss, _ = tools.policy_loss(logprobs, logprobs.detach(), advantages, loss_mask,
                                tools.loss_normaliser(loss_mask, args, 1), args)
    loss.backward()
    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-5, abs=1e-8)
    for (name, a), b in zip(policy.named_parameters(), trainer.model.parameters()):
        assert ((a.grad - b.grad).norm() / b.grad.norm()).item() < 2e-6, name


# ---- learning ----------------------------------------------------------------------------------
@pytest.mark.slow  # the second tier: a learning run
def test_a_random_model_learns_to_call_the_tool_and_then_answer(tmp_path):
    # rewarded when its response closes a call and writes on after the answer, a random model over
    # characters and the four tags (tests/tool_model.py: </calc> is ~1 % of its tokens) starts near
    # 0.1 and learns to call at once: a flipped sign, a wrong mask or a lost answer keeps it low
    from tool_model import build

    model = build(tmp_path / "model")
    cmd = [sys.executable, "tests/run_with_test_reward.py", "tools", "--model_name_or_path", model,
           "--max_new_tokens", "24", "--max_turns", "2", "--num_prompts", "4",
           "--num_generations", "8", "--max_steps", "30", "--learning_rate", "5e-2",
           "--temperature", "1.0", "--num_eval_problems", "0", "--num_few_shot", "0",
           "--system_prompt", "Answer.", "--output_dir", str(tmp_path / "run")]
    out = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                   env={**os.environ, "TEST_REWARD": "tool_then_text"})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rewards = [x["reward/mean"] for x in lines]
    calls = [x["tools/call_frequency"] for x in lines]
    # the first update's batch is the random model's (it learns within a few updates at 5e-2:
    # at seed 0 the reward is 0.03, 0.22, 0.34, 0.88, then 1.0 from update 6)
    assert rewards[0] < 0.2, rewards
    assert sum(rewards[-5:]) / 5 > 0.8, rewards
    assert calls[0] < 0.2 and sum(calls[-5:]) / 5 > 0.8, calls  # it calls the tool


@pytest.mark.slow  # the second tier: torchrun
def test_torchrun_two_sharded_processes_match_one_process(tmp_path):
    # the model that calls by chance, so that ranks take different numbers of turns: under --fsdp
    # the weights are gathered once for every turn of a rollout, or a rank would wait for another
    # that has no turn left (a hang). 2 processes x 2 prompts draw what 1 process x 4 draws.
    import socket

    from safetensors.torch import load_file
    from tool_model import build

    model = build(tmp_path / "model")
    common = ["tests/run_with_test_reward.py", "tools", "--model_name_or_path", model,
              "--max_new_tokens", "24", "--max_turns", "2", "--num_prompts", "4",
              "--num_generations", "4", "--max_steps", "2", "--learning_rate", "1e-3",
              "--temperature", "1.0", "--num_eval_problems", "8", "--num_few_shot", "0",
              "--system_prompt", "Answer.", "--micro_batch_size", "4"]
    env = {**os.environ, "TEST_REWARD": "tool_then_text"}
    out = warm.run([sys.executable, *common, "--output_dir", str(tmp_path / "one")], cwd=ROOT,
                   capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    with socket.socket() as sock:  # a port no other test listens on (pytest -n 2)
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    out = warm.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                    "--master_port", port, *common, "--fsdp", "--output_dir", str(tmp_path / "two")],
                   cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    logs = [[json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
            for d in ("one", "two")]
    for key in ("reward/mean", "tools/call_frequency", "response_len/mean"):
        assert [m[key] for m in logs[0]] == pytest.approx([m[key] for m in logs[1]]), key
    assert max(m["tools/call_frequency"] for m in logs[0]) > 0  # some responses called the tool
    one, two = (load_file(str(tmp_path / d / "checkpoint-2" / "model.safetensors"))
                for d in ("one", "two"))
    assert max((one[n] - two[n]).abs().max().item() for n in one) < 1e-5


@pytest.mark.parametrize("given,before", [(None, "task"), ("Answer in words.", "Answer in words. "),
                                          ("", "")])
def test_the_prompt_names_the_tools_after_any_system_prompt(given, before):
    # a --system_prompt once replaced the tools' lines too: the model was offered <calc> untold
    from common.env.math_env import make_env

    env = make_env("arithmetic", num_examples=4, say=lambda *a: None, system_prompt=given)
    before = env.task.system_prompt + " " if before == "task" else before
    toolbox.show_tools(env, ("calc",), 0)
    assert env.system_prompt == (before + "You can use tools; each call's result appears after it as "
                                 "<output>...</output>. a calculator: <calc>214 + 23 * 105</calc> gives "
                                 "its value.")
