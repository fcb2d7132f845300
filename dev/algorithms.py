"""The algorithm files, listed once, with their families and the helpers they hold as copies. The
tests, the benches, the docs' figures and the seeds' flag names read these lists, so that a new
file is added here and nowhere else; tests/test_docs.py checks that ALGORITHMS names every
algorithm file at the root."""

# grpo.py first, as the reading order has it (docs/reading.md), then its siblings; distill.py last,
# as its teacher is a run of another (bench/learning.py trains grpo.py's first)
ALGORITHMS = ("grpo", "ppo", "reinforce", "appo", "tppo", "online_dpo", "tools", "async_grpo",
              "dapo", "reinforce_stepwise", "distill")
# the files whose action is one line of an episode (a reasoning step), not a whole response, and
# whose envs run side by side (OpenR's)
STEPWISE = ("appo", "tppo")

# Each family's files were written from its first, and a reader learns one from the diff against
# it: `diff grpo.py dapo.py` is DAPO's recipe, `diff appo.py tppo.py` one value per token instead
# of one per step. The families' first files are read against grpo.py.
FAMILIES = {
    "grpo": ("grpo", "dapo", "tools", "async_grpo", "distill"),
    "ppo": ("ppo", "appo", "tppo"),
    "reinforce": ("reinforce", "reinforce_stepwise"),
    "online_dpo": ("online_dpo",),
}
SIBLINGS = (("grpo", "dapo"), ("grpo", "tools"), ("grpo", "async_grpo"), ("grpo", "distill"),
            ("grpo", "ppo"), ("grpo", "reinforce"), ("grpo", "online_dpo"), ("appo", "tppo"),
            ("reinforce", "reinforce_stepwise"))

# The helpers that several files hold as copies, each with the files that hold it; the first
# holds the text the others keep (tests/test_layers.py). A copy may differ only in lines that say
# why: their comment starts with the file's tag (TAGS), and the tag takes its whole statement. One
# name may be held by two groups of files (each family's check_args).
GRPO_FAMILY = ("grpo", "dapo", "tools", "async_grpo", "distill")
SHARED = (
    ("rollout", (*GRPO_FAMILY, "ppo", "online_dpo")),
    ("kl_penalised", ("grpo", "dapo", "tools", "async_grpo")),
    ("group_advantages", GRPO_FAMILY),
    ("loss_normaliser", (*GRPO_FAMILY, "ppo")),
    ("aggregate", (*GRPO_FAMILY, "ppo")),
    ("check_args", ("appo", "tppo")),
    ("env_minibatches", ("appo", "tppo")),
    ("update_critic", ("appo", "tppo")),
    *((name, ("reinforce", "reinforce_stepwise"))
      for name in ("check_args", "sequence_logprobs", "compute_baselines", "loss_normaliser",
                   "policy_loss")),
)
# the comment that marks what a file changes in a shared helper: `# tools: ...`
TAGS = {"dapo": "new to DAPO", "tools": "tools", "async_grpo": "off-policy", "distill": "distill",
        "reinforce_stepwise": "stepwise"}
