"""Held-out evaluation: greedy pass@1 on a fixed subset of the held-out problems, whole responses
or stepwise episodes, under torchrun a strided share per rank; and, as papers report it, k sampled
responses per problem scored as avg@k, pass@k and maj@k (`evaluate_sampled`, `evaluate_sets`),
with the metrics eval.py reports too (`pass_at_k`, `majority_vote`, `problem_metrics`).

    evaluate(policy, tokenizer, env, 200, 64)      # greedy pass@1 of 200 held-out problems
    evaluate_sets(policy, tokenizer, {"arithmetic": env, "gsm8k": gsm8k_env}, 200, 256,
                  samples=4, temperature=0.6, seed=0)
    # {"eval/arithmetic/greedy_pass@1": ..., "eval/arithmetic/avg@4": ...,
    #  "eval/arithmetic/pass@4": ..., "eval/arithmetic/maj@4": ...,
    #  "eval/arithmetic/num_problems": 200, "eval/gsm8k/...": ...}
"""

import contextlib
import math
import re

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from common.env import TASKS, normalize, to_number
from common.distributed import all_gather_objects, sample_seed, world_size
from common.models.fast.decoding import fast_decoding
from common.models.sampler import encode_prompts, eos_token_ids, generate
from common.models.sharding import unsharded
from common.models.stepwise import play_episodes, policy_sampler


def evaluate(model, tokenizer, env, num_problems, max_new_tokens, batch_size=64,
             autocast=contextlib.nullcontext(), return_records=False, respond=None, fast=True,
             desc="held-out eval"):
    """Greedy pass@1 on a fixed subset of `num_problems` problems of `env`. Under torchrun each rank
    grades a strided share and the accuracy is over all of them; rank 0's bar (`progress`) counts
    its share. respond(prompts) -> (texts, truncated): how a batch of prompts (token-id lists) is
    answered greedily, when not by one call of `generate` (tools.py: with its tools). fast False
    (--plain): the plain decoder. Returns the accuracy (and per-problem records)."""
    if env.stepwise and not return_records:  # one line per step, as the policy was trained to
        return evaluate_stepwise(model, tokenizer, env, num_problems, max_new_tokens, batch_size,
                                 autocast, fast, desc)
    rank, world = (dist.get_rank(), world_size()) if world_size() > 1 else (0, 1)
    # A fixed random subset: test files are often ordered (by level, by subject), so the first N
    # would be biased.
    indices = chosen_problems(len(env), num_problems)[rank::world]
    # FSDP2: ranks may hold different numbers of batches
    with unsharded(model), progress(len(indices), rank, desc) as bar:
        records = _grade_greedy(model, tokenizer, env, indices, max_new_tokens, batch_size,
                                autocast, respond, fast, bar)
    records = [r for part in all_gather_objects(records) for r in part]
    accuracy = sum(r["correct"] for r in records) / max(1, len(records))
    return (accuracy, sorted(records, key=lambda r: r["index"])) if return_records else accuracy


def chosen_problems(num_total, num_problems):
    """The fixed random subset of `num_problems` of `num_total` problems every evaluation reads, in
    index order (all of them when there are no more): test files are often ordered (by level, by
    subject), so the first N would be biased."""
    chosen = torch.randperm(num_total, generator=torch.Generator().manual_seed(0))[:num_problems]
    return sorted(chosen.tolist())


def progress(total, rank, desc="held-out eval"):
    """The evaluation's bar on rank 0: problems graded and their rate. tqdm shows 0/total at once,
    so a first batch that takes minutes on a busy CPU is not silent; it stands below the training's
    `updates` bar and clears itself when done, as the accuracy line then says the result. One update
    per batch, so each is drawn (mininterval 0) at no cost."""
    return tqdm(total=total, desc=desc, unit="problem", dynamic_ncols=True,
                leave=False, mininterval=0, disable=rank != 0)


