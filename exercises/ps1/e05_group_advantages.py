"""PS1.5: GRPO's group advantages, and Dr.GRPO's (grpo.py `group_advantages`).

rewards holds N groups of G = group_size responses to the same prompt, one group after another
(rows 0..G-1 are group 0). Each response is scored against the others of its own group:

    A_i = (r_i - mean(group)) / (std(group) + 1e-4)     scale=True: GRPO
    A_i =  r_i - mean(group)                            scale=False: Dr.GRPO

std is the unbiased one (torch.std's default). A group whose rewards are all equal gets 0.

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- one group [1, 0, 0, 1]: mean 0.5, unbiased std 0.577  ->  [0.8659, -0.8659, -0.8659, 0.8659]
- two groups [1, 0 | 1, 1]: std 0.707 in the first; the second is all equal, so 0  ->  [0.707,
  -0.707, 0, 0]
- the same two groups, scale=False (Dr.GRPO): r - mean, not divided by the std  ->  [0.5, -0.5, 0,
  0]

Hint: the groups are consecutive rows; a shape that puts each group on a row of its own lets
every statistic be taken per group at once.
Check: python -m exercises.check 1.5
"""
import torch  # noqa: F401


def group_advantages(rewards, group_size, scale=True):
    """[N * G] rewards -> [N * G] advantages."""
    raise NotImplementedError("PS1.5: write group_advantages")
