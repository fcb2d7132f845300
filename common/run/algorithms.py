"""The algorithm files, listed once. The tests, the benches and the seeds' flag names read this
list, so that a new file is added here and nowhere else; tests/test_docs.py checks that it names
every algorithm file at the root, and that the docs give its length when they count the files."""

# grpo.py first, as the reading order has it (docs/reading.md), then its siblings; distill.py last,
# as its teacher is a run of another (bench/learning.py trains grpo.py's first)
ALGORITHMS = ("grpo", "ppo", "reinforce", "appo", "tppo", "online_dpo", "tools", "async_grpo",
              "distill")
# the files whose action is one line of an episode (a reasoning step), not a whole response
STEPWISE = ("appo", "tppo")
