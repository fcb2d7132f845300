"""Regenerate the fixed held-out test splits of the generated tasks (run from anywhere):

    python data/make_splits.py

writes data/arithmetic_test.jsonl (100 problems per difficulty level, 600 in all) and
data/countdown_test.jsonl (500 problems, 3 or 4 numbers). Level 6 came later: its problems are
drawn after countdown's, so that the files' older rows stayed as they were. The seed is fixed, so the files come out
byte-identical; the train split (make_env(..., split="train")) skips every question found here.
"""

import json
import random
import sys
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(DATA_DIR.parent))
from common.env.tasks import Arithmetic, Countdown  # noqa: E402

SEED = 1234  # fixed forever: changing it changes the benchmark
PER_LEVEL = 100
NUM_COUNTDOWN = 500


def unique(make, n):
    """n problems with distinct questions."""
    rows, seen = [], set()
    while len(rows) < n:
        ex = make()
        if ex["question"] not in seen:
            seen.add(ex["question"])
            rows.append(ex)
    return rows


def write(name, rows):
    with open(DATA_DIR / name, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    print(f"wrote {len(rows)} rows to data/{name}")


def main():
    rng = random.Random(SEED)
    arithmetic = []
    for level in range(1, 6):
        arithmetic += unique(lambda: Arithmetic.generate(rng, difficulty=level), PER_LEVEL)
    # Only the numbers, target and one solution are stored: the prompt text lives in common/env/tasks.py
    countdown = unique(lambda: Countdown.generate(rng), NUM_COUNTDOWN)
    write("countdown_test.jsonl", [{k: ex[k] for k in ("numbers", "target", "solution")} for ex in countdown])
    arithmetic += unique(lambda: Arithmetic.generate(rng, difficulty=6), PER_LEVEL)
    # the held-out rows keep their three fields: the worked line sft.py trains on is not graded
    write("arithmetic_test.jsonl", [{k: ex[k] for k in ("question", "answer", "level")}
                                    for ex in arithmetic])


if __name__ == "__main__":
    main()
