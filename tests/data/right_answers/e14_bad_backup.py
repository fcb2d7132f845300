"""A right answer to PS1.14, written as a student would: for the grading mode's tests."""
import torch


def bad_advantages(rewards, values, response_mask, next_values, dones, gamma, lam):
    """-> (advantages [E, T, R], returns [E, T, R])"""
    E, T, R = values.shape
    mask = response_mask.to(values.dtype)
    advantages = torch.zeros_like(values)
    for e in range(E):
        a_after = 0.0  # advantage of the next real token
        v_next = float(next_values[e])  # V of the next step's first token
        for t in range(T - 1, -1, -1):
            real = [j for j in range(R) if mask[e, t, j] > 0]
            last = real[-1] if real else -1
            not_done = 1.0 - float(dones[e, t])
            for j in range(R - 1, -1, -1):
                if mask[e, t, j] == 0:
                    continue  # padding: 0, and a_after passes through
                v = float(values[e, t, j])
                if j == last:
                    delta = float(rewards[e, t]) + gamma * v_next * not_done - v
                    a = delta + gamma * lam * not_done * a_after
                else:
                    delta = float(values[e, t, j + 1]) - v
                    a = delta + lam * a_after
                advantages[e, t, j] = a
                a_after = a
            v_next = float(values[e, t, 0])
    returns = (advantages + values) * mask
    return advantages, returns
