"""How long a batch of grades takes when some answers run to their budget, by sympy pool size.

    python bench/grading_pool.py                  # 64 answers, 8 of them runaways, pools of 1 and 2
    python bench/grading_pool.py --workers 1 2 4 --runaways 8

Each pool size runs in a fresh process (MATHRL_GRADER_WORKERS), which first starts every worker of
its pool, so that the figure is the grading and not sympy's import. Then 64 threads grade at once:
56 right answers that only sympy can decide and `--runaways` answers that sympy evaluates until the
1 s budget stops it. Printed: the batch's wall time and how many grades came out right. With one
worker every grade queues behind the runaways; with more, a runaway holds one worker.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the right answers the child can write: sqrt(k) + sqrt(3) for each k below 1000 not a square
RIGHT_ANSWERS = sum(1 for k in range(2, 1000) if int(k ** 0.5) ** 2 != k)
CHILD = r"""
import json, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from common.env import grader
n, runaways = int(sys.argv[1]), int(sys.argv[2])
slow = "\\exp(\\exp(\\exp(\\exp(99))))"
# start every worker: as many short runaways at once as there are workers
grader.TIMEOUT_S, size = 0.2, len(grader._POOL.workers)
with ThreadPoolExecutor(size) as pool:
    list(pool.map(lambda _: grader.math_equal(slow, "\\pi"), range(size)))
grader.TIMEOUT_S = 1.0
ks = [k for k in range(2, 1000) if int(k ** 0.5) ** 2 != k][:n - runaways]
cases = [(f"\\sqrt{{{k}}}+\\sqrt{{3}}", f"\\sqrt{{3}}+\\sqrt{{{k}}}") for k in ks]
cases += [(slow, "\\pi")] * runaways
cases = cases[::2] + cases[1::2]  # runaways among the others, not all at the end
barrier = threading.Barrier(n)
def grade(case):
    barrier.wait()
    return grader.math_equal(*case)
start = time.perf_counter()
with ThreadPoolExecutor(n) as pool:
    right = sum(pool.map(grade, cases))
print(json.dumps({"seconds": time.perf_counter() - start, "right": right}))
"""


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--answers", type=int, default=64)
    p.add_argument("--runaways", type=int, default=8)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = p.parse_args(argv)
    if not 0 <= args.runaways < args.answers:
        p.error("--runaways must be at least 0 and fewer than --answers")
    if args.answers - args.runaways > RIGHT_ANSWERS:  # the child's square roots run out
        p.error(f"at most {RIGHT_ANSWERS} answers that are not runaways")
    if min(args.workers) < 1:
        p.error("--workers: a pool has at least 1 worker")
    return args


def main():
    args = parse()
    print(f"{args.answers} answers graded from {args.answers} threads at once, {args.runaways} of "
          f"them runaways; {os.cpu_count()} CPU cores")
    print("| sympy workers | batch wall time | right |")
    print("|---|---|---|")
    for workers in args.workers:
        out = subprocess.run([sys.executable, "-c", CHILD, str(args.answers), str(args.runaways)],
                             cwd=ROOT, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "PYTHONPATH": str(ROOT),
                                  "MATHRL_GRADER_WORKERS": str(workers)})
        if out.returncode != 0:
            sys.exit(out.stderr[-2000:])
        result = json.loads(out.stdout.splitlines()[-1])
        print(f"| {workers} | {result['seconds']:.1f} s | {result['right']} of "
              f"{args.answers - args.runaways} |", flush=True)


if __name__ == "__main__":
    main()
