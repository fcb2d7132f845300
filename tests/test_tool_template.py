"""tools.py --tool_format template: the tools shown by the chat template as JSON schemas, calls
written as JSON in <tool_call> and read with json.loads (each malformed call answered with its
error, nothing run), the template's tool message appended as token ids after the sampled ones with
mask 0 and exactly zero gradient, the option errors, and a run on the tiny Qwen3-style template
(tests/thinking_models.py)."""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import tools
import warm  # tests/warm.py: `python X.py` runs forked from a warm process
from common.env import toolbox
from common.errors import UsageError
from common.models.loading import load_policy, load_tokenizer
from common.models.logprobs import token_logprobs
from common.models.sampler import encode_prompts
from common.models.templates import offer_tools, template_kwargs, tool_message
from test_tools import Script
from thinking_models import save_thinking_model

ROOT = Path(__file__).resolve().parents[1]
NO_THINKING = '{"enable_thinking": false}'


def call(name, arguments, before=""):
    """The text of a turn that ends in a call, as a Qwen model writes it."""
    body = json.dumps({"name": name, "arguments": arguments})
    return f"{before}<tool_call>\n{body}\n</tool_call>"


def answer(text, names=("calc", "factor")):
    return toolbox.answer_call(text, names, "template")


# ---- the calls ---------------------------------------------------------------------------------
def test_a_json_call_runs_its_tool_with_its_arguments():
    assert answer(call("calc", {"expression": "214 + 23 * 105"})) == "2629"
    assert answer(call("calc", {"expression": "7 / 2"}, before="So ")) == "7/2"
    assert answer(call("factor", {"expression": "x^2 - 1"})) == "(x - 1)*(x + 1)"
    # the closing tag's last token may carry a character more, as with the tags
    assert answer(call("calc", {"expression": "1 + 1"}) + "\n") == "2"
    # no spaces, no newlines: JSON all the same
    assert answer('<tool_call>{"name":"calc","arguments":{"expression":"2*3"}}</tool_call>') == "6"


def test_no_call_is_no_answer():
    assert answer("The answer is 6.") is None
    assert answer(call("calc", {"expression": "1"}) + " and then much more text") is None
    assert answer("<calc>2 * 3</calc>") is None  # the tags are not this format's calls


@pytest.mark.parametrize("text,expected", [
    ('<tool_call>{"name": "calc", "arguments": {"expression": "2 * 3"}</tool_call>',
     "error: not JSON (Expecting ',' delimiter at character 53)"),
    ("<tool_call>calc(2 * 3)</tool_call>", "error: not JSON (Expecting value at character 0)"),
    ("<tool_call>{'name': 'calc'}</tool_call>",
     "error: not JSON (Expecting property name enclosed in double quotes at character 1)"),
    ("<tool_call>[1, 2]</tool_call>", 'error: a call is {"name": <tool>, "arguments": {...}}'),
    ('<tool_call>{"name": "calc"}</tool_call>',
     'error: a call is {"name": <tool>, "arguments": {...}}'),
    (call("python", {"code": "import os"}), "error: no tool 'python'; the tools are calc, factor"),
    (call("solve", {"expression": "x = 1"}), "error: no tool 'solve'; the tools are calc, factor"),
    (call("calc", "2 * 3"), "error: calc's arguments are an object, not a string"),
    (call("calc", {}), "error: calc needs the argument 'expression'"),
    (call("calc", {"expr": "2 * 3"}), "error: calc needs the argument 'expression'"),
    (call("calc", {"expression": "2 * 3", "precision": 2}),
     "error: calc has no argument 'precision'; it takes expression"),
    (call("calc", {"expression": 6}),
     "error: calc's 'expression' is an integer; it takes a string"),
    (call("calc", {"expression": ["2", "3"]}),
     "error: calc's 'expression' is an array; it takes a string"),
    (call("calc", {"expression": None}), "error: calc's 'expression' is null; it takes a string"),
    ("x = 6\n</tool_call>", "error: no <tool_call>"),
    ("<tool_call>" + "[" * 600 + "</tool_call>", "error: the call is longer than 500 characters"),
])
def test_a_malformed_call_is_answered_with_one_error_line_and_runs_nothing(text, expected,
                                                                            monkeypatch):
    ran = []
    monkeypatch.setitem(toolbox.TOOLS, "calc", ("", lambda t: ran.append(t) or toolbox.calc(t)))
    assert answer(text) == expected and ran == []


