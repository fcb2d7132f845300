"""--micro_batch_size left unset: 8 rows on a CPU (and under --fsdp); on a GPU, 8 in the first
update, then as many rows as half of the free memory holds at the cost per token the first update
measured (common/run.py, MicroBatchFit). The GPU's memory is faked here with hand-picked numbers;
that a different micro-batch gives the same update is tests/test_grpo.py's 1 x 8 = 8 x 1."""

from dataclasses import replace

import grpo
from common.run import DEFAULT_MICRO_BATCH, MicroBatchFit, Run


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
    assert run.fit is None and args.micro_batch_size == 8
    assert run.micro_batch_size(64, 300) == 8
    given = replace(args, micro_batch_size=3)
    assert Run(given, grpo.check_args).micro_batch_size(64, 300) == 3