def _grade_greedy(model, tokenizer, env, indices, max_new_tokens, batch_size, autocast,
                  respond=None, fast=True, bar=None):
    """One record per problem of `indices`: its greedy response, reward and grade; `bar` (a
    tqdm) advances by each batch's problems."""
    records = []
    for start in range(0, len(indices), batch_size):
        chunk = indices[start:start + batch_size]
        prompts = encode_prompts(tokenizer, [env.prompt(i) for i in chunk])
        if respond is not None:
            texts, truncated = respond(prompts)
        else:
            with autocast, fast_decoding(model, enabled=fast) as decoder:
                gen = generate(model, tokenizer, prompts, max_new_tokens, temperature=0.0,
                               decoder=decoder, reasoning=env.reasoning)
            texts, truncated = gen.texts(tokenizer), gen.truncated.tolist()
        for i, text, truncated in zip(chunk, texts, truncated):
            reward, info = env.score(text, i)
            records.append({"index": i, "response": text, "reward": reward,
                            "correct": bool(info["correct"]),
                            "pred": info.get("pred"), "answer": env.examples[i]["answer"],
                            "truncated": truncated})
        if bar is not None:
            bar.update(len(chunk))
    return records


def evaluate_stepwise(policy, tokenizer, env, num_problems, max_new_tokens, batch_size=64,
                      autocast=contextlib.nullcontext(), fast=True, desc="held-out eval"):
    """Greedy pass@1 of stepwise episodes, on the same fixed subset as `evaluate`, which
    calls this for a stepwise env; with the calculator if the env's worked examples show it (as
    reinforce.py --sym_calc sets it); under torchrun each rank plays a strided share."""
    rank, world = (dist.get_rank(), world_size()) if world_size() > 1 else (0, 1)
    indices = chosen_problems(len(env), num_problems)[rank::world]
    sample = policy_sampler(policy, tokenizer, 0.0, 1.0, None, env.calc_annotations, autocast,
                            fast)
    device, eos_ids = next(policy.parameters()).device, set(eos_token_ids(policy, tokenizer))
    correct = []
    # FSDP2: ranks may play different numbers of steps
    with unsharded(policy), progress(len(indices), rank, desc) as bar:
        for start in range(0, len(indices), batch_size):
            chunk = indices[start:start + batch_size]
            episodes = play_episodes(sample, tokenizer, env, chunk, 1, max_new_tokens,
                                     env.calc_annotations, device, eos_ids)
            correct += episodes.correct.tolist()
            bar.update(len(chunk))
    correct = [c for part in all_gather_objects(correct) for c in part]
    return sum(correct) / max(1, len(correct))


# ------------------------------------------------------------------------------------------------
# Sampled evaluation: k responses per problem, as papers report it

