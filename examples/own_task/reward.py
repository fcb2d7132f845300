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


def names_the_unit(completions, target, unit, **kwargs):
    """A bonus for a right answer that names its unit ("The answer is 1800 cents."): 1.0 with the
    unit, 0.0 without. A wrong or missing answer gets None: this function leaves it unscored, so
    in a group where no answer is right the bonus adds nothing for GRPO to chase, and a policy
    cannot earn it by naming units next to wrong numbers."""
    rewards = []
    for completion, gold, wanted in zip(completions, target, unit):
        answers = re.findall(r"the answer is:?\s*\$?(-?[\d,]*\.?\d+)([^\n]*)", text_of(completion),
                             re.IGNORECASE)
        if not answers or float(answers[-1][0].replace(",", "")) != float(gold):
            rewards.append(None)
        else:
            rewards.append(float(re.search(rf"\b{re.escape(wanted)}\b", answers[-1][1]) is not None))
    return rewards


def starts_with_capital(completions, **kwargs):
    """1.0 when the response begins with a capital letter, as a sentence does. A style reward, and
    the one a tiny random model can learn in a few updates (tests/test_own_task.py)."""
    return [float(text_of(c)[:1].isupper()) for c in completions]
