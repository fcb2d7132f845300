"""The seeds' command lines: each flag name that OpenR, oat, navidmdn/LLM_RL or TRL use for an
option of this project is an alias of that option, never a second field (docs/README.md,
"Vocabulary"). `common.run.args.parse_args` hands a command line here, to `translate`, only when a
flag in it is not the file's own:

    --ppo_epoch 1       ->  --num_ppo_epochs 1, and says "--ppo_epoch is OpenR's name for ..."
    --collocate         ->  nothing, and says what this project does instead
    --rollout_batch_size 64 --num_samples 8 --train_batch_size 64
                        ->  --num_prompts 64 --num_generations 8 --num_mini_batches 8 (arithmetic)
    --kl_coeficient 0.1 ->  an error that names the closest option (--kl_coef)

A flag that is a plain rename is an `Alias` with `to`; one with no use here has a `note`; the rest
(batch sizes and flags that set several options) are read by `apply_rules`.
"""

import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from common.errors import PathError, UsageError

OAT_FILES = ("ppo", "grpo", "online_dpo")  # oat runs PPO, GRPO and online DPO
# LLM_RL's REINFORCE: its stepwise policy, and the same algorithm on whole responses
LLM_RL_FILES = ("reinforce", "reinforce_stepwise")
STEPWISE = ("appo", "tppo")  # OpenR's files: one action is one reasoning step
# the files a flag is read by, when it is not a list of them
EVERY, SINGLE_TURN = "every file", "every file but appo.py and tppo.py"
OPENR, OAT, LLM_RL = "OpenR's", "oat's", "LLM_RL's"
TRL_GRPO, TRL_PPO, TRL_RLOO = "TRL GRPOConfig's", "TRL PPOConfig's", "TRL RLOOConfig's"
TRL_ODPO = "TRL OnlineDPOConfig's"
TRL = "TRL's"


@dataclass
class Alias:
    """A seed's flag. `to`: the option it renames (its value converted by `convert`); `note`: a flag
    with no use here, accepted with one line that says what this project does instead; neither: a
    value read by one of the batch rules below. `switch`: the flag takes no value."""

    name: str
    source: str
    files: tuple
    to: Optional[str] = None
    note: Optional[str] = None
    switch: bool = False
    convert: Optional[object] = None
    many: bool = False  # takes a list of values


def _infra(name, source, note, files=EVERY, switch=False):
    return Alias(name, source, files, note=note, switch=switch)


