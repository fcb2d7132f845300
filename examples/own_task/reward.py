"""Reward functions for the unit-conversion task in this folder (data.jsonl), written the way TRL's
GRPOTrainer takes them: each argument is a list with one entry per completion, the data row's own
fields come as keyword lists under their own names, and one float (or None) comes back per
completion.

    python grpo.py --dataset_path examples/own_task/data.jsonl \
        --question_key prompt_text --answer_key target \
        --reward_fn examples/own_task/reward.py:names_the_unit --reward_weights 1 0.5

The task's verifier (GSM8K's: "The answer is N.") still grades the number; these add what it does
not check. This file is your code: mathrl imports it and calls it in the training process.
"""

import re


def text_of(completion):
    """A completion is chat messages under --template chat, a string under --template plain."""
    return completion[-1]["content"] if isinstance(completion, list) else completion


def names_the_unit(completions, unit, **kwargs):
    """1.0 when the final answer names the unit the question asks for ("The answer is 1800
    cents."), 0.0 when it names none; None when there is no final answer at all, so that
    this function does not score it (the verifier's 0 already does)."""
    rewards = []
    for completion, wanted in zip(completions, unit):
        answers = re.findall(r"the answer is([^\n]*)", text_of(completion), re.IGNORECASE)
        if not answers:
            rewards.append(None)
        else:
            rewards.append(float(re.search(rf"\b{re.escape(wanted)}\b", answers[-1]) is not None))
    return rewards


def starts_with_capital(completions, **kwargs):
    """1.0 when the response begins with a capital letter, as a sentence does. A style reward, and
    the one a tiny random model can learn in a few updates (tests/test_own_task.py)."""
    return [float(text_of(c)[:1].isupper()) for c in completions]