def test_a_well_formed_call_gets_the_tool_s_own_errors():
    assert answer(call("calc", {"expression": "__import__('os')"})) == (
        "error: not arithmetic (+ - * / and brackets): \"__import__('os')\"")
    assert answer(call("calc", {"expression": "1" * 301})) == (
        "error: the argument is longer than 300 characters")
    assert answer(call("factor", {"expression": "x = 1"})) == (
        "error: one = at most, and only for solve")


def test_json_nested_past_the_stack_is_an_error_not_a_crash(monkeypatch):
    monkeypatch.setattr(toolbox, "MAX_CALL", 10 ** 6)
    text = "<tool_call>" + "[" * 100_000 + "</tool_call>"
    assert answer(text) == "error: not JSON (nested too deep)"


# ---- the schemas -------------------------------------------------------------------------------
def test_the_schemas_are_what_get_json_schema_makes_of_typed_tools():
    from transformers.utils import get_json_schema

    calc = {"type": "function", "function": {
        "name": "calc",
        "description": "A calculator: the exact value of an arithmetic expression (+ - * / and "
                       "brackets), as an integer or a reduced fraction.",
        "parameters": {"type": "object", "properties": {"expression": {
            "type": "string", "description": "the expression, e.g. 214 + 23 * 105"}},
            "required": ["expression"]},
        "return": {"type": "string"}}}
    assert toolbox.tool_schema("calc") == calc
    factor = {"type": "function", "function": {
        "name": "factor", "description": "sympy's factor: the expression as a product of factors.",
        "parameters": {"type": "object", "properties": {"expression": {
            "type": "string", "description": "the expression, e.g. x^2 - 4"}},
            "required": ["expression"]},
        "return": {"type": "string"}}}
    assert toolbox.tool_schema("factor") == factor

    # the same dicts as transformers makes them of a typed function with a Google-style docstring
    def typed(name):
        description, argument = toolbox.DOCS[name]

        def tool(expression: str) -> str:
            pass
        tool.__name__ = name
        tool.__doc__ = f"{description}\n\nArgs:\n    expression: {argument}\n"
        return tool

    for name in toolbox.TOOLS:
        assert get_json_schema(typed(name)) == toolbox.tool_schema(name), name


# ---- the template ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """The tiny Qwen3-style model's folder, and its tokenizer without thinking, offered calc."""
    folder = save_thinking_model("qwen3", tmp_path_factory.mktemp("qwen3") / "model")
    tok = load_tokenizer(str(folder), template_kwargs=NO_THINKING)
    offer_tools(tok, [toolbox.tool_schema("calc")], "qwen3")
    return str(folder), tok


ANSWER_6 = ("<|im_end|>\n<|im_start|>user\n<tool_response>\n6\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_the_tool_message_is_what_the_template_writes_after_the_call(qwen3):
    tok = qwen3[1]
    assert tool_message(tok, call("calc", {"expression": "2 * 3"}), "6") == ANSWER_6
    # what the template writes of a whole conversation, after the model's text, indeed
    said = call("calc", {"expression": "2 * 3"})
    full = tok.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": said},
         {"role": "tool", "content": "6"}], tokenize=False, add_generation_prompt=True,
        **template_kwargs(tok))
    assert full.endswith(said + ANSWER_6)
    # thinking on: the next turn's prompt opens the block again, as the template's prompts do
    on = load_tokenizer(qwen3[0], template_kwargs='{"enable_thinking": true}')
    offer_tools(on, [toolbox.tool_schema("calc")], "qwen3")
    assert tool_message(on, said, "6") == ANSWER_6.replace("<think>\n\n</think>\n\n", "<think>\n")