def evaluate_sampled(model, tokenizer, env, num_problems, max_new_tokens, samples, temperature,
                     seed, batch_size=64, autocast=contextlib.nullcontext(), fast=True,
                     desc="held-out eval"):
    """k = `samples` responses to each problem of the same fixed subset as `evaluate`, at
    `temperature`, scored as papers score them: {"avg@k", "pass@k", "maj@k"} over the problems
    (`problem_metrics`). Response j to problem i is drawn with its own seed, sample_seed(seed, i,
    j), as eval.py draws it: the numbers do not depend on the batch size or on how many processes
    share the problems. Under torchrun each rank samples a strided share."""
    rank, world = (dist.get_rank(), world_size()) if world_size() > 1 else (0, 1)
    indices = chosen_problems(len(env), num_problems)[rank::world]
    per_batch = max(1, batch_size // samples)  # problems per generate call: k rows each
    scored = []
    with unsharded(model), progress(len(indices), rank, f"{desc} ({samples} samples)") as bar:
        for start in range(0, len(indices), per_batch):
            chunk = indices[start:start + per_batch]
            _, _, graded = sample_problems(model, tokenizer, env, chunk, samples, max_new_tokens,
                                           temperature, seed, autocast=autocast, fast=fast)
            for p in range(len(chunk)):
                scored.append(problem_metrics(
                    env.task, [info for _, info in graded[p * samples:(p + 1) * samples]],
                    [samples]))
            bar.update(len(chunk))
    scored = [m for part in all_gather_objects(scored) for m in part]
    k = samples
    return {f"avg@{k}": mean([m["num_correct"] / k for m in scored]),
            f"pass@{k}": mean([m[f"pass@{k}"] for m in scored]),
            f"maj@{k}": mean([float(m[f"maj@{k}"]) for m in scored])}


def sample_problems(model, tokenizer, env, chunk, samples, max_new_tokens, temperature, seed,
                    top_p=1.0, autocast=contextlib.nullcontext(), fast=True):
    """k = `samples` responses to each problem of `chunk`, in one generate call, graded by the env.
    Response j to problem i is drawn with its own seed, sample_seed(seed, i, j): the draws do not
    depend on the batch or the processes, and with k = 8 the first 4 are those of k = 4. The
    training's sampled evaluation and eval.py both draw here. -> (gen, texts, graded), rows problem
    by problem, graded[row] = (reward, info)"""
    prompts = [p for p in encode_prompts(tokenizer, [env.prompt(i) for i in chunk])
               for _ in range(samples)]  # consecutive rows: the k samples of a problem
    seeds = [sample_seed(seed, i, j) for i in chunk for j in range(samples)]
    with autocast, fast_decoding(model, enabled=fast) as decoder:
        gen = generate(model, tokenizer, prompts, max_new_tokens, temperature, top_p, seeds=seeds,
                       decoder=decoder, reasoning=env.reasoning)
    texts = gen.texts(tokenizer)
    problems = [i for i in chunk for _ in range(samples)]
    return gen, texts, env.score_all(texts, problems, gen.completion_ids())


def evaluate_sets(model, tokenizer, sets, num_problems, max_new_tokens, batch_size=64,
                  autocast=contextlib.nullcontext(), samples=0, temperature=1.0, seed=0,
                  respond=None, fast=True):
    """Each held-out set of `sets` ({name: env}), on its fixed subset of `num_problems`: greedy
    pass@1 (`evaluate`), and with `samples` k > 0 also avg@k, pass@k and maj@k
    (`evaluate_sampled`), with the number of problems. -> {"eval/<name>/<metric>": value}"""
    metrics = {}
    for name, env in sets.items():
        metrics[f"eval/{name}/greedy_pass@1"] = evaluate(
            model, tokenizer, env, num_problems, max_new_tokens, batch_size, autocast,
            respond=respond, fast=fast, desc=f"held-out eval, {name}")
        if samples:
            sampled = evaluate_sampled(model, tokenizer, env, num_problems, max_new_tokens,
                                       samples, temperature, seed, batch_size, autocast, fast,
                                       desc=f"held-out eval, {name}")
            metrics.update({f"eval/{name}/{key}": value for key, value in sampled.items()})
        metrics[f"eval/{name}/num_problems"] = min(num_problems, len(env))
    return metrics


def mean(values):
    return sum(values) / max(1, len(values))


# ------------------------------------------------------------------------------------------------
# The metrics of k samples: pass@k, majority vote

def pass_at_k(n, c, k):
    """Unbiased estimate of P(at least one of k samples is correct) from n samples with c correct:
    1 - C(n - c, k) / C(n, k), the chance that k samples drawn without replacement from the n all
    miss (Chen et al. 2021, "Evaluating Large Language Models Trained on Code")."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n (n = {n})")
    if n - c < k:  # every draw of k contains a correct sample
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def vote_key(task, pred):
    """What two answers must share to count as the same vote: the number, MATH's normalised LaTeX
    (the math task and the benchmarks graded as it is), or the text without spaces. None (no answer
    extracted) stays None. task: a task's name or class."""
    if pred is None:
        return None
    task = TASKS[task] if isinstance(task, str) else task
    if issubclass(task, TASKS["math"]):
        return normalize(pred)
    number = to_number(pred)
    return number if number is not None else re.sub(r"\s+", "", pred)


def majority_vote(keys, k):
    """Position (in the first k) of the first sample of the most common non-None key, or None if
    none has an answer. Ties go to the key seen first."""
    counts, first = {}, {}
    for i, key in enumerate(keys[:k]):
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
            first.setdefault(key, i)
    if not counts:
        return None
    return first[max(counts, key=lambda key: (counts[key], -first[key]))]


def problem_metrics(task, samples, ks):
    """Per-problem num_correct, pass@k and maj@k from its graded samples (dicts with correct, pred,
    format_ok)."""
    n, c = len(samples), sum(bool(s["correct"]) for s in samples)
    # an answer without the task's answer marker is no answer (data/README.md, grading policy): it
    # has no vote
    keys = [vote_key(task, s["pred"]) if s["format_ok"] else None for s in samples]
    out = {"num_correct": c}
    for k in ks:
        out[f"pass@{k}"] = pass_at_k(n, c, k)
        winner = majority_vote(keys, k)
        out[f"maj@{k}"] = winner is not None and bool(samples[winner]["correct"])
    return out