NO_VLLM = "generation runs in the training process with the HF model and a KV cache (no vLLM)"
ACCELERATE = "launch with torchrun --nproc_per_node N; each rank holds the model (DDP-style)"
ALIASES = [
    # OpenR train/mat (train_math.py, config.py)
    Alias("ppo_epoch", OPENR, STEPWISE, to="num_ppo_epochs"),
    Alias("num_mini_batch", OPENR, STEPWISE + ("ppo",), to="num_mini_batches"),
    Alias("n_rollout_threads", OPENR, STEPWISE, to="num_envs"),
    Alias("episode_length", OPENR, STEPWISE, to="num_steps"),
    Alias("lr", OPENR, STEPWISE, to="learning_rate"),
    Alias("critic_lr", OPENR, STEPWISE, to="critic_learning_rate"),
    Alias("value_loss_coef", OPENR, STEPWISE, to="vf_coef"),
    Alias("hidden_size", OPENR, STEPWISE, to="critic_hidden_size"),
    Alias("layer_N", OPENR, STEPWISE, to="critic_num_layers"),
    Alias("clip_param", OPENR, STEPWISE),  # -> epsilon and cliprange_value (rule below)
    Alias("algorithm_name", OPENR, STEPWISE),  # must name this file (rule below)
    Alias("num_env_steps", OPENR, STEPWISE),  # -> max_steps (rule below)
    Alias("experiment_name", OPENR, STEPWISE),  # -> output_dir (rule below)
    Alias("prm_type", OPENR, STEPWISE),  # -> the PRM's step tag and candidate tokens (rule below)
    Alias("prm_checkpoint_path", OPENR, STEPWISE),  # a PRM LoRA adapter (rule below)
    _infra("use_recurrent_policy", OPENR, "a transformer already reads the whole history: no RNN",
           STEPWISE, switch=True),
    _infra("gradient_cp_steps", OPENR,
           "micro-batches of --micro_batch_size rows accumulate gradients",
           STEPWISE),
    _infra("vacab_size", OPENR, "the vocabulary is the tokenizer's", STEPWISE),
    _infra("n_training_threads", OPENR, "torch picks the CPU threads", STEPWISE),
    _infra("cuda", OPENR, "CUDA is used when available", STEPWISE, switch=True),
    _infra("use_wandb", OPENR, "--track logs to wandb (OpenR's flag is unused there)", STEPWISE,
           switch=True),
    # oat (oat/args.py, oat/algorithms/ppo.py)
    Alias("pretrain", OAT, OAT_FILES, to="model_name_or_path"),
    Alias("num_samples", OAT, OAT_FILES, to="num_generations"),
    Alias("generate_max_length", OAT, OAT_FILES, to="max_new_tokens"),
    Alias("input_key", OAT, OAT_FILES, to="question_key"),
    Alias("output_key", OAT, OAT_FILES, to="answer_key"),
    Alias("max_eval", OAT, OAT_FILES, to="num_eval_problems"),
    Alias("eval_steps", OAT + " / " + TRL, (*OAT_FILES, *LLM_RL_FILES), to="eval_interval"),
    Alias("max_norm", OAT, OAT_FILES, to="max_grad_norm"),
    Alias("save_path", OAT + " / " + LLM_RL, (*OAT_FILES, *LLM_RL_FILES), to="output_dir"),
    Alias("save_steps", OAT + " / " + TRL, (*OAT_FILES, *LLM_RL_FILES), to="save_interval"),
    Alias("lam", OAT + " / " + TRL_PPO, ("ppo",), to="gae_lambda"),
    Alias("cliprange", OAT + " / " + TRL_PPO, ("ppo",), to="epsilon"),
    Alias("num_prompt_epoch", OAT, OAT_FILES, to="num_train_epochs"),
    Alias("lr_warmup_ratio", OAT, OAT_FILES, to="warmup_ratio"),
    Alias("prompt_data", OAT, OAT_FILES),  # -> dataset_path, and eval data (rule below)
    Alias("eval_data", OAT, OAT_FILES, to="eval_dataset_path"),
    Alias("oracle", OAT, OAT_FILES),  # -> dataset_name (rule below)
    # grpo.py has no critic (rule below); ppo.py has its own flag
    Alias("critic_type", OAT, ("grpo",)),
    # KL in the reward (rule below, with oat's --beta)
    Alias("kl_penalty_coef", OAT, ("ppo", "grpo")),
    Alias("non_stop_penalty", OAT, ("grpo",)),  # grpo.py has none (rule below)
    # -> template chat (rule below)
    Alias("apply_chat_template", OAT, ("ppo", "grpo"), switch=True),
    Alias("rollout_batch_size", OAT, ("ppo", "grpo")),  # batch rule
    Alias("train_batch_size", OAT, ("ppo", "grpo")),  # batch rule
    Alias("train_batch_size_per_device", OAT, OAT_FILES, to="micro_batch_size"),
    _infra("rollout_batch_size_per_device", OAT, "per-rank sizes follow from --num_prompts and the "
           "number of processes", OAT_FILES),
    _infra("pi_buffer_maxlen_per_device", OAT, "each update uses exactly the rollout it sampled",
           OAT_FILES),
    _infra("oracle_type", OAT, "rewards come from the task's verifier", OAT_FILES),
    _infra("gpus", OAT, ACCELERATE, OAT_FILES),
    _infra("vllm_gpu_ratio", OAT, NO_VLLM, OAT_FILES),
    _infra("collocate", OAT, "one process samples and learns: nothing to collocate",
           OAT_FILES,
           switch=True),
    _infra("vllm_sleep", OAT, NO_VLLM, OAT_FILES, switch=True),
    _infra("ref_offload", OAT, "the reference stays on the device; --beta 0 loads none",
           OAT_FILES, switch=True),
    _infra("zero_stage", OAT, ACCELERATE, OAT_FILES),
    _infra("flash_attn", OAT, "attention is the model's default implementation", OAT_FILES,
           switch=True),
    _infra("adam_offload", OAT, "the optimizer state stays on the device", OAT_FILES,
           switch=True),
    _infra("prompt_max_length", OAT, "prompts are never cut", OAT_FILES),
    # oat's --eval_temperature is this project's option of that name
    Alias("eval_n", OAT, OAT_FILES, to="eval_samples"),
    _infra("use_wb", OAT, "--track logs to wandb", OAT_FILES, switch=True),
    _infra("wb_run_name", OAT, "the wandb run is named after --output_dir", OAT_FILES),
    # navidmdn/LLM_RL (examples/reinforce_stable_on_gsm8k_training.py)
    Alias("n_few_shot_examples", LLM_RL, LLM_RL_FILES, to="num_few_shot"),
    Alias("num_iterations", LLM_RL, LLM_RL_FILES, to="max_steps"),
    Alias("kl_coeff", LLM_RL, LLM_RL_FILES, to="beta"),
    Alias("update_ref_iterations", LLM_RL, LLM_RL_FILES, to="ref_model_sync_steps"),
    Alias("evaluation_at_start", LLM_RL, LLM_RL_FILES, to="eval_on_start", switch=True),
    Alias("evaluation_iterations", LLM_RL, LLM_RL_FILES, to="eval_interval"),
    Alias("n_eval_steps", LLM_RL, LLM_RL_FILES, to="num_eval_problems"),
    Alias("n_save_iterations", LLM_RL, LLM_RL_FILES, to="save_interval"),
    Alias("gsm8k_path", LLM_RL, LLM_RL_FILES),  # -> dataset_path, and the gsm8k task (rule below)
    Alias("test_gsm8k_path", LLM_RL, LLM_RL_FILES, to="eval_dataset_path"),
    Alias("max_trajectory_steps", LLM_RL, ("reinforce_stepwise",), to="max_episode_steps"),
    Alias("num_collection_episodes", LLM_RL, LLM_RL_FILES),  # -> num_prompts (rule below)
    Alias("sys_prompt_path", LLM_RL, LLM_RL_FILES),  # -> system_prompt, read from the file (rule)
    Alias("ref_model_name", LLM_RL, LLM_RL_FILES),  # must be the policy's start (rule below)
    _infra("num_update_steps", LLM_RL,
           "no replay buffer: each rollout batch is one on-policy update "
           "(the REINFORCE gradient is unbiased only on-policy)", LLM_RL_FILES),
    _infra("gradient_accumulation_steps", LLM_RL,
           "no replay buffer: each rollout batch is one on-policy "
           "update, accumulated over micro-batches of --micro_batch_size", LLM_RL_FILES),
    _infra("cache_buffer", LLM_RL, "no replay buffer to cache", LLM_RL_FILES, switch=True),
    _infra("buffer_cache_path", LLM_RL, "no replay buffer to cache", LLM_RL_FILES),
    _infra("buffer_size", LLM_RL, "no replay buffer", LLM_RL_FILES),
    _infra("load_buffer_from_cache_at_start", LLM_RL, "no replay buffer", LLM_RL_FILES,
           switch=True),
    _infra("train_data_file", LLM_RL, "few-shot examples come from data/few_shot_<task>.jsonl",
           LLM_RL_FILES),
    _infra("cache_dir", LLM_RL, "models are cached where HF_HOME says", LLM_RL_FILES),
    _infra("stepwise_eval", LLM_RL, "reinforce_stepwise.py evaluates stepwise episodes",
           LLM_RL_FILES, switch=True),
    # TRL (GRPOConfig, PPOConfig, RLOOConfig, ScriptArguments, TrainingArguments)
    Alias("num_iterations", TRL_GRPO, ("grpo",), to="num_ppo_epochs"),
    Alias("steps_per_generation", TRL_GRPO, ("grpo",)),  # batch rule
    Alias("max_completion_length", TRL, ("grpo", "reinforce"), to="max_new_tokens"),
    Alias("response_length", TRL_PPO, ("ppo",), to="max_new_tokens"),
    Alias("kl_coef", TRL_PPO, ("ppo", "reinforce"), to="beta"),
    Alias("rloo_k", TRL_RLOO, ("reinforce",), to="num_generations"),
    Alias("non_stop_penalty", OAT, ("ppo",), to="missing_eos_penalty",
          convert=lambda v: str(-float(v))),  # oat adds it: a penalty is negative there
    Alias("lr_scheduler_type", TRL, EVERY, to="lr_scheduler"),
    Alias("sft_model_path", TRL_PPO, ("ppo",)),  # the policy TRL's PPO trains (rule below)
    Alias("per_device_train_batch_size", TRL, SINGLE_TURN),  # batch rule
    Alias("gradient_accumulation_steps", TRL, ("grpo", "ppo", "online_dpo")),  # batch rule
    Alias("total_episodes", TRL_PPO, ("ppo", "grpo", "reinforce")),  # -> max_steps (batch rule)
    Alias("report_to", TRL, SINGLE_TURN, many=True),  # -> --track (rule below)
    Alias("reward_funcs", TRL, ("grpo", "reinforce", "online_dpo"), many=True),  # rule below
    Alias("scale_rewards", TRL_GRPO, ("grpo",)),  # rule below
    # TRL OnlineDPOConfig and oat's online DPO (oat/args.py: --dap-algo, --reward-oracle)
    Alias("dap_algo", OAT, ("online_dpo",)),  # -> preference_loss (rule below)
    _infra("reward_oracle", OAT, "the judge is the task's verifier", ("online_dpo",)),
    _infra("sync_params_every", OAT, "one process samples and learns: the sampler is the policy",
           ("online_dpo",)),
    # TRL's DPO picks its loss with loss_type, which here names grpo.py's and ppo.py's aggregation
    Alias("loss_type", TRL_ODPO, ("online_dpo",), to="preference_loss"),
    _infra("judge", TRL_ODPO, "the judge is the task's verifier", ("online_dpo",)),
    _infra("max_length", TRL_ODPO, "prompts and responses are never cut", ("online_dpo",)),
    _infra("disable_dropout", TRL_ODPO, "dropout is the model's own (0 in Llama and Qwen configs)",
           ("online_dpo",), switch=True),
    _infra("reward_model_path", TRL_PPO, "rewards come from the task's verifier: no reward model",
           (*OAT_FILES, *LLM_RL_FILES)),
    _infra("use_vllm", TRL, NO_VLLM, ("grpo", "reinforce", "online_dpo"), switch=True),
    _infra("vllm_mode", TRL, NO_VLLM, ("grpo", "reinforce", "online_dpo")),
    _infra("vllm_gpu_memory_utilization", TRL, NO_VLLM, ("grpo", "reinforce", "online_dpo")),
    _infra("log_completions", TRL,
           "decoded samples go to samples.jsonl every --log_interval updates",
           ("grpo", "reinforce", "online_dpo"), switch=True),
    _infra("logging_steps", TRL, "metrics.jsonl gets a line every update",
           SINGLE_TURN),
    _infra("push_to_hub", TRL, "checkpoints are save_pretrained folders; upload one with "
           "`huggingface-cli upload`", SINGLE_TURN, switch=True),
    _infra("dataset_train_split", TRL,
           "the task's train split (a --dataset_path file is the split)",
           SINGLE_TURN),
    _infra("dataset_test_split", TRL, "the task's test split, or --eval_dataset_path",
           SINGLE_TURN),
    _infra("local_rollout_forward_batch_size", TRL_PPO,
           "no-grad forwards use --micro_batch_size rows",
           ("ppo",)),
    _infra("stop_token", TRL_PPO, "responses end at the tokenizer's EOS", ("ppo",)),
    _infra("max_prompt_length", TRL, "prompts are never cut", ("grpo", "ppo", "reinforce")),
    _infra("deepspeed", TRL, ACCELERATE, SINGLE_TURN),
    # eval.py's own earlier names
    Alias("num_samples", "eval.py's earlier", ("eval",), to="num_generations"),
    Alias("num_problems", "eval.py's earlier", ("eval",), to="num_eval_problems"),
]


