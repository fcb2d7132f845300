"""Held-out evaluation: greedy pass@1 on a fixed subset of the held-out problems, whole responses
or stepwise episodes, under torchrun a strided share per rank."""

import contextlib

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from common.models.distributed import all_gather_objects, world_size
from common.models.fast.decoding import fast_decoding
from common.models.sampler import encode_prompts, eos_token_ids, generate
from common.models.sharding import unsharded
from common.models.stepwise import play_episodes, policy_sampler


def evaluate(model, tokenizer, env, num_problems, max_new_tokens, batch_size=64,
             autocast=contextlib.nullcontext(), return_records=False, respond=None, fast=True):
    """Greedy pass@1 on a fixed subset of `num_problems` problems of `env`. Under torchrun each rank
    grades a strided share and the accuracy is over all of them; rank 0's bar (`progress`) counts
    its share. respond(prompts) -> (texts, truncated): how a batch of prompts (token-id lists) is
    answered greedily, when not by one call of `generate` (tools.py: with its tools). fast False
    (--plain): the plain decoder. Returns the accuracy (and per-problem records)."""
    if env.stepwise and not return_records:  # one line per step, as the policy was trained to
        return evaluate_stepwise(model, tokenizer, env, num_problems, max_new_tokens, batch_size,
                                 autocast, fast)
    rank, world = (dist.get_rank(), world_size()) if world_size() > 1 else (0, 1)
    # A fixed random subset: test files are often ordered (by level, by subject), so the first N
    # would be biased.
    chosen = torch.randperm(len(env), generator=torch.Generator().manual_seed(0))[:num_problems]
    indices = sorted(chosen.tolist())[rank::world]
    # FSDP2: ranks may hold different numbers of batches
    with unsharded(model), progress(len(indices), rank) as bar:
        records = _grade_greedy(model, tokenizer, env, indices, max_new_tokens, batch_size,
                                autocast, respond, fast, bar)
    records = [r for part in all_gather_objects(records) for r in part]
    accuracy = sum(r["correct"] for r in records) / max(1, len(records))
    return (accuracy, sorted(records, key=lambda r: r["index"])) if return_records else accuracy


def progress(total, rank):
    """The evaluation's bar on rank 0: problems graded and their rate. tqdm shows 0/total at once,
    so a first batch that takes minutes on a busy CPU is not silent; it stands below the training's
    `updates` bar and clears itself when done, as the accuracy line then says the result. One update
    per batch, so each is drawn (mininterval 0) at no cost."""
    return tqdm(total=total, desc="held-out eval", unit="problem", dynamic_ncols=True,
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
                               decoder=decoder)
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
                      autocast=contextlib.nullcontext(), fast=True):
    """Greedy pass@1 of stepwise episodes, on the same fixed subset as `evaluate`, which
    calls this for a stepwise env; with the calculator if the env's worked examples show it (as
    reinforce.py --sym_calc sets it); under torchrun each rank plays a strided share."""
    rank, world = (dist.get_rank(), world_size()) if world_size() > 1 else (0, 1)
    chosen = torch.randperm(len(env), generator=torch.Generator().manual_seed(0))[:num_problems]
    indices = sorted(chosen.tolist())[rank::world]
    sample = policy_sampler(policy, tokenizer, 0.0, 1.0, None, env.calc_annotations, autocast,
                            fast)
    device, eos_ids = next(policy.parameters()).device, set(eos_token_ids(policy, tokenizer))
    correct = []
    # FSDP2: ranks may play different numbers of steps
    with unsharded(policy), progress(len(indices), rank) as bar:
        for start in range(0, len(indices), batch_size):
            chunk = indices[start:start + batch_size]
            episodes = play_episodes(sample, tokenizer, env, chunk, 1, max_new_tokens,
                                     env.calc_annotations, device, eos_ids)
            correct += episodes.correct.tolist()
            bar.update(len(chunk))
    correct = [c for part in all_gather_objects(correct) for c in part]
    return sum(correct) / max(1, len(correct))
