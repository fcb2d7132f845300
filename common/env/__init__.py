"""The env: what a problem is and what a response scores. Tasks and their data files, the final
answer found and read, MATH answers graded in a time-bounded worker, the tools a response may call,
your own reward functions, `MathEnv`, which puts a problem in a prompt and grades a response, and
the order in which a run takes the problems.

Torch-free, and the lowest of the four packages: env < models < rl < run. This face names what an
algorithm file may import; the modules below it read in this order:

    timelimit, grader_worker, grader           time limits, MATH grading and its worker
    answers, tasks, rewards, toolbox           final answers, tasks, your reward functions, tools
    reasoning                                  a thinking model's reasoning block, graded past
    math_env                                   MathEnv; the problems' order; the command line's
                                               data options made envs
    stepwise                                   stepwise episodes side by side; the calculator
"""

from common.env.answers import to_number
from common.env.grader import normalize
from common.env.math_env import (MATH_SUBJECTS, MathEnv, eval_set_env, eval_set_name,
                                 filter_math, make_env, make_env_options, make_envs,
                                 make_eval_sets, prompt_indices, resolve_task, verify)
from common.env.reasoning import THINK_TAGS, Reasoning, declared_tags
from common.env.stepwise import StepwiseEnvs, calculator, stepwise_system_prompt
from common.env.tasks import TASKS, grade, named_rows, read_rows, rename_fields
from common.env.toolbox import (answer_call, find_call, output_text, parse_tools, run_tool,
                                show_tools, stop_strings, tool_schema)

__all__ = ["MATH_SUBJECTS", "MathEnv", "Reasoning", "StepwiseEnvs", "TASKS", "THINK_TAGS",
           "answer_call", "calculator", "declared_tags", "eval_set_env", "eval_set_name",
           "filter_math", "find_call", "grade", "make_env",
           "make_env_options", "make_envs", "make_eval_sets", "named_rows", "normalize",
           "output_text", "parse_tools", "prompt_indices", "read_rows", "rename_fields",
           "resolve_task", "run_tool", "show_tools", "stepwise_system_prompt", "stop_strings",
           "to_number", "tool_schema", "verify"]
