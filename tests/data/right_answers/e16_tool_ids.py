"""A right answer to PS1.16, written as a student would: for the grading mode's tests."""
import torch


def training_ids(said, answers, budget):
    """said: [turns] lists of ids, answers: [turns - 1] lists of ids, budget: an int ->
    (ids [L] int64, tool_mask [L] int64), L <= budget."""
    ids = []
    tool_mask = []
    for k in range(len(said)):
        room = budget - len(ids)
        turn = list(said[k])[:room]
        ids += turn
        tool_mask += [1] * len(turn)
        if len(turn) < len(said[k]) or k >= len(answers):
            break  # cut by the budget, or the last turn
        room = budget - len(ids)
        answer = list(answers[k])[:room]
        ids += answer
        tool_mask += [0] * len(answer)
        if len(ids) >= budget:
            break
    return torch.tensor(ids, dtype=torch.long), torch.tensor(tool_mask, dtype=torch.long)