def test_the_prompt_shows_the_schemas_and_no_tags(qwen3):
    from common.env.math_env import make_env

    env = make_env("arithmetic", num_examples=4, say=lambda *a: None, num_few_shot=1)
    instructions = env.system_prompt
    toolbox.show_tools(env, ("calc",), 1, "template")
    assert env.system_prompt == instructions and env.few_shot == []
    tok = qwen3[1]
    text = tok.decode(encode_prompts(tok, [env.prompt(0)])[0])
    # (the tiny template's Jinja drops the newlines around the schema that Qwen's writes)
    assert "<tools>" + json.dumps(toolbox.tool_schema("calc")) + "</tools>" in text
    assert text.startswith("<|im_start|>system\n" + instructions + "\n\n# Tools")
    assert "<calc>" not in text and "<output>" not in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_a_template_without_tools_or_tool_messages_is_refused_in_one_line():
    tok = load_tokenizer("tiny-random")

    def refusal(template):
        """offer_tools' one line for a tokenizer with this chat template."""
        tok.chat_template = template
        with pytest.raises(UsageError) as err:
            offer_tools(tok, [toolbox.tool_schema("calc")], "tiny-random")
        return str(err.value)

    assert refusal(tok.chat_template) == (  # SmolLM2's template never reads `tools`
        "--tool_format template: tiny-random's chat template takes no tools (it never reads "
        "`tools`); use --tool_format tags, or a model whose template does, such as "
        "Qwen/Qwen2.5-1.5B-Instruct or Qwen3.")
    # a template that shows the tools but drops the tool's message
    assert refusal("{{ tools | tojson }}{% for m in messages %}{% if m.role != 'tool' %}"
                   "{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}") == (
        "--tool_format template: tiny-random's chat template writes no tool message (the role "
        '"tool"); use --tool_format tags.')
    # one that trims the model's text: its tokens and the template's text would not meet
    assert refusal("{{ tools | tojson }}{% for m in messages %}"
                   "{{ m.role }}: {{ m.content | trim }}\n{% endfor %}") == (
        "--tool_format template: the chat template does not answer a call with a tool message "
        "right after the model's text, so its tokens cannot be added to the sampled ones; use "
        "--tool_format tags.")
    assert "fails on a tool message (TemplateError: no tool " in refusal(
        "{{ tools | tojson }}{% for m in messages %}{% if m.role == 'tool' %}"
        "{{ raise_exception('no tool role') }}{% endif %}{% endfor %}")


# ---- the loop, with a scripted sampler: token in, token out ------------------------------------
TWO_CALLS = [(call("calc", {"expression": "2 * 3"}), False),
             (call("calc", {"expression": 6}, before="So "), False),
             ("The answer is 6.", True)]
NO_CALL = [("The answer is 9.", True)]


def scripted_play(monkeypatch, tok, scripts, **args):
    policy = load_policy("tiny-random")  # the tiny Qwen3's weights are tiny-random's
    prompts = [tok.encode(f"question {r}:", add_special_tokens=False) for r in range(len(scripts))]
    script = Script(tok, prompts, scripts)
    monkeypatch.setattr(tools, "generate", script)
    run_args = replace(tools.Args(), **{"max_new_tokens": 300, "max_turns": 3,
                                        "tool_format": "template", **args})
    out = tools.play(policy, tok, prompts, [0] * len(prompts), run_args, 1.0,
                     torch.autocast("cpu", enabled=False))
    return policy, script, prompts, out


