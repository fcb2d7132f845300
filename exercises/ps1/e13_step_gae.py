"""PS1.13: step-level advantages across episodes (appo.py `compute_advantages`).

appo.py's envs play several steps per episode and start a new problem when one ends, so a segment
of T steps [E, T] may cross an episode boundary. dones[:, t] = 1 where an episode ended at step t;
next_values [E] is V of the observation after the segment. Backwards over t:

    delta_t = r_t + gamma * V_{t+1} * (1 - done_t) - V_t     (V_T = next_values)
    A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}
    returns = A + V

At an episode's end nothing comes back from the next step: that is a new problem.

Worked cases (the checker tries these first, and says the first one your function gets wrong):

- one env, 2 steps, the first ends an episode: r = [1, 0], V = [0, 0.5], V_next = 2, gamma = lam
  = 1  ->  ([[1, 1.5]], [[1, 2]])
- one env, one step that ends the episode: r = [1], V = [0.5], V_next = 2, gamma = lam = 1: nothing
  comes back from V_next  ->  ([[0.5]], [[1]])

Check: python -m exercises.check 1.13
"""
import torch  # noqa: F401


def step_advantages(rewards, values, next_values, dones, gamma, lam):
    """-> (advantages [E, T], returns [E, T])"""
    raise NotImplementedError("PS1.13: write step_advantages")
