"""A right answer to PS1.20, written as a student would: for the grading mode's tests."""
import torch


def overlong_penalty(lengths, max_new_tokens, buffer_len, factor):
    """lengths [N] (int64, tokens of each response) -> [N] float penalties."""
    if buffer_len == 0:
        return torch.zeros(lengths.shape, dtype=torch.float32)
    start = max_new_tokens - buffer_len
    into_buffer = torch.clamp(lengths - start, min=0).float()
    return -factor * into_buffer / buffer_len
