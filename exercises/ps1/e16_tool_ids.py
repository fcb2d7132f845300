"""PS1.16: the training ids and the tool mask of a response with tool calls (tools.py `play`).

A response is sampled in turns: the model writes until it closes a call, the tool's answer goes in
after the call as token ids, and the model writes again from the whole context. said[k] holds the
ids the model sampled at turn k; answers[k] the ids of the tool's answer to the call that closed
turn k (one answer per turn but the last). The training ids are exactly these ids, in order,

    ids       = said[0] + answers[0] + said[1] + answers[1] + ... + said[-1]
    tool_mask = [1] * len(said[0]) + [0] * len(answers[0]) + [1] * len(said[1]) + ...

never the transcript decoded and tokenised again. The tool's ids stay in the sequence (the model
reads them) with mask 0 (the model did not pick them, so their log-probs must not move). The
budget counts every id, the model's and the tools': a turn or an answer that would run past it is
cut there, and the response ends when it is full.

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- said [[5, 6], [7, 8]], answers [[90, 91]], budget 10  ->  ([5, 6, 90, 91, 7, 8], [1, 1, 0, 0,
  1, 1])
- the same in a budget of 3: the answer is cut after one id  ->  ([5, 6, 90], [1, 1, 0])

Hint: build two Python lists side by side and keep track of the room left in the budget.
Check: python -m exercises.check 1.16
"""
import torch  # noqa: F401


def training_ids(said, answers, budget):
    """said: [turns] lists of ids, answers: [turns - 1] lists of ids, budget: an int ->
    (ids [L] int64, tool_mask [L] int64), L <= budget."""
    raise NotImplementedError("PS1.16: write training_ids")