# ------------------------------------------------------------------------------------------------
# A command line in the seeds' dialect -> this project's
# ------------------------------------------------------------------------------------------------
BOOL_WORDS = {"true", "false", "yes", "no", "1", "0", "t", "f", "y", "n"}


def translate(algo, argv, parser):
    """The command line `argv` of `algo`.py, with seeds' flags in it, -> (this project's argv,
    {option: value} of every option as the rules leave them, the lines to print: one for each
    flag translated). parser: the file's HfArgumentParser. A flag that is neither the file's own
    nor a seed's is refused with the closest option."""
    options = parser._option_string_actions
    table = aliases_for(algo)
    lines = []

    def say(text):
        lines.append(text)

    native, seed, given_as, from_seed, i = [], {}, {}, set(), 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token in ("-h", "--help") or not token.startswith("--"):
            native.append(token)
            continue
        name, value = token[2:].split("=", 1) if "=" in token else (token[2:], None)
        name = name.replace("-", "_")
        action = options.get(f"--{name}")
        alias = table.get(name) if action is None else None
        if action is None and alias is None:
            raise SystemExit(_unknown(name, options, table, algo))
        if action is not None:
            nargs = action.nargs
        else:
            nargs = 0 if alias.switch else "+" if alias.many else None
        takes = {0: "none", "?": "optional", "+": "list", "*": "list"}.get(nargs, "one")
        values = [] if value is None else [value]
        if value is None and takes == "one" and i < len(argv):
            values, i = [argv[i]], i + 1
        elif (value is None and takes == "optional" and i < len(argv)
              and argv[i].lower() in BOOL_WORDS):
            values, i = [argv[i]], i + 1
        elif value is None and takes == "list":
            while i < len(argv) and not argv[i].startswith("--"):
                values.append(argv[i])
                i += 1
        if action is not None:
            native += [f"--{name}", *values]
            given_as[action.dest] = given_as.get(action.dest, []) + [(f"--{name}", values)]
        elif alias.to is not None:
            converted = [alias.convert(v) for v in values] if alias.convert else values
            say(f"--{name} is {alias.source} name for --{alias.to}")
            from_seed.add(len(native))
            native += [f"--{alias.to}", *converted]
            given_as[alias.to] = given_as.get(alias.to, []) + [(f"--{name}", converted)]
        elif alias.note is not None:
            say(f"--{name}: {alias.note}")
        else:
            seed[name] = " ".join(values) if values else "true"
    for dest, uses in given_as.items():  # two names of one option, with different values
        if len({tuple(v) for _, v in uses}) < 2:
            continue
        own = [name for name, _ in uses if name == f"--{dest}"]
        if not own:  # two seeds' names
            raise SystemExit(f"{' and '.join(sorted({n for n, _ in uses}))} name the same option "
                             f"(--{dest}) with different values: pass one of them.")
        # this project's own name wins over a seed's, as a later flag would (e.g. --max_steps 1 for
        # a test)
        seed_names = sorted({n for n, _ in uses if n != own[0]})
        if seed_names:
            say(f"{own[0]} given: it wins over {', '.join(seed_names)}")
        native = _drop_seed_values(native, dest, options, from_seed)
    args = parser.parse_args_into_dataclasses(args=native)[0]
    given = {options[t].dest for t in native if t in options}
    values = apply_rules(algo, args, seed, given, say, int(os.environ.get("WORLD_SIZE", 1)))
    return native, values, lines


