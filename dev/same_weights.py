"""Do two versions of the code train the same weights? A refactor must not change what the
algorithm files learn: this runs each file for a few updates on the tiny model, with a reward that
varies (tests/run_with_test_reward.py's length reward, so every update moves the weights), and
prints one hash per run of the final checkpoint's tensors. Run it at two commits and compare:

    python dev/same_weights.py --out before.json          # at the old commit
    python dev/same_weights.py --compare before.json    # at the new one: the runs that differ

Every run uses one thread (fp32 sums round by thread count), so the hashes depend only on the code,
torch and the machine. About 4 minutes on 2 cores. Some runs must also match another of the same
commit (SAME_AS: async_grpo.py sampling 0 updates behind is grpo.py), which every call checks:

    python dev/same_weights.py --runs grpo async_grpo_k0   # "the same weights", or exit 1
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "12", "--num_eval_problems",
        "4", "--learning_rate", "1e-3", "--max_steps", "3"]
# name: (file, options). Each variant takes a path of its file that the defaults leave out.
RUNS = {
    "grpo": ("grpo", ["--num_prompts", "2", "--num_generations", "4", "--micro_batch_size", "3"]),
    "grpo_kl_epochs": ("grpo", ["--num_prompts", "2", "--num_generations", "4", "--beta", "0.1",
                                "--num_ppo_epochs", "2", "--num_mini_batches", "2"]),
    # grpo.py's own variants: TRL's token-mean loss and GSPO's sequence-level ratio
    "grpo_gspo_dapo_loss": ("grpo", ["--num_prompts", "4", "--num_generations", "2", "--loss_type",
                                     "dapo", "--importance_sampling_level", "sequence",
                                     "--num_mini_batches", "2"]),
    # DAPO's clip-higher and zero-std drop, with its sampling and shaping off: grpo.py's old path
    "dapo_clip_drop": ("dapo", ["--num_prompts", "4", "--num_generations", "2",
                                "--no_dynamic_sampling", "--overlong_buffer_len", "0",
                                "--no_mask_truncated_completions", "--num_mini_batches", "2"]),
    # DAPO's dynamic sampling with grpo.py's KL in the reward and Dr.GRPO's loss
    "dapo_dynamic_kl_reward": ("dapo", ["--num_prompts", "2", "--num_generations", "4",
                                        "--epsilon_high", "0.2", "--no_drop_zero_std_groups",
                                        "--overlong_buffer_len", "0",
                                        "--no_mask_truncated_completions", "--beta", "0.1",
                                        "--kl_penalty", "reward", "--loss_type", "dr_grpo"]),
    # the recipe with the soft overlong punishment (the tiny model's responses all run to the
    # budget: masking them, as the default does, would leave nothing to learn from)
    "dapo": ("dapo", ["--num_prompts", "2", "--num_generations", "4", "--overlong_buffer_len",
                      "6", "--no_mask_truncated_completions"]),
    "ppo": ("ppo", ["--num_prompts", "4", "--num_generations", "2"]),
    "ppo_shared": ("ppo", ["--num_prompts", "4", "--critic_type", "shared", "--beta", "0.05",
                           "--whiten_rewards", "--entropy_coef", "0.01", "--gae_lambda", "0.95",
                           "--loss_type", "grpo", "--num_ppo_epochs", "2"]),
    "reinforce": ("reinforce", ["--num_prompts", "2", "--num_generations", "4"]),
    "reinforce_mean_loss_kl": ("reinforce", ["--num_prompts", "2", "--num_generations", "2",
                                             "--baseline", "mean", "--kl_penalty", "loss",
                                             "--no_length_normalize", "--ref_model_sync_steps",
                                             "2"]),
    # what `reinforce.py --stepwise` trained, now the file of its own
    "reinforce_stepwise": ("reinforce_stepwise", ["--num_prompts", "2", "--num_generations", "2",
                                                  "--sym_calc", "--max_episode_steps", "3"]),
    "appo": ("appo", ["--num_envs", "2", "--num_steps", "4"]),
    "tppo": ("tppo", ["--num_envs", "2", "--num_steps", "4"]),
    "online_dpo": ("online_dpo", ["--num_prompts", "4", "--micro_batch_size", "3"]),
    "online_dpo_ipo_ties": ("online_dpo", ["--num_prompts", "4", "--num_generations", "3",
                                           "--preference_loss", "ipo", "--ties", "first",
                                           "--missing_eos_penalty", "0.5"]),
    # TIS against the sampler's log-probs, 0 updates behind
    "async_grpo_k0_tis": ("async_grpo", ["--num_prompts", "4", "--num_generations", "2",
                                         "--max_staleness", "0", "--off_policy_correction", "tis",
                                         "--is_cap", "2", "--loss_type", "dapo",
                                         "--num_mini_batches", "2"]),
    "tools": ("tools", ["--num_prompts", "2", "--num_generations", "4"]),
    # the teacher is the student's starting point: the verifier's share moves the weights
    "distill": ("distill", ["--num_prompts", "2", "--num_generations", "4",
                            "--teacher_model_name_or_path", "tiny-random", "--reward_weight", "1"]),
    "async_grpo": ("async_grpo", ["--num_prompts", "2", "--num_generations", "4",
                                  "--max_staleness", "2", "--off_policy_correction", "seq_mis"]),
    # grpo's run, sampled 0 updates behind: the same weights, bit for bit (SAME_AS)
    "async_grpo_k0": ("async_grpo", ["--num_prompts", "2", "--num_generations", "4",
                                     "--micro_batch_size", "3", "--max_staleness", "0",
                                     "--off_policy_correction", "none"]),
}
# runs that must train the weights of another run of the same commit
SAME_AS = {"async_grpo_k0": "grpo"}


def weights_hash(folder):
    """sha256 over every tensor of the checkpoint (name, dtype, shape, bytes), and over the critic
    and other state its trainer_state.pt keeps."""
    import torch
    from safetensors.torch import load_file

    h = hashlib.sha256()
    tensors = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        tensors.update({f"{f.name}:{k}": v for k, v in load_file(str(f)).items()})
    extra = torch.load(Path(folder) / "trainer_state.pt", map_location="cpu",
                       weights_only=True)["extra"]

    def walk(prefix, x):
        if isinstance(x, dict):
            for k in sorted(x):
                walk(f"{prefix}.{k}", x[k])
        elif torch.is_tensor(x):
            tensors[prefix] = x
    walk("extra", extra)
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def run(name, algo, options, tmp):
    out = Path(tmp) / name
    cmd = [sys.executable, "tests/run_with_test_reward.py", algo, *TINY, *options,
           "--output_dir", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "TEST_REWARD": "length"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"{name}: {' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    last = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return weights_hash(last)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the hashes to this JSON file")
    parser.add_argument("--compare", help="a JSON file of hashes from another commit")
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    args = parser.parse_args()
    before = json.loads(Path(args.compare).read_text()) if args.compare else {}
    hashes, differ = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.runs:
            hashes[name] = run(name, *RUNS[name], tmp)
            verdict = ""
            if name in before:
                same = before[name] == hashes[name]
                verdict = "same" if same else f"DIFFERS (was {before[name]})"
                differ += [] if same else [name]
            print(f"{name:26s} {hashes[name]}  {verdict}", flush=True)
    for name, other in SAME_AS.items():
        if name in hashes and other in hashes:
            same = hashes[name] == hashes[other]
            print(f"{name} against {other}: {'the same weights' if same else 'DIFFERENT weights'}")
            differ += [] if same else [name]
    if args.out:
        Path(args.out).write_text(json.dumps(hashes, indent=1) + "\n")
    if args.compare:
        print("all the same" if not differ else f"{len(differ)} differ: {', '.join(differ)}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
