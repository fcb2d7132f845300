"""PS3's loose verifier (`python -m exercises.labs loose`): it pays a response that writes the gold
answer anywhere, as loose verifiers of the wild do ("is the answer in the text?"). It is wrong on
purpose. A response that writes "63 - 15 = 48, or maybe 58. The answer is 58." is paid 1.0, where
the project's verifier (common/env/answers.py) reads only the final answer and refuses a hedge.
"""

import re


def contains_answer(completions, answer, **kwargs):
    """1.0 for each completion whose text holds the gold answer as a whole number, else 0.0."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    # a whole number: no digit, and no decimal point with a digit, on either side ("48." ends a
    # sentence; "4.8" and "148" are other numbers)
    return [1.0 if re.search(rf"(?<!\d)(?<!\d\.){re.escape(str(gold).strip())}(?!\d|\.\d)", text)
            else 0.0 for text, gold in zip(texts, answer)]