def _drop_seed_values(native, dest, options, from_seed):
    """The argv without the values of option `dest` that came from a seed's name (at from_seed)."""
    out, k = [], 0
    while k < len(native):
        if k in from_seed and options[native[k]].dest == dest:
            k += 1
            while k < len(native) and not native[k].startswith("--"):
                k += 1
            continue
        out.append(native[k])
        k += 1
    return out


# Options that left a file for the file of their recipe: (file, option) -> where it went
STEPWISE_NOW = "LLM_RL's stepwise policy is reinforce_stepwise.py now: run that file"
TIS_NOW = ("truncated importance sampling is async_grpo.py's: async_grpo.py --max_staleness 0 "
           "--off_policy_correction tis --is_cap C trains grpo.py with it")
MOVED = {**{("reinforce", name): STEPWISE_NOW
            for name in ("stepwise", "sym_calc", "max_episode_steps", "gamma")},
         ("reinforce", "tis_cap"): TIS_NOW, ("ppo", "tis_cap"): TIS_NOW}


def _unknown(name, options, table, algo):
    if (algo, name) in MOVED:
        return f"{algo}.py: --{name}: {MOVED[algo, name]}."
    known = sorted({o[2:] for o in options if o.startswith("--")} | set(table))
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    elsewhere = sorted({a.source for a in ALIASES if a.name == name})
    where = f" ({', '.join(elsewhere)} flag, not used by {algo}.py)" if elsewhere else ""
    fix = f"the closest option is --{close[0]}" if close else f"see python {algo}.py --help"
    return f"{algo}.py: --{name} is not an option here{where}; {fix}."


