"""How much does reinforce.py's baseline cut the variance of the policy gradient? Measured, not
argued.

For a fixed policy and a fixed set of prompts, sample M responses per prompt with reinforce.py's own
rollout, grade them, and take each response's gradient g_i of its sequence log-prob (one backward
per response, on a slice of the weights: by default the last decoder layer's MLP down-projection).
Every estimator of the batch gradient is then a weighted sum of those g_i, so its statistics follow
from the Gram matrix g_i . g_j:

    none:  g_hat = 1/(P k) sum_p sum_i r_pi g_pi
    rloo:  g_hat = 1/(P k) sum_p sum_i (r_pi - mean_{j != i} r_pj) g_pi

Each prompt's M samples are split into M / k disjoint groups of k (the --num_generations of a run),
so a batch of P prompts x k samples has M / k independent replicates, and over many random splits:

    variance  tr Cov[g_hat | prompts] = (1 / P^2) sum_p (unbiased variance of prompt p's group estimate)
    signal    |E g_hat|^2             = mean over replicate pairs j != j' of <g_hat_j, g_hat_j'>   (unbiased)
    SNR       signal / variance       (how many batches' worth of noise one step's direction carries)

With sums of token log-probs (--no_length_normalize) both estimators have the same expectation, the
policy gradient, so the ratio of variances says everything. With length-normalised log-probs
(reinforce.py's default, the seed's way) the expectation itself depends a little on the baseline
(tests/test_reinforce.py works out the length term). Rewards only: no KL term.

    python bench/baseline_variance.py                              # embedded model as it starts, ~10-20 min on 2 cores
    python bench/baseline_variance.py --model_name_or_path runs/reinforce/checkpoint-20     # a trained policy
    python bench/baseline_variance.py --model_name_or_path tiny-random --num_prompts 2 --samples_per_prompt 8
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reinforce  # noqa: E402  (the file whose estimator is measured)
# noqa: E402
from common.distributed import sample_seed, set_seed  # noqa: E402
from common.env.math_env import make_env  # noqa: E402
from common.models.hf import position_ids_from_mask  # noqa: E402
from common.models.logprobs import logprobs_from_logits  # noqa: E402
from common.models.loading import load_policy, load_tokenizer  # noqa: E402


def group_weights(rewards, k, baseline):
    """rewards [J, k] (J disjoint groups of one prompt) -> the weights A_i = r_i - b_i of each g_i
    in a group's estimate, with reinforce.py's own baselines."""
    return rewards - reinforce.compute_baselines(rewards.reshape(-1), k, baseline).view_as(rewards)


def estimator_stats(gram, rewards, k, num_splits=20, seed=0):
    """gram [P*M, P*M] inner products of the per-sample gradients, prompt by prompt (M consecutive
    rows each); rewards [P, M]. Returns {baseline: {variance, signal, snr}} for a batch of P prompts
    x k samples."""
    P, M = rewards.shape
    J = M // k
    if J < 2:
        raise ValueError(f"--samples_per_prompt {M} must hold at least 2 groups of k = {k}")
    gen = torch.Generator().manual_seed(seed)
    out = {b: {"variance": 0.0, "signal": 0.0} for b in ("none", "rloo")}
    for _ in range(num_splits):
        perms = [torch.randperm(M, generator=gen)[:J * k].view(J, k) for _ in range(P)]
        for b in out:
            # row j: replicate batch j's estimate, as weights on g_i
            C = torch.zeros(J, P * M, dtype=gram.dtype)
            for p in range(P):
                w = group_weights(rewards[p][perms[p]], k, b)  # [J, k]
                C[torch.arange(J)[:, None], p * M + perms[p]] = w / (P * k)
            inner = C @ gram @ C.T  # [J, J]: <g_hat_j, g_hat_j'>
            # per-prompt variance: the same products restricted to one prompt's block, summed over
            # prompts
            var = 0.0
            for p in range(P):
                blk = slice(p * M, (p + 1) * M)
                Cp = C[:, blk]
                ip = Cp @ gram[blk, blk] @ Cp.T
                # unbiased variance of J iid vectors: (sum_j |x_j|^2 - |sum x|^2 / J) / (J - 1)
                var += (ip.diagonal().sum() - ip.sum() / J) / (J - 1)
            off = ~torch.eye(J, dtype=torch.bool)
            out[b]["variance"] += var.item() / num_splits
            out[b]["signal"] += inner[off].mean().item() / num_splits
    for b in out:
        out[b]["snr"] = out[b]["signal"] / out[b]["variance"] if out[b]["variance"] > 0 else float("nan")
    return out


def last_layer_param(policy, name):
    layers = [n for n, _ in policy.named_parameters() if ".layers." in n]
    last = max(int(n.split(".layers.")[1].split(".")[0]) for n in layers)
    full = f"model.layers.{last}.{name}"
    params = dict(policy.named_parameters())
    if full not in params:
        raise SystemExit(f"no parameter {full!r}; --param names a weight inside one decoder layer, "
                         "e.g. mlp.down_proj.weight")
    return full, params[full]


def per_sample_grads(policy, module, input_ids, attention_mask, loss_mask, temperature):
    """The gradient of each row's summed response log-prob with respect to `module`'s weight (a
    Linear), from one backward for the whole micro-batch: row i's loss depends only on row i, so the
    gradient reaching the module's output at row i's positions is row i's alone, and its weight
    gradient is sum_t delta_t x_t^T. A plain forward (no shared-prompt trick, which would mix the
    rows' prompt gradients)."""
    saved = {}
    def hook(_, inputs, output):
        saved["x"] = inputs[0].detach()
        output.register_hook(lambda grad: saved.__setitem__("delta", grad.detach()))
    handle = module.register_forward_hook(hook)
    try:
        R = loss_mask.shape[1]
        logits = policy(input_ids=input_ids, attention_mask=attention_mask,
                        position_ids=position_ids_from_mask(attention_mask)).logits[:, -R - 1:-1]
        lp = logprobs_from_logits(logits, input_ids[:, -R:], temperature)  # [b, R]
        (lp * loss_mask).sum().backward()
    finally:
        handle.remove()
    return [torch.einsum("to,ti->oi", d, x).flatten() for d, x in zip(saved["delta"], saved["x"])]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_name_or_path", default="SmolLM2-135M-Instruct")
    p.add_argument("--dataset_name", default="arithmetic")
    p.add_argument("--difficulty", default="1-2")
    p.add_argument("--num_prompts", type=int, default=12,
                   help="P: training prompts, drawn at random")
    p.add_argument("--samples_per_prompt", type=int, default=32,
                   help="M: responses sampled per prompt")
    p.add_argument("--num_generations", type=int, default=8,
                   help="k: samples per prompt in one batch")
    p.add_argument("--max_new_tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--param", default="mlp.down_proj.weight",
                   help="weight of the last decoder layer to take gradients of")
    p.add_argument("--micro_batch_size", type=int, default=8, help="rows per forward/backward")
    p.add_argument("--num_splits", type=int, default=20,
                   help="random splits of the M samples into groups of k")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the results as json here")
    a = p.parse_args()
    if a.samples_per_prompt < 2 * a.num_generations:
        sys.exit("--samples_per_prompt must be at least 2 x --num_generations "
                 f"({2 * a.num_generations}): "
                 "the variance comes from independent groups of k")
    t0 = time.time()
    set_seed(a.seed)
    tokenizer = load_tokenizer(a.model_name_or_path)  # a checkpoint holds its tokenizer
    policy = load_policy(a.model_name_or_path)
    name, weight = last_layer_param(policy, a.param)
    for q in policy.parameters():
        q.requires_grad_(False)
    weight.requires_grad_(True)  # backward then stops at the last layer
    module = policy.get_submodule(name.rsplit(".", 1)[0])
    if not isinstance(module, torch.nn.Linear) or not name.endswith(".weight"):
        sys.exit(f"--param must name the weight of a Linear layer, not {name!r}")
    env = make_env(a.dataset_name, "train", seed=a.seed,
                   **({"difficulty": a.difficulty} if a.dataset_name == "arithmetic" else {}))
    indices = torch.randperm(len(env),
                             generator=torch.Generator().manual_seed(a.seed))[:a.num_prompts].tolist()
    run_args = reinforce.Args(model_name_or_path=a.model_name_or_path,
                              num_generations=a.samples_per_prompt,
                              max_new_tokens=a.max_new_tokens, temperature=a.temperature)
    M, grads, rewards, lengths = a.samples_per_prompt, [], [], []
    print(f"{a.model_name_or_path}: {a.num_prompts} prompts x {M} samples, gradients of {name} "
          f"({weight.numel():,} weights)")
    policy.eval()
    for n, idx in enumerate(indices):
        seeds = [sample_seed(a.seed, n, j) for j in range(M)]
        ro = reinforce.rollout(policy, tokenizer, env, [idx], seeds, run_args, None)
        ids, mask = ro.gen.sequences()
        for i in range(0, M, a.micro_batch_size):
            sl = slice(i, i + a.micro_batch_size)
            grads += per_sample_grads(policy, module, ids[sl], mask[sl], ro.loss_mask[sl].float(),
                                      a.temperature)
        rewards.append(ro.rewards[:, 0])
        lengths.append(ro.loss_mask.sum(1).float())
        print(f"  prompt {n + 1}/{len(indices)}: {int(ro.rewards.sum())}/{M} correct, "
              f"mean length {lengths[-1].mean():.0f} tokens ({time.time() - t0:.0f} s)", flush=True)
    G = torch.stack(grads).double()  # [P*M, D]
    rewards = torch.stack(rewards).double()  # [P, M]
    inv_len = 1 / torch.cat(lengths).double().clamp(min=1)
    gram_sum = G @ G.T
    # g of the mean log-prob = g of the sum / |o|
    gram_mean = gram_sum * inv_len[:, None] * inv_len[None, :]
    if rewards.sum() == 0:
        sys.exit("every sampled response got reward 0, so every estimator is exactly 0 and there "
                 "is nothing to "
                 "compare: use a policy that solves some prompts (the embedded model does) or more "
                 "prompts")
    solved = rewards.mean(1)
    mixed = ((solved > 0) & (solved < 1)).sum().item()
    results = {"model": a.model_name_or_path, "param": name, "num_prompts": a.num_prompts,
               "samples_per_prompt": M,
               "k": a.num_generations, "accuracy": rewards.mean().item(), "mixed_prompts": mixed,
               "per_prompt_accuracy": [round(x, 3) for x in solved.tolist()]}
    print(f"sampling accuracy {rewards.mean():.3f}; prompts with mixed outcomes: "
          f"{mixed}/{a.num_prompts}; "
          f"per prompt: {' '.join(f'{x:.2f}' for x in solved.tolist())}")
    for label, gram in (("sum", gram_sum), ("length-normalised", gram_mean)):
        s = estimator_stats(gram, rewards, a.num_generations, a.num_splits, a.seed)
        results[label] = s
        ratio = s["rloo"]["variance"] / s["none"]["variance"]
        print(f"\n{label} log-probs, batch of {a.num_prompts} prompts x {a.num_generations} "
              "samples:")
        print(f"  {'':6s} {'variance':>12s} {'signal':>12s} {'SNR':>8s}")
        for b in ("none", "rloo"):
            print(f"  {b:6s} {s[b]['variance']:12.4e} {s[b]['signal']:12.4e} {s[b]['snr']:8.3f}")
        print(f"  variance rloo / none = {ratio:.3f}; SNR rloo / none = "
              f"{s['rloo']['snr'] / s['none']['snr']:.2f}")
    print(f"\n{time.time() - t0:.0f} s")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
