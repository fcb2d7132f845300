"""The reasoning block's grading rule (data/README.md, "Thinking models"), case by case, with each
case's reason; how a prompt is seen to open the block; and the tags a tokenizer declares."""

import math

import pytest

from common.env import Reasoning, declared_tags, make_env, verify

OPENED = Reasoning(opened=True)  # a DeepSeek-R1 distill's template writes <think> in the prompt

CASES = [
    # (response, gold, reward, why)
    ("<think>12*3 is 36, so the answer is 36? no wait, 12*3=38</think> The answer is 36.", "36", 1.0,
     "a second thought inside the block is scratch work: the answer after it is right"),
    ("<think>12*3 is 38? no wait, 12*3=36, so the answer is 36</think> The answer is 38.", "36", 0.0,
     "the mirror: a right thought inside the block does not pay for a wrong answer after it"),
    ("<think>so \\boxed{6}</think> Final: \\boxed{5}", "5", 1.0,
     "a box inside the block is no second candidate: only the box after it counts"),
    ("<think>so \\boxed{5}</think> Final: \\boxed{6}", "5", 0.0,
     "the mirror: the right box inside the block is not the answer"),
    ("<think>The answer is 36.</think> The answer is 38.", "36", 0.0,
     "wrong by the policy (the answer after the block is 38), not by the two-answers rule"),
    ("<think>The answer is 38.</think> The answer is 36.", "36", 1.0,
     "the mirror: a wrong first answer in the block costs nothing"),
    ("<think>The answer is 36.</think>", "36", 0.0,
     "an answer in the block only: nothing follows the close, so there is no answer"),
    ("<think>The answer is 36.", "36", 0.0,
     "a block that never closes holds no answer: the model never stopped thinking"),
    ("<think>a</think> The answer is 38. <think>no: 36</think> The answer is 36.", "36", 1.0,
     "two blocks: the answer is what follows the last one, where the model ended"),
    ("<think>a</think> The answer is 36. <think>no: 38</think> The answer is 38.", "36", 0.0,
     "the mirror: an answer between two blocks is a draft the second block took back"),
    ("<think>a</think> The answer is 36. <think>or not", "36", 0.0,
     "a block opened after the last close and left open: no answer"),
    ("<think>12*3</think> The answer is \\boxed{<think>36}", "36", 0.0,
     "tags are read before any answer is: a tag inside the box opens a block that never closes"),
    ("<think>12*3</think> The answer is \\boxed{36</think>}", "36", 0.0,
     "a close inside the box leaves '}' after the last close: no answer"),
    ("The answer is 36.", "36", 1.0, "no block: graded whole, as before"),
    ("I think the answer is 36, or maybe 38.", "36", 0.0, "no tag, no block: today's hedge rule"),
    ("12*3 = 36</think> The answer is 36.", "36", 1.0,
     "a close without an open (a template opened the block unseen): the answer follows it"),
    ("\\boxed{36} <think>", "36", 0.0, "an answer before a block that never closes is a draft"),
]


@pytest.mark.parametrize("response,gold,reward,why", CASES, ids=range(len(CASES)))
def test_the_answer_is_what_follows_the_block(response, gold, reward, why):
    assert verify("gsm8k", response, gold) == reward, why


@pytest.mark.parametrize("response,gold,reward", [
    ("<think>so \\boxed{6}</think> Final: \\boxed{5}", "5", 1.0),
    ("<think>so \\boxed{5}</think> Final: \\boxed{6}", "5", 0.0),
    ("<think>x = \\frac{1}{2}?</think> So $x = \\boxed{\\frac12}$.", "\\frac{1}{2}", 1.0),
    ("<think>\\boxed{\\frac12}", "\\frac{1}{2}", 0.0),
])
def test_math_answers_follow_the_block_too(response, gold, reward):
    assert verify("math", response, gold) == reward


def test_a_prompt_that_opens_the_block_starts_the_response_inside_it():
    # the response of an R1 distill starts thinking: without a close it has not answered
    assert verify("gsm8k", "12*3 = 36. The answer is 36.", "36", OPENED) == 0.0
    assert verify("gsm8k", "12*3 = 36.</think> The answer is 36.", "36", OPENED) == 1.0
    assert OPENED.split("still going") == ("still going", None)
    assert Reasoning().split("no block") == (None, "no block")


@pytest.mark.parametrize("prompt,opened", [
    ("<|im_start|>assistant\n<think>\n", True),  # Qwen3 thinking-2507, an R1 distill
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),  # Qwen3, enable_thinking=False
    ("<|im_start|>assistant\n", False),  # Qwen3 thinking: the model opens the block itself
    ("Think in <think> </think> tags.\nAssistant:", False),  # countdown's prompt names the tags
])
def test_which_prompts_open_the_block(prompt, opened):
    assert Reasoning.opens_in(prompt) is opened


def test_a_tokenizer_declares_its_own_tags():
    class Tokenizer:
        response_template = {"fields": {"thinking": {"open": "<reasoning>\n",
                                                     "close": ["</reasoning>"]}}}
    tags = declared_tags(Tokenizer())
    assert tags == ("<reasoning>", "</reasoning>")
    own = Reasoning(*tags)
    # its own tags split; <think> is then plain text, graded whole
    assert verify("gsm8k", "<reasoning>38</reasoning> The answer is 36.", "36", own) == 1.0
    assert verify("gsm8k", "<think>38</think> The answer is 36.", "36", own) == 0.0
    assert declared_tags(object()) == ("<think>", "</think>")


class Words:
    """A tokenizer whose tokens are the words of a text."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": text.split(" ")}

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(ids)


def test_the_thinking_ends_with_the_token_that_completes_the_last_close():
    tags = Reasoning()
    # "</" and "think>" are two tokens: the block ends with the second
    ids = ["a", "<think>b", "c</", "think>", "d</", "think>", " The", " answer"]
    assert tags.token_split("".join(ids), ids, "".join) == (6, False, 2)
    assert tags.token_split("no block", ["no", " block"], "".join) == (0, False, 2)
    assert tags.token_split("<think> on", ["<think>", " on"], "".join) == (2, True, 0)


def test_the_env_grades_after_the_block_and_counts_what_the_thinking_took():
    env = make_env("arithmetic", split="test")
    env.read_reasoning(OPENED, Words())
    gold = env.examples[0]["answer"]
    graded = env.score_all([f"one two three</think> The answer is {gold}.",
                            "one two three four five", f"The answer is {gold}."], [0, 0, 0])
    assert [reward for reward, _ in graded] == [1.0, 0.0, 0.0]
    # thinking 3, 5 and 4 words; two never closed; the first answer's 4 words, none after
    assert env.reward_metrics() == {"think/len_mean": 4.0, "think/unclosed_frac": 2 / 3,
                                    "think/answer_len_mean": 4 / 3}
    assert math.isnan(env.reward_metrics()["think/len_mean"])  # read once, then emptied
