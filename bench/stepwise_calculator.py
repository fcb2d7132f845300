"""Does reinforce_stepwise.py's calculator help a model, and does it get used? Greedy stepwise episodes,
three ways.

On the same held-out problems, with the same --num_few_shot worked examples in the prompt, play
greedy stepwise episodes (reinforce_stepwise.py's: one line per action) in three settings and print,
per setting, accuracy, calculator values written and refused per episode, lines per episode and
seconds:

    no calculator          reinforce_stepwise.py
    calculator, plain      --sym_calc, but the few-shot solutions without their <<expr>> spans (the system prompt
                           alone asks for the syntax; this is how --sym_calc prompted before the
                           spans were kept)
    calculator, annotated  --sym_calc as it is: the worked examples show "4 * 7 = <<4*7>>28"

    python bench/stepwise_calculator.py                               # arithmetic levels 1-2, 200 problems
    python bench/stepwise_calculator.py --difficulty mixed                          # levels 1-5
    python bench/stepwise_calculator.py --dataset_name gsm8k --eval_dataset_path ../shared/data/gsm8k_test.jsonl \\
        --num_problems 50 --batch_size 50                                            # 18 min on 2 cores
    python bench/stepwise_calculator.py --model_name_or_path tiny-random --num_problems 4 --max_new_tokens 8
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common.env.math_env import make_env  # noqa: E402
from common.models.loading import load_policy, load_tokenizer  # noqa: E402
from common.models.sampler import eos_token_ids  # noqa: E402
from common.env.stepwise import stepwise_system_prompt  # noqa: E402
from common.models.stepwise import play_episodes, policy_sampler  # noqa: E402

SETTINGS = {  # name -> (--sym_calc, few-shot solutions keep their <<expr>> spans)
    "no calculator": (False, False),
    "calculator, plain": (True, False),
    "calculator, annotated": (True, True),
}


def episodes_env(args, sym_calc, calc_annotations):
    """The held-out stepwise env of one setting."""
    task_options = {"difficulty": args.difficulty} if args.dataset_name == "arithmetic" else {}
    return make_env(args.dataset_name, "test", path=args.eval_dataset_path,
                    num_few_shot=args.num_few_shot,
                    **task_options, stepwise=True, max_steps=args.max_episode_steps,
                    calc_annotations=calc_annotations,
                    system_prompt=stepwise_system_prompt(args.dataset_name, sym_calc))


def play(policy, tokenizer, args, name, sym_calc, calc_annotations):
    """Greedy stepwise episodes on --num_problems held-out problems: means per episode."""
    env = episodes_env(args, sym_calc, calc_annotations)
    sample = policy_sampler(policy, tokenizer, 0.0, 1.0, None, sym_calc)
    eos_ids = set(eos_token_ids(policy, tokenizer))
    # the fixed subset that reinforce_stepwise.py's own evaluation plays, so update 0 of a run is comparable
    chosen = torch.randperm(len(env),
                            generator=torch.Generator().manual_seed(0))[:args.num_problems]
    indices = sorted(chosen.tolist())
    totals = {"correct": 0.0, "fired": 0.0, "refused": 0.0, "lines": 0.0}
    start, bar = time.time(), tqdm(total=len(indices), desc=name, unit="problem")
    for i in range(0, len(indices), args.batch_size):
        chunk = indices[i:i + args.batch_size]
        ro = play_episodes(sample, tokenizer, env, chunk, 1, args.max_new_tokens, sym_calc,
                           policy.device, eos_ids)
        totals["correct"] += ro.correct.sum().item()
        totals["fired"] += ro.calc_fired * len(chunk)  # the rollout reports per-episode means
        totals["refused"] += ro.calc_refused * len(chunk)
        totals["lines"] += ro.step_mask.sum().item()
        bar.update(len(chunk))
    bar.close()
    n = len(indices)
    return {"accuracy": totals["correct"] / n, "calc_fired": totals["fired"] / n,
            "calc_refused": totals["refused"] / n,
            "lines": totals["lines"] / n, "seconds": round(time.time() - start, 1), "problems": n}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_name_or_path", default="SmolLM2-135M-Instruct")
    p.add_argument("--dataset_name", default="arithmetic")
    p.add_argument("--eval_dataset_path", default=None,
                   help="held-out file (default: the task's test split)")
    p.add_argument("--difficulty", default="1-2",
                   help="arithmetic only: levels, as reinforce_stepwise.py's --difficulty")
    p.add_argument("--num_problems", type=int, default=200)
    p.add_argument("--num_few_shot", type=int, default=2)
    p.add_argument("--max_new_tokens", type=int, default=64, help="tokens per line")
    p.add_argument("--max_episode_steps", type=int, default=10)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--output", default=None, help="also write the rows as JSON lines here")
    args = p.parse_args(argv)
    least = {"num_problems": 1, "num_few_shot": 0, "max_new_tokens": 1, "max_episode_steps": 1,
             "batch_size": 1}
    for name, low in least.items():
        if getattr(args, name) < low:
            p.error(f"--{name} must be at least {low}")
    return args


def main():
    args = parse()
    torch.manual_seed(0)
    policy, tokenizer = load_policy(args.model_name_or_path), load_tokenizer(args.model_name_or_path)
    policy.eval()
    rows = []
    for name, (sym_calc, annotated) in SETTINGS.items():
        row = {"setting": name, **play(policy, tokenizer, args, name, sym_calc, annotated)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.output:
        Path(args.output).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
