"""The speedups of the sampler and of the training forward: each gives the plain path's tokens and
log-probs (within float rounding) faster, and each is checked against it alone and all together
(tests/test_fast_sampler.py, tests/test_logprobs.py). decoding.py switches the sampler's on
(`fast_decoding`); logprobs.py is `token_logprobs`' fast form. The rest hold one speedup each."""