def aliases_for(algo):
    """{flag name: Alias} of one file."""
    return {a.name: a for a in ALIASES if reads(a.files, algo)}


def reads(files, algo):
    """Whether `algo`.py reads a flag that `files` name: a tuple of files, EVERY or SINGLE_TURN."""
    if files == EVERY or files == SINGLE_TURN:
        return files == EVERY or algo not in STEPWISE
    return algo in files


# ------------------------------------------------------------------------------------------------
# Rules that read several seed flags at once (batch sizes) or need the parsed options
# ------------------------------------------------------------------------------------------------
def apply_rules(algo, args, seed, given, say, world_size):
    """Translate the seed flags in `seed` ({name: value text}) that need more than a rename.
    `given`: the options on the command line; an explicit option wins over a value computed from
    seed flags. -> {option: value} of every option, as the rules leave them (parse_args makes the
    final args of it: nothing here writes to `args`)."""
    now = dict(vars(args))

    def put(name, value, why):
        if name in given and now[name] != value:
            say(f"{why} would set --{name} {value}; keeping the explicit --{name} {now[name]}")
        else:
            now[name] = value
            say(f"{why}: --{name} {value}")

    if "clip_param" in seed:  # OpenR clips the ratio and the value change with one number
        for name in ("epsilon", "cliprange_value"):
            put(name, float(seed["clip_param"]),
                f"--clip_param is {OPENR} clip of the ratio and the value")
    if "algorithm_name" in seed and seed["algorithm_name"].lower() != algo:
        other = {"appo": "appo.py", "tppo": "tppo.py"}.get(seed["algorithm_name"].lower())
        fix = (f"run {other}" if other else "OpenR's 'GRPO' (per-step PRM rewards standardised "
               "over the buffer) is not here; grpo.py is group-relative GRPO")
        raise UsageError(f"--algorithm_name {seed['algorithm_name']}: this file is {algo.upper()}; "
                         f"{fix}.")
    if "algorithm_name" in seed:
        say(f"--algorithm_name {seed['algorithm_name']}: {OPENR} algorithm switch; this file is it")
    if "experiment_name" in seed:
        put("output_dir", f"runs/{algo}/{seed['experiment_name']}",
            f"--experiment_name is {OPENR} run name")
    if "prm_type" in seed:
        tags = {"MS": ("ки", "+", "-"),
                "QWEN": ("\n\n\n\n\n", " +", " -")}.get(seed["prm_type"].upper())
        if tags is None:
            raise UsageError(f"--prm_type {seed['prm_type']}: OpenR's PRM types are MS and Qwen.")
        for name, value in zip(("prm_step_tag", "prm_good_token", "prm_bad_token"), tags):
            put(name, value, f"--prm_type {seed['prm_type']} ({OPENR} PRM kind)")
    if "prm_checkpoint_path" in seed:
        if seed.get("prm_type", "MS").upper() != "MS":
            raise UsageError("--prm_checkpoint_path: a LoRA adapter on the PRM is not loaded here; "
                             "merge it "
                             "(peft's merge_and_unload) and pass the merged folder as "
                             "--prm_model_name_or_path.")
        say("--prm_checkpoint_path: OpenR's MS PRM does not read it either; ignored")
    if "num_env_steps" in seed:
        updates = int(float(seed["num_env_steps"])) // (now["num_steps"] * now["num_envs"])
        if updates < 1:
            raise UsageError(f"--num_env_steps {seed['num_env_steps']} is less than one update of "
                             "num_steps x "
                             f"num_envs = {now['num_steps'] * now['num_envs']} env steps.")
        put("max_steps", updates,
            f"--num_env_steps {seed['num_env_steps']} ({OPENR} budget in env steps)")
    # oat
    if "prompt_data" in seed:
        put("dataset_path", seed["prompt_data"], f"--prompt_data is {OAT} training data")
        if "eval_data" not in seed and "eval_dataset_path" not in given:
            put("eval_dataset_path", seed["prompt_data"],
                f"{OAT} --eval_data defaults to --prompt_data")
    if "oracle" in seed:
        put("dataset_name", seed["oracle"].lower(), f"--oracle is {OAT} grader: the task")
    if "apply_chat_template" in seed:
        put("template", "chat", f"--apply_chat_template ({OAT})")
    if "critic_type" in seed:
        kind = seed["critic_type"].lower()
        if kind == "ppo":
            raise UsageError(f"--critic_type ppo is {OAT} PPO with a critic: run ppo.py.")
        if kind == "drgrpo":
            put("loss_type", "dr_grpo", f"--critic_type drgrpo ({OAT} Dr.GRPO)")
        else:
            say(f"--critic_type {kind}: {OAT} name for this file's algorithm")
    if "non_stop_penalty" in seed and float(seed["non_stop_penalty"]) != 0:
        raise UsageError(f"--non_stop_penalty {seed['non_stop_penalty']}: grpo.py rewards the "
                         "verifier only; "
                         f"ppo.py has --missing_eos_penalty.")
    if "non_stop_penalty" in seed:
        say("--non_stop_penalty 0: no penalty, as grpo.py has none")
    # oat has two KL knobs: in the reward (k1) and, with --beta, in the loss (k3)
    if "kl_penalty_coef" in seed:
        reward_kl, loss_kl = float(seed["kl_penalty_coef"]), now["beta"] if "beta" in given else 0.0
        if reward_kl and loss_kl:
            raise UsageError(f"--kl_penalty_coef {reward_kl} and --beta {loss_kl}: {OAT} two KL "
                             "terms at once; "
                             "here the KL sits in one place, pass one of them (--kl_penalty "
                             "reward|loss).")
        if reward_kl:
            put("beta", reward_kl, f"--kl_penalty_coef is {OAT} KL-in-the-reward weight")
            put("kl_penalty", "reward", "  and its placement")
            put("kl_estimator", "k1", "  and its estimator")
        elif loss_kl:  # with neither, no reference loads, and its options would change nothing
            put("kl_penalty", "loss",
                f"with --kl_penalty_coef 0, {OAT} --beta {loss_kl} is a KL loss")
            put("kl_estimator", "k3", "  and its estimator")
    # oat: prompts per rollout, samples per step
    if "rollout_batch_size" in seed or "train_batch_size" in seed:
        prompts = int(seed.get("rollout_batch_size", 128))
        put("num_prompts", prompts, f"--rollout_batch_size {prompts} ({OAT} prompts per rollout)")
        samples = prompts * now["num_generations"]
        per_step = int(seed.get("train_batch_size", 128))
        if samples % per_step:
            raise UsageError(f"--train_batch_size {per_step} must divide rollout_batch_size x "
                             "num_samples = "
                             f"{samples}.")
        put("num_mini_batches", samples // per_step,
            f"--train_batch_size {per_step} ({OAT} samples per "
                                                     f"optimizer step) of {samples}")
    # LLM_RL
    if "gsm8k_path" in seed:
        put("dataset_path", seed["gsm8k_path"], f"--gsm8k_path is {LLM_RL} training data")
        put("dataset_name", "gsm8k", "  of the gsm8k task")
    # the seed collects one episode per random problem, no baseline
    if "num_collection_episodes" in seed:
        put("num_prompts", int(seed["num_collection_episodes"]),
            f"--num_collection_episodes is {LLM_RL} "
                                                                 f"episodes per iteration")
        put("num_generations", 1, "  one episode per problem")
        put("baseline", "none", f"  and {LLM_RL} has no baseline")
    if "sys_prompt_path" in seed:
        path = Path(seed["sys_prompt_path"]).expanduser()
        if not path.is_file():
            raise PathError(f"--sys_prompt_path {path}: no such file.")
        put("system_prompt", path.read_text().strip(),
            f"--sys_prompt_path {path} ({LLM_RL} system prompt)")
    if "ref_model_name" in seed:
        if seed["ref_model_name"] != now["model_name_or_path"]:
            raise UsageError(f"--ref_model_name {seed['ref_model_name']}: the KL reference is the "
                             "policy's "
                             "starting point here (--model_name_or_path "
                             f"{now['model_name_or_path']}).")
        say("--ref_model_name: the reference is the starting policy, as here")
    # TRL
    if "sft_model_path" in seed:
        put("model_name_or_path", seed["sft_model_path"],
            f"--sft_model_path is the policy {TRL_PPO} trains")
    if {"per_device_train_batch_size", "total_episodes", "steps_per_generation"} & set(seed):
        per_device = int(seed.get("per_device_train_batch_size", 8))
        accumulation = int(seed.get("gradient_accumulation_steps", 1))
        # TRL GRPO/RLOO sample per_device x world x steps_per_generation completions (default:
        # accumulation), and take one optimizer step per `accumulation` of them
        generation = int(seed.get("steps_per_generation", accumulation))
        # TRL PPO: a rollout batch of per_device x accumulation x minibatches x world prompts
        if algo == "ppo":
            if "num_mini_batches" not in given:
                put("num_mini_batches", 1, f"{TRL_PPO} default --num_mini_batches")
            prompts = per_device * accumulation * now["num_mini_batches"] * world_size
        elif algo == "online_dpo":  # TRL's OnlineDPO: per_device prompts a step, two answers each
            prompts = per_device * accumulation * world_size
        else:
            completions = per_device * world_size * generation
            if completions % now["num_generations"] or generation % accumulation:
                raise UsageError("per_device_train_batch_size x processes x steps_per_generation "
                                 "= "
                                 f"{completions} completions must be divisible by "
                                 "--num_generations "
                                 f"{now['num_generations']}, and steps_per_generation by "
                                 f"gradient_accumulation_steps.")
            prompts = completions // now["num_generations"]
            if algo == "grpo" and generation != accumulation:
                put("num_mini_batches", generation // accumulation,
                    f"--steps_per_generation {generation} "
                                                                    f"({TRL_GRPO} optimizer steps "
                                                                    "per rollout)")
        if "per_device_train_batch_size" in seed:
            put("num_prompts", prompts, f"--per_device_train_batch_size {per_device} x "
                                        f"--gradient_accumulation_steps {accumulation} x "
                                        f"{world_size} "
                                        f"process(es) ({TRL} batch)")
            put("micro_batch_size", per_device, "  micro-batches of --per_device_train_batch_size")
        if "total_episodes" in seed:
            per_update = now["num_prompts"] * now["num_generations"]
            put("max_steps", max(1, int(seed["total_episodes"]) // per_update),
                f"--total_episodes {seed['total_episodes']} ({TRL} responses in all) / "
                f"{per_update} per update")
    if "dap_algo" in seed:  # oat's direct alignment algorithm
        kind = seed["dap_algo"].upper()
        losses = {"DPO": "sigmoid", "IPO": "ipo"}
        if kind not in losses:
            raise UsageError(f"--dap_algo {seed['dap_algo']}: online_dpo.py has DPO and IPO "
                             "(--preference_loss sigmoid|ipo); oat's SLiC and SimPO are not here.")
        put("preference_loss", losses[kind],
            f"--dap_algo {kind} ({OAT} direct alignment algorithm)")
    if "report_to" in seed:
        put("track", "wandb" in seed["report_to"], f"--report_to {seed['report_to']} ({TRL})")
    if "reward_funcs" in seed:
        names = seed["reward_funcs"].split()
        if names != ["accuracy_reward"]:
            raise UsageError(f"--reward_funcs {seed['reward_funcs']}: the reward here is the "
                             "task's verifier "
                             "(TRL's accuracy_reward); format rewards can be earned without the "
                             "right answer.")
        say("--reward_funcs accuracy_reward: the task's verifier is the reward")
    if "scale_rewards" in seed:
        kind = seed["scale_rewards"].lower()
        if kind in ("none", "false") and now["loss_type"] != "dr_grpo":
            put("loss_type", "dr_grpo",
                f"--scale_rewards {kind} ({TRL_GRPO} no std division, Dr.GRPO)")
        elif kind not in ("group", "true", "none", "false"):
            raise UsageError(f"--scale_rewards {kind}: the std here is the group's (or none with "
                             "--loss_type "
                             f"dr_grpo).")
    return now
