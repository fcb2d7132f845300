"""--micro_batch_size left unset: 8 rows on a CPU (and under --fsdp); on a GPU, 8 in the first
update, then as many rows as half of the free memory holds at the cost per token the first update
measured (common/run/run.py, MicroBatchFit). The GPU's memory is faked here with hand-picked numbers;
that a different micro-batch gives the same update is tests/test_grpo.py's 1 x 8 = 8 x 1, and each
file's wiring is the last test's: 8 rows, then 1, train the weights of 8 rows throughout."""

from dataclasses import replace

import pytest
import torch

import grpo
from dev.algorithms import ALGORITHMS
from common.run.run import DEFAULT_MICRO_BATCH, MicroBatchFit, Run


class FakeMemory:
    """2.0 GB allocated when the first update starts, a peak of 2.9 GB during it, 20 GB free."""

    def __init__(self):
        self.started = 0

    def start(self):
        self.started += 1
        return 2.0e9

    def peak(self):
        return 2.9e9

    def room(self):
        return 20e9


def test_the_first_update_runs_8_rows_and_its_cost_sets_the_rest_by_hand():
    memory = FakeMemory()
    fit = MicroBatchFit(fraction=0.5, memory=memory)
    assert not fit.measure(grad_bytes=1e8)  # nothing measured before the first update
    assert fit.rows(32, 200) == DEFAULT_MICRO_BATCH == 8 and memory.started == 1
    # activations: 2.9e9 - 2.0e9 - 1e8 gradients = 8e8 bytes for 8 rows x 200 tokens = 5e5 a token;
    # half of the 20e9 - 1e8 bytes free then: 0.5 * 1.99e10 / 5e5 = 19,900 tokens per micro-batch
    assert fit.measure(grad_bytes=1e8) and fit.tokens == 19_900
    assert not fit.measure(grad_bytes=1e8)  # measured once
    assert fit.rows(512, 250) == 79  # 19,900 // 250
    assert fit.rows(32, 250) == 32  # never more rows than the update has
    assert fit.rows(512, 30_000) == 1  # at least one
    assert memory.started == 1


def test_a_first_update_of_fewer_than_8_rows_measures_what_it_ran():
    memory = FakeMemory()
    fit = MicroBatchFit(fraction=0.5, memory=memory)
    assert fit.rows(0, 200) == 8 and memory.started == 0  # no rows (online DPO, no pair): no start
    assert not fit.measure(grad_bytes=1e8)
    assert fit.rows(4, 200) == 8  # 4 rows: one micro-batch of 4
    fit.measure(grad_bytes=1e8)
    assert fit.tokens == 9_950  # 8e8 bytes for 4 x 200 tokens: 1e6 a token


def test_on_a_cpu_an_unset_micro_batch_size_is_8_and_never_fitted(tmp_path):
    args = replace(grpo.Args(), model_name_or_path="tiny-random", output_dir=str(tmp_path / "run"))
    assert args.micro_batch_size is None
    run = Run(args, grpo.check_args)
    # Run writes nothing into args: each file's derived block sets run.default_micro_batch there
    assert run.fit is None and args.micro_batch_size is None and run.default_micro_batch == 8
    assert run.micro_batch_size(64, 300) == 8
    given = replace(args, micro_batch_size=3)
    assert Run(given, grpo.check_args).micro_batch_size(64, 300) == 3


class NoRoom(FakeMemory):
    """A GPU whose first update peaked so high that later updates fit one row per micro-batch."""

    def peak(self):
        return 1e15

    def room(self):
        return 1e6


FILES = {"grpo": ["--num_prompts", "2", "--num_generations", "4"],
         "ppo": ["--num_prompts", "4", "--num_generations", "2"],
         "reinforce": ["--num_prompts", "2", "--num_generations", "4"],
         "reinforce_stepwise": ["--num_prompts", "2", "--num_generations", "2",
                                "--max_episode_steps", "2"],
         "online_dpo": ["--num_prompts", "4"],
         "tools": ["--num_prompts", "2", "--num_generations", "4"],
         "async_grpo": ["--num_prompts", "2", "--num_generations", "4"],
         "dapo": ["--num_prompts", "2", "--num_generations", "4", "--no_mask_truncated_completions"],
         "cispo": ["--num_prompts", "2", "--num_generations", "4"],
         "sapo": ["--num_prompts", "2", "--num_generations", "4"],
         "appo": ["--num_envs", "2", "--num_steps", "4"],
         "tppo": ["--num_envs", "2", "--num_steps", "4"],
         # a teacher equal to the student teaches nothing: the length reward moves the weights
         # tiny-random's tokens of arithmetic's worked lines: up to 22
         "sft": ["--num_prompts", "8", "--max_new_tokens", "24"],
         "distill": ["--num_prompts", "2", "--num_generations", "4", "--teacher_model_name_or_path",
                     "tiny-random", "--reward_weight", "1"]}


@pytest.mark.parametrize("file", ALGORITHMS)
def test_every_file_reads_its_micro_batch_from_run_each_update(tmp_path, monkeypatch, file):
    # The wiring in each file: the first update at 8 rows, then (a faked GPU with no room) 1 row per
    # micro-batch, read through run.micro_batch_size by the update and by the helpers that read
    # args.micro_batch_size. The weights after 2 updates are those of 8 rows throughout, up to
    # float rounding (a length reward, so that every update moves them).
    import importlib

    from safetensors.torch import load_file

    import run_with_test_reward
    from common.env import math_env as envlib
    from common.run import run as runlib
    from common.run.args import parse_args
    from common.models.loading import load_policy

    module = importlib.import_module(file)
    monkeypatch.setattr(envlib, "make_env", run_with_test_reward.make_env)
    argv = ["--model_name_or_path", "tiny-random", "--max_new_tokens", "8", "--max_steps", "2",
            "--num_eval_problems", "0", "--learning_rate", "1e-3", *FILES[file]]
    seen = []
    ask = runlib.Run.micro_batch_size

    def spy(self, rows, width):
        seen.append(ask(self, rows, width))
        return seen[-1]

    monkeypatch.setattr(runlib.Run, "micro_batch_size", spy)
    module.main(parse_args(module.Args, argv + ["--micro_batch_size", "8",
                                                "--output_dir", str(tmp_path / "eight")]))
    assert seen == [8, 8]
    seen.clear()
    monkeypatch.setattr(runlib, "fits_gpu_memory", lambda device, args: True)
    monkeypatch.setattr(runlib, "MicroBatchFit", lambda: MicroBatchFit(memory=NoRoom()))
    module.main(parse_args(module.Args, argv + ["--output_dir", str(tmp_path / "fitted")]))
    assert seen == [8, 1]
    a, b = (load_file(str(tmp_path / run / "checkpoint-2" / "model.safetensors"))
            for run in ("eight", "fitted"))
    start = load_policy("tiny-random").state_dict()
    assert max((a[n] - start[n]).abs().max().item() for n in a) > 1e-4  # the updates moved them
    # rounding, grown by AdamW on near-zero gradients: at most 2.6e-6 here (appo), 6e-8 in the
    # single-turn files; an Adam step at this learning rate moves a weight by up to 1e-3
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=2e-5, msg=name)
