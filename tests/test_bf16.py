"""--bf16 in every algorithm file: one update on a random character-level model
(tests/char_model.py) with a reward that varies, so every loss and gradient is non-trivial. The
master weights stay fp32 and change; the losses, gradients and sampler/trainer mismatch are finite.
Before this test, appo and tppo crashed in the critic's backward under --bf16 (a bf16 value against
fp32 returns). With --offload_optimizer the checkpoint holds bf16 weights, and its optimizer
state the fp32 masters that they round."""

import importlib
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import char_model
from dev.algorithms import ALGORITHMS
import warm  # tests/warm.py: `python X.py` runs forked from a warm process

ROOT = Path(__file__).resolve().parents[1]
BATCH = {"grpo": ["--num_prompts", "2", "--num_generations", "4", "--micro_batch_size", "2"],
         "reinforce": ["--num_prompts", "2", "--num_generations", "4", "--micro_batch_size", "2"],
         "reinforce_stepwise": ["--num_prompts", "2", "--num_generations", "2",
                                "--max_episode_steps", "2", "--micro_batch_size", "2"],
         "ppo": ["--num_prompts", "2", "--num_generations", "4", "--micro_batch_size", "2"],
         "appo": ["--num_envs", "2", "--num_steps", "2", "--num_mini_batches", "2",
                  "--micro_batch_size", "1", "--critic_hidden_size", "16", "--critic_num_layers", "1"],
         "tppo": ["--num_envs", "2", "--num_steps", "2", "--num_mini_batches", "2",
                  "--micro_batch_size", "1", "--critic_hidden_size", "16", "--critic_num_layers", "1"],
         "online_dpo": ["--num_prompts", "2", "--micro_batch_size", "2"],
         "tools": ["--num_prompts", "2", "--num_generations", "4", "--micro_batch_size", "2"],
         "async_grpo": ["--num_prompts", "2", "--num_generations", "4", "--micro_batch_size", "2"],
         "dapo": ["--num_prompts", "2", "--num_generations", "4", "--micro_batch_size", "2"],
         "cispo": ["--num_prompts", "2", "--num_generations", "4", "--micro_batch_size", "2"],
         "sapo": ["--num_prompts", "2", "--num_generations", "4", "--micro_batch_size", "2"],
         # the full form, with the model as its own teacher (its divergence is 0) and the test
         # reward's group advantage, so that the update has something to learn
         "sft": ["--num_prompts", "4", "--max_new_tokens", "24", "--micro_batch_size", "2"],
         "distill": ["--num_prompts", "2", "--num_generations", "4", "--micro_batch_size", "2",
                     "--loss_form", "full", "--reward_weight", "1"]}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return char_model.build(tmp_path_factory.mktemp("char") / "model")


# --offload_optimizer wraps the policy's optimizer with the same two lines in every file: these
# two cover the plain loop and a critic beside the policy (ppo), at a fifth of the whole cost
OFFLOADED = ["grpo", "ppo"]


# grpo.py's, and the offloaded pair, in the first tier; the other files' in the second
@pytest.mark.parametrize("algo,offload", [
    (a, False) if a == "grpo" else pytest.param(a, False, marks=pytest.mark.slow)
    for a in ALGORITHMS if a != "sft"] + [(a, True) for a in OFFLOADED],
                         # sft.py samples nothing: its bf16 run is the device check's stage
                         ids=[*(a for a in ALGORITHMS if a != "sft"),
                              *(f"{a}-offload_optimizer" for a in OFFLOADED)])
def test_one_bf16_update(algo, offload, model, tmp_path):
    cmd = [sys.executable, "tests/run_with_test_reward.py", algo, "--model_name_or_path", model,
           "--bf16", "--max_steps", "1", "--max_new_tokens", "8", "--num_eval_problems", "0",
           "--learning_rate", "1e-3", "--temperature", "1.0", "--output_dir", str(tmp_path),
           *BATCH[algo]]
    if algo == "distill":
        cmd += ["--teacher_model_name_or_path", model]
    if offload:
        cmd += ["--offload_optimizer"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TEST_REWARD": "lowercase"}
    out = warm.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (line,) = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert line["skipped_steps"] == 0 and line["grad_norm"] > 0 and math.isfinite(line["grad_norm"])
    assert line["reward/std"] > 0  # the reward (lowercase share) varied, so the update had something to learn
    # sampler (KV-cached decode) and trainer (one forward) both autocast to bf16; this 32-wide model
    # gives 0.0, the 64-wide tiny-random 9e-5, SmolLM2 6e-3 (docs/results.md); online DPO's
    # loss has no ratio to the sampler, so it logs no mismatch
    if algo != "online_dpo":
        assert 0 <= line["mismatch/abs"] < 0.05 and math.isfinite(line["mismatch/kl"])
    if hasattr(importlib.import_module(algo).Args, "critic_learning_rate"):  # a file with a critic
        assert line["v_loss"] > 0 and 0 < line["critic_grad_norm"] < float("inf")
    before = load_file(str(Path(model) / "model.safetensors"))
    after = load_file(str(tmp_path / "checkpoint-1" / "model.safetensors"))
    if not offload:
        assert {str(t.dtype) for t in after.values()} == {"torch.float32"}  # fp32 master weights
        assert max((after[k] - before[k]).abs().max().item() for k in before) > 1e-5
        return
    # --offload_optimizer: the model holds bf16 weights, the optimizer's state the fp32 masters,
    # in the order of the policy's trained parameters, which the checkpoint's weights round
    state = torch.load(tmp_path / "checkpoint-1" / "trainer_state.pt", weights_only=False)
    master = state["optimizers"]["policy"]["master"]
    assert {str(t.dtype) for t in after.values()} == {"torch.bfloat16"}
    assert {str(m.dtype) for m in master} == {"torch.float32"}
    from transformers import AutoModelForCausalLM
    names = [n for n, _ in AutoModelForCausalLM.from_pretrained(model).named_parameters()]
    assert len(master) == len(names) and set(names) <= set(after)
    assert max((m - before[n]).abs().max().item() for m, n in zip(master, names)) > 1e-5
    assert all(torch.equal(m.to(torch.bfloat16), after[n]) for m, n in zip(master, names))
