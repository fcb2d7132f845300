"""PS1.5: GRPO's group advantages, and Dr.GRPO's (grpo.py `group_advantages`).

rewards holds N groups of G = group_size responses to the same prompt, one group after another
(rows 0..G-1 are group 0). Each response is scored against the others of its own group:

    A_i = (r_i - mean(group)) / (std(group) + 1e-4)     scale=True: GRPO
    A_i =  r_i - mean(group)                            scale=False: Dr.GRPO

std is the unbiased one (torch.std's default). A group whose rewards are all equal gets 0.

Hint: view the rewards as [N, G] and take statistics along dim=1.
Check: python -m exercises.check 1.5
"""
import torch  # noqa: F401


def group_advantages(rewards, group_size, scale=True):
    """[N * G] rewards -> [N * G] advantages."""
    raise NotImplementedError("PS1.5: write group_advantages")
