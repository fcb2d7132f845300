"""TRY NOT TO MODIFY: the run's plumbing, which a student may skip. None of it changes what an
update computes: the options and their checks, `Run` (processes, the seed, resuming, the schedule,
the gradients' mean over ranks and their clip, logs, the NaN guard, evaluation, checkpoints), and
the two processes of async_grpo.py. The ranks' collectives and seeds are the floor's
(common/distributed.py, named by common's own face).

The top of the four packages: env < models < rl < run. This face names what an algorithm file may
import; the modules read in this order:

    seed_flags, args                   the seeds' flag names; the options, parsed
    logger, plot, checks               logs and plots (python -m common.run.plot); option checks
    checkpoints, evaluation, pair      saving and resuming; held-out accuracy; two processes
    run                                `Run`, what every file's main calls
"""

from common.run.args import DataArgs, TrainArgs, parse_args
from common.run.checks import check_output_dir, check_ranges, check_unused
from common.run.evaluation import chosen_problems, problem_metrics, sample_problems
from common.run.logger import check_new_file, every, mean_of, replace_file
from common.run.pair import SampledAhead, saved_queue
from common.run.run import Run

__all__ = ["DataArgs", "Run", "SampledAhead", "TrainArgs", "check_new_file", "check_output_dir",
           "check_ranges", "check_unused", "chosen_problems", "every", "mean_of", "parse_args",
           "problem_metrics", "replace_file", "sample_problems", "saved_queue"]