def test_the_training_ids_are_the_sampled_ids_and_the_tool_messages_byte_for_byte(monkeypatch,
                                                                                  qwen3):
    tok = qwen3[1]
    _, script, prompts, (gen, tool_mask, texts, calls, failures) = scripted_play(
        monkeypatch, tok, [TWO_CALLS, NO_CALL])
    said = [script.ids(0, k) for k in range(3)]
    error = "error: calc's 'expression' is an integer; it takes a string"
    out6 = tok.encode(ANSWER_6, add_special_tokens=False)
    out_error = tok.encode(ANSWER_6.replace("\n6\n", f"\n{error}\n"), add_special_tokens=False)
    assert tok.convert_ids_to_tokens(out6[:2]) == ["<|im_end|>", "Ċ"]  # the turn's end, a token
    row = said[0] + out6 + said[1] + out_error + said[2]
    n = len(row)
    assert gen.response_ids[0, :n].tolist() == row and gen.response_mask[0].sum() == n
    assert tool_mask[0, :n].tolist() == ([1] * len(said[0]) + [0] * len(out6) + [1] * len(said[1])
                                         + [0] * len(out_error) + [1] * len(said[2]))
    # the sampler's log-probs where the model wrote, 0 on the template's tokens
    expected = ([-0.01 - t / 1000 for t in range(len(said[0]))] + [0.0] * len(out6)
                + [-0.02 - t / 1000 for t in range(len(said[1]))] + [0.0] * len(out_error)
                + [-0.03 - t / 1000 for t in range(len(said[2]))])
    torch.testing.assert_close(gen.logprobs[0, :n], torch.tensor(expected))
    # each turn reads the ids sampled before it and the template's ids, never re-tokenised text
    assert script.contexts[1][0] == prompts[0] + said[0] + out6
    assert script.contexts[2][0] == prompts[0] + said[0] + out6 + said[1] + out_error
    assert script.stops == [("</tool_call>",), ("</tool_call>",), ()]
    # the reward reads the model's own text: no tool message in it
    assert texts[0] == TWO_CALLS[0][0] + TWO_CALLS[1][0] + "The answer is 6."
    assert texts[1] == "The answer is 9."
    assert calls.tolist() == [2, 0] and failures.tolist() == [1, 0]


def test_the_tool_message_s_tokens_get_exactly_zero_gradient(monkeypatch, qwen3):
    policy, _, _, (gen, tool_mask, _, _, _) = scripted_play(monkeypatch, qwen3[1],
                                                            [TWO_CALLS, NO_CALL])
    args = tools.Args()
    input_ids, attention_mask = gen.sequences()
    R = gen.response_ids.shape[1]
    logprobs, _ = token_logprobs(policy, input_ids, attention_mask, R, 1.0)
    loss_mask = gen.response_mask * tool_mask
    norm = tools.loss_normaliser(loss_mask, args, 1)
    loss, _ = tools.policy_loss(logprobs, logprobs.detach(), torch.tensor([1.0, -1.0]), loss_mask,
                                norm, args)
    (grad,) = torch.autograd.grad(loss, logprobs)
    own, message = loss_mask.bool(), gen.response_mask.bool() & ~tool_mask.bool()
    assert message.sum() > 40 and (grad[message] == 0).all()  # two tool messages, all 0
    assert (grad[own] != 0).all()
    torch.testing.assert_close(grad[0][own[0]], torch.full((int(own[0].sum()),),
                                                           -1.0 / own[0].sum().item() / 2))


