"""The algorithm files, listed once, with their families and the helpers they hold as copies. The
tests, the benches, the docs' figures and the seeds' flag names read these lists, so that a new
file is added here and nowhere else; tests/test_docs.py checks that ALGORITHMS names every
algorithm file at the root."""

# grpo.py first, as the reading order has it (docs/reading.md), then its siblings; distill.py last,
# as its teacher is a run of another (bench/learning.py trains grpo.py's first)
ALGORITHMS = ("grpo", "ppo", "reinforce", "appo", "tppo", "online_dpo", "tools", "async_grpo",
              "dapo", "cispo", "sapo", "reinforce_stepwise", "sft", "distill")
# the files whose action is one line of an episode (a reasoning step), not a whole response, and
# whose envs run side by side (OpenR's)
STEPWISE = ("appo", "tppo")

# Each family's files were written from its first, and a reader learns one from the diff against
# it: `diff grpo.py dapo.py` is DAPO's recipe, `diff appo.py tppo.py` one value per token instead
# of one per step. The families' first files are read against grpo.py.
FAMILIES = {
    "grpo": ("grpo", "dapo", "cispo", "sapo", "tools", "async_grpo", "distill"),
    "ppo": ("ppo", "appo", "tppo"),
    "reinforce": ("reinforce", "reinforce_stepwise"),
    "online_dpo": ("online_dpo",),
    "sft": ("sft",),
}
SIBLINGS = (("grpo", "dapo"), ("grpo", "cispo"), ("grpo", "sapo"), ("grpo", "tools"),
            ("grpo", "async_grpo"), ("grpo", "distill"), ("grpo", "ppo"), ("grpo", "reinforce"),
            ("grpo", "online_dpo"), ("appo", "tppo"), ("reinforce", "reinforce_stepwise"))

# What several files hold as copies, each with the files that hold it; the first holds the text
# the others keep (tests/test_layers.py): a top-level function, `Args` (field by field: the fields
# two files both have keep one text, their defaults aside), or a region of main between two of its
# banners (`main[log-probs:logging]`). A copy may differ only in lines that say why: their comment
# starts with the file's tag (TAGS), and the tag takes its whole statement; it may leave out the
# first holder's variant lines (VARIANTS). One name may be held by two groups of files.
GRPO_FAMILY = ("grpo", "dapo", "cispo", "sapo", "tools", "async_grpo", "distill")
# the files whose only change to grpo.py is the surrogate (and its options): every part of
# grpo.py is theirs, tagged where it changes
SURROGATES = ("cispo", "sapo")
SHARED = (
    ("Args", ALGORITHMS),
    ("rollout", (*GRPO_FAMILY, "ppo", "online_dpo")),
    ("kl_penalised", ("grpo", "dapo", *SURROGATES, "tools", "async_grpo")),
    ("group_advantages", GRPO_FAMILY),
    ("loss_normaliser", (*GRPO_FAMILY, "ppo")),
    ("aggregate", (*GRPO_FAMILY, "ppo")),
    ("policy_loss", ("grpo", "dapo", *SURROGATES, "tools", "async_grpo", "ppo")),
    ("check_args", ("grpo", *SURROGATES)),
    ("main[:models]", ("grpo", "dapo", *SURROGATES, "tools", "async_grpo", "distill", "ppo",
                       "reinforce", "online_dpo")),
    ("main[models:rollout]", ("grpo", "dapo", *SURROGATES, "tools", "async_grpo", "distill",
                              "ppo", "reinforce", "online_dpo")),
    ("main[rollout:log-probs]", ("grpo", "dapo", *SURROGATES, "tools", "async_grpo", "distill",
                                 "ppo", "reinforce")),
    ("main[log-probs:logging]", ("grpo", "dapo", *SURROGATES, "tools", "async_grpo")),
    ("main[logging:]", ("grpo", "dapo", *SURROGATES, "tools", "async_grpo", "distill", "ppo",
                        "reinforce", "online_dpo")),
    ("check_args", ("appo", "tppo")),
    ("env_minibatches", ("appo", "tppo")),
    ("update_critic", ("appo", "tppo")),
    ("update_policy", ("appo", "tppo")),
    ("main", ("appo", "tppo")),
    *((name, ("reinforce", "reinforce_stepwise"))
      for name in ("check_args", "sequence_logprobs", "compute_baselines", "loss_normaliser",
                   "policy_loss", "main")),
)
# the comment that marks what a file changes in a copy: `# new to DAPO: ...`
TAGS = {"dapo": "new to DAPO", "cispo": "new to CISPO", "sapo": "new to SAPO",
        "tools": "new to tools", "async_grpo": "new to async", "distill": "new to distill",
        "reinforce_stepwise": "new to stepwise", "ppo": "new to PPO",
        "reinforce": "new to REINFORCE", "appo": "new to APPO", "tppo": "new to TPPO",
        "online_dpo": "new to online DPO", "sft": "new to SFT"}
# A line that only a variant of a file's own method needs starts its comment with the variant's
# name and a colon (docs/reading.md, "Variants"): GSPO's sequence ratio in grpo.py, IPO's loss in
# online_dpo.py
VARIANTS = ("GSPO", "IPO")
