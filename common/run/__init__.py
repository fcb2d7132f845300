"""TRY NOT TO MODIFY: the run's plumbing, which a student may skip. None of it changes what an
update computes: the options and their checks, `Run` (processes, the seed, resuming, the schedule,
the gradients' mean over ranks and their clip, logs, the NaN guard, evaluation, checkpoints), and
the two processes of async_grpo.py. The ranks' collectives and seeds live in
common/models/distributed.py, below the models that use them; a file takes the few it calls from
here.

The top of the four packages: env < models < rl < run. This face names what an algorithm file may
import; the modules read in this order:

    algorithms, seed_flags, args       the algorithm files and their families; the seeds' flag
                                       names; the options, parsed
    logger, plot, checks               logs and plots (python -m common.run.plot); option checks
    checkpoints, evaluation, pair      saving and resuming; held-out accuracy; two processes
    run                                `Run`, what every file's main calls
"""

from common.models.distributed import (all_gather_objects, all_reduce_mean, all_reduce_sum,
                                       init_distributed, print0, prompt_indices, sample_seed,
                                       set_seed)
from common.run.args import DataArgs, TrainArgs, parse_args
from common.run.checks import check_output_dir, check_ranges, check_unused
from common.run.evaluation import chosen_problems, problem_metrics, sample_problems
from common.run.logger import check_new_file, every, mean_of, replace_file
from common.run.pair import SampledAhead, saved_queue
from common.run.run import Run

__all__ = ["DataArgs", "Run", "SampledAhead", "TrainArgs", "all_gather_objects",
           "all_reduce_mean", "all_reduce_sum", "check_new_file", "check_output_dir",
           "check_ranges", "check_unused", "chosen_problems", "every", "init_distributed",
           "mean_of", "parse_args", "print0", "problem_metrics", "prompt_indices", "replace_file",
           "sample_problems", "sample_seed", "saved_queue", "set_seed"]