def test_an_update_trains_on_the_model_s_tokens_only(tmp_path, monkeypatch, qwen3):
    # tools.py's main on the tiny Qwen3 template, its sampler scripted: 2 prompts x 4 responses,
    # three of which call calc in JSON, graded by the length reward. pi_old is the policy, so the
    # logged pg_loss is the mean of -A_i over the model's own tokens: the template's tool messages
    # (33 tokens each) in the loss would move it.
    import run_with_test_reward
    from common.env import math_env as envlib

    monkeypatch.setattr(envlib, "make_env", run_with_test_reward.make_env)
    monkeypatch.setenv("TEST_REWARD", "length")
    scripts = [[(call("calc", {"expression": f"{k} * 3"}), False),
                (f"The answer is {3 * k}.", True)] if k in (0, 3, 5) else [("x" * (k + 1), True)]
               for k in range(8)]
    tok = qwen3[1]
    script = Script(tok, None, scripts)
    monkeypatch.setattr(tools, "generate", script)
    args = replace(tools.Args(), model_name_or_path=qwen3[0], tool_format="template",
                   chat_template_kwargs=NO_THINKING, num_prompts=2, num_generations=4,
                   max_steps=1, max_new_tokens=300, micro_batch_size=8, num_eval_problems=0,
                   learning_rate=1e-3, output_dir=str(tmp_path))
    tools.main(args)
    (line,) = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # the prompts the sampler saw were built with the template's tools
    prompt = tok.decode(script.contexts[0][0])
    assert '"name": "calc"' in prompt and "<calc>" not in prompt
    own = [[script.ids(k, t) for t in range(len(scripts[k]))] for k in range(8)]
    texts = [tok.decode(sum(turns, []), skip_special_tokens=True) for turns in own]
    rewards = torch.tensor([(len(t) % 5) / 4 for t in texts])
    advantages = tools.group_advantages(rewards, 4)
    n = torch.tensor([float(sum(map(len, turns))) for turns in own])  # the model's tokens
    assert line["tools/call_frequency"] == 3 / 8 and line["tools/failure_frequency"] == 0.0
    assert line["response_len/mean"] == n.mean().item()
    assert line["reward/mean"] == pytest.approx(rewards.mean().item())
    assert line["pg_loss"] == pytest.approx((-(advantages * n).sum() / n.sum()).item(), abs=1e-6)
    assert abs(line["pg_loss"]) > 0.01
    # the run's samples show each transcript: the three calls, each with the template's answer
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 8 and sum("<tool_call>" in s["response"] for s in samples) == 3
    assert [f"<tool_response>\n{3 * k}\n</tool_response>" in samples[k]["response"]
            for k in range(8)] == [k in (0, 3, 5) for k in range(8)]


# ---- the command line --------------------------------------------------------------------------
@pytest.mark.parametrize("flags,message", [
    (["--tool_format", "template", "--template", "plain"],
     "--tool_format template needs a chat template: drop --template plain, or use --tool_format "
     "tags."),
    (["--tool_format", "template", "--tools", "none"],
     "--tool_format template changes nothing in this run: it is read only with --tools naming a "
     "tool."),
    (["--tool_format", "template", "--num_few_shot", "2"],
     "--num_few_shot 2 changes nothing in this run: it is read only with --tool_format tags."),
])
def test_option_errors_are_one_line_before_any_model_loads(tmp_path, flags, message):
    out = warm.run([sys.executable, "tools.py", "--model_name_or_path", "no/such-model", *flags,
                    "--output_dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                   timeout=300)
    assert out.returncode != 0 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_model_whose_template_takes_no_tools_is_refused_before_its_weights_load(tmp_path,
                                                                                  monkeypatch):
    # in a run: one line, exit status 1, no traceback
    out = warm.run([sys.executable, "tools.py", "--model_name_or_path", "tiny-random",
                    "--tool_format", "template", "--output_dir", str(tmp_path / "run")],
                   cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: --tool_format template: tiny-random's chat template takes no tools (it never "
        "reads `tools`); use --tool_format tags, or a model whose template does, such as "
        "Qwen/Qwen2.5-1.5B-Instruct or Qwen3."]
    # and before the weights: main never asks for them

    def no_weights(*a, **k):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(tools, "trained_policy", no_weights)
    args = replace(tools.Args(), model_name_or_path="tiny-random", tool_format="template",
                   num_eval_problems=0, output_dir=str(tmp_path / "main"))
    with pytest.raises(UsageError, match="takes no tools"):
        tools.main(args)


def test_two_updates_on_the_tiny_qwen3_template(tmp_path, qwen3):
    # a random model calls no tool by itself (the scripted tests above show the calls): the run
    # builds its prompts with the template's tools, samples, grades and trains two updates
    out = warm.run([sys.executable, "tools.py", "--tool_format", "template",
                    "--model_name_or_path", qwen3[0], "--chat_template_kwargs", NO_THINKING,
                    "--max_steps", "2", "--num_prompts", "2", "--num_generations", "2",
                    "--max_new_tokens", "48", "--num_eval_problems", "4",
                    "--output_dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                   timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    assert [x["tools/call_frequency"] for x in lines] == [0.0, 0.0]
    assert (tmp_path / "checkpoint-2" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "args.json").read_text())["tool_format"] == "template"
