"""The figures docs/reading.md quotes, computed from the code (tests/test_docs.py checks the page):

- the lines of common/ a student reads to follow an algorithm file: a tiny run of the file (the
  tiny random model, 2 updates) under a call trace, counting every common/ definition that its
  rollout, advantage, loss and update code reach, transitively. Two runs: the plain path that the
  page teaches (`--plain`: `generate` with its plain `Decoder`, `token_logprobs`' own lines), and
  the default path, as `python grpo.py` runs it (the speedups of common/models/fast/ included).
  Both are real runs of the file, nothing patched.
- the lines of common/ the whole run enters (`whole_run`): the run a student starts,
  `main(parse_args(Args, argv))` of a tiny one-update `--plain` run, from parse_args' first line
  to main's return. Every function or method of common/ that the run calls is counted once, by
  its whole span, from its first decorator to its last line. A comprehension, a lambda or a
  function nested in a function is part of the function around it and adds nothing; a lambda
  outside any function (a table's row) is counted by its own lines. Class bodies are not code
  that runs, and a dataclass's generated __init__ has no lines, so neither counts.
- the core diff of two sibling files: `diff a.py b.py` without the module docstrings and without
  the lines tagged as a variant's (docs/reading.md, "Variants").

    python docs/reading.py                  # all three, for grpo.py and the sibling pairs
    python docs/reading.py --reach ppo      # the lines of common/ ppo.py's student reads
    python docs/reading.py --whole          # the whole run's figure, function by function
    python docs/reading.py --diffs          # the diffs only (no run)
"""

import argparse
import ast
import contextlib
import difflib
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ROOT / "common"
sys.path.insert(0, str(ROOT))
from dev.algorithms import ALGORITHMS, SHARED  # noqa: E402
from dev.algorithms import SIBLINGS as ALGORITHM_SIBLINGS  # noqa: E402
from dev.algorithms import VARIANTS as ALGORITHM_VARIANTS  # noqa: E402


def units(path):
    """[(name, first line, last line)] of what a student reads of a module, definition by
    definition: each top-level function, each method, and each class's own lines (its header,
    docstring and fields, without its methods)."""
    out = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((node.name, _start(node), node.end_lineno))
        elif isinstance(node, ast.ClassDef):
            methods = [n for n in node.body
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            out += [(f"{node.name}.{m.name}", _start(m), m.end_lineno) for m in methods]
            # the header (decorators and the class line), then every statement but the methods
            own = node.body[0].lineno - _start(node) + sum(
                n.end_lineno - n.lineno + 1 for n in node.body if n not in methods)
            out.append((node.name, _start(node), _start(node) + own - 1))  # a count, not a span
    return out


def _start(node):
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def _owner(path, line, table={}):
    """The unit of `path` whose lines hold `line` (a method before its class), or None."""
    if path not in table:
        table[path] = units(path)
    classes = {name.split(".")[0] for name, _, _ in table[path] if "." in name}
    spans = [(b - a, name, a, b) for name, a, b in table[path] if name not in classes]
    hits = sorted(s for s in spans if s[2] <= line <= s[3])
    return hits[0][1] if hits else None


def reached(algo, plain=True, extra=()):
    """{(module, unit): lines} of common/ that `algo`.py's rollout, advantage, loss and update code
    reach on a tiny run of 2 updates, on the plain path (--plain) or the default one. A module is
    named by its path under common/, without .py (models/sampler)."""
    module = importlib.import_module(algo)
    from common.run.args import parse_args

    source = (ROOT / f"{algo}.py").read_text().splitlines()
    first = next(i for i, line in enumerate(source, 1) if "# ---- rollout" in line)
    last = next(i for i, line in enumerate(source, 1) if "# ---- logging" in line)
    own_file, found, made = str(ROOT / f"{algo}.py"), set(), set()

    def on_path(frame):
        while frame is not None:
            name = frame.f_code.co_name
            # a comprehension or lambda is read where it stands: in the function around it
            if frame.f_code.co_filename == own_file and not name.startswith("<"):
                if name == "main":
                    return first <= frame.f_lineno < last
                return name not in ("check_args", "<module>")
            frame = frame.f_back
        return False

    def trace(frame, event, arg):
        path = frame.f_code.co_filename
        if event != "call":
            return
        if path.startswith(str(COMMON)) and on_path(frame):
            found.add((path, frame.f_code.co_firstlineno))
        elif frame.f_code.co_name == "__init__" and path == "<string>":  # a dataclass's own
            cls = type(frame.f_locals.get("self"))
            source = sys.modules[cls.__module__].__dict__.get("__file__") or ""
            if source.startswith(str(COMMON)) and on_path(frame):
                made.add((source, cls.__name__))

    with tempfile.TemporaryDirectory() as out:
        # fewer prompts, as the tracer slows every call: the units reached are the same as at the
        # default sizes (checked when this changed; shorter responses reach fewer of answers.py)
        args = parse_args(module.Args, ["--model_name_or_path", "tiny-random", "--max_steps", "2",
                                        "--no_eval_on_start", "--num_eval_problems", "1",
                                        "--num_prompts", "2", "--num_generations", "2",
                                        "--output_dir", out, *(["--plain"] if plain else []),
                                        *extra])
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            sys.settrace(trace)
            try:
                module.main(args)
            finally:
                sys.settrace(None)
    counted = {}
    for path, cls in made:  # a dataclass built on the path: its fields are read
        table = {n: (a, b) for n, a, b in units(Path(path))}
        counted[(module_name(path), cls)] = table[cls][1] - table[cls][0] + 1
    for path, line in found:
        name = _owner(Path(path), line)
        if name is None:
            continue
        table = {n: (a, b) for n, a, b in units(Path(path))}
        counted[(module_name(path), name)] = table[name][1] - table[name][0] + 1
        if "." in name:  # a method: its class's own lines are read too
            cls = name.split(".")[0]
            counted[(module_name(path), cls)] = table[cls][1] - table[cls][0] + 1
    return counted


def function_spans(path):
    """[(name, first line, last line)] of each function of a module that is not inside another
    function (a method is named Class.method), and of each lambda outside any function."""
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + child.name, _start(child), child.end_lineno))
            elif isinstance(child, ast.Lambda):
                out.append((f"{prefix}<lambda {child.lineno}>", child.lineno, child.end_lineno))
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text()), "")
    return out


def whole_run(algo="grpo"):
    """{(module, function): lines} of common/ that a tiny one-update `--plain` run of `algo`.py
    calls, from parse_args' first line to main's return (the module docstring's definition)."""
    module = importlib.import_module(algo)
    from common.run.args import parse_args

    called = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(str(COMMON)):
            called.add((frame.f_code.co_filename, frame.f_code.co_firstlineno))

    with tempfile.TemporaryDirectory() as out:
        argv = ["--model_name_or_path", "tiny-random", "--max_steps", "1", "--no_eval_on_start",
                "--num_eval_problems", "1", "--num_prompts", "2", "--num_generations", "2",
                "--output_dir", out, "--plain"]
        with contextlib.redirect_stdout(open(os.devnull, "w")):
            sys.setprofile(profile)
            threading.setprofile(profile)
            try:
                module.main(parse_args(module.Args, argv))
            finally:
                sys.setprofile(None)
                threading.setprofile(None)
    counted, spans = {}, {}
    for path, line in called:
        if path not in spans:
            spans[path] = function_spans(Path(path))
        # the outermost function whose lines hold the code's first line: a nested one's own
        hits = [(a, name, b) for name, a, b in spans[path] if a <= line <= b]
        if hits:
            a, name, b = min(hits)
            counted[(module_name(path), name)] = b - a + 1
    return counted


def whole_run_apart(algo="grpo"):
    """whole_run in a process of its own: a cache that an earlier run in this process filled
    (functools.lru_cache) would hide the calls it answers."""
    out = subprocess.run([sys.executable, __file__, "--reach", algo, "--whole", "--json"],
                         capture_output=True, text=True, check=True).stdout
    return {(m, name): n for m, name, n in json.loads(out.strip().splitlines()[-1])}


def module_name(path):
    """common/models/sampler.py -> models/sampler"""
    return str(Path(path).resolve().relative_to(COMMON).with_suffix(""))


def by_module(counted):
    """{module: lines} of a `reached` count."""
    lines = {}
    for (module, _), n in counted.items():
        lines[module] = lines.get(module, 0) + n
    return lines


# ------------------------------------------------------------------------------------------------
# Core diffs
# ------------------------------------------------------------------------------------------------
SIBLINGS = list(ALGORITHM_SIBLINGS)
# A line whose comment starts with one of these names and a colon belongs to that variant only
# ("# GSPO: one ratio per response"): the whole statement it starts is the variant's (a def, an if
# block, an Args field with the docstring under it). docs/reading.md, "Variants", says what each is.
VARIANTS = ALGORITHM_VARIANTS
TAG = re.compile(r"#\s*(" + "|".join(re.escape(v) for v in VARIANTS) + r"):")


def variant_lines(source):
    """The line numbers (1-based) of `source` that belong to a tagged variant: a tag at the end of
    a line takes the statement that starts there, a tag on a line of its own the next statement."""
    lines = source.splitlines()
    tagged = {i for i, line in enumerate(lines, 1) if TAG.search(line)}
    out = set(tagged)
    heads = set()  # the first line of each statement a tag takes
    for i in tagged:
        heads.add(i)
        if lines[i - 1].lstrip().startswith("#"):  # a comment line: the statement after it
            heads.add(next(j for j in range(i + 1, len(lines) + 1)
                           if lines[j - 1].strip() and not lines[j - 1].lstrip().startswith("#")))
    statements = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.stmt)]
    for node in statements:
        if _start(node) in heads or node.lineno in heads:
            end = node.end_lineno
            if isinstance(node, ast.If) and node.orelse:  # the variant's branch, and its `else:`
                end = node.orelse[0].lineno - 1
            out.update(range(_start(node), end + 1))
    for body in (n.body for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)):
        for field, doc in zip(body, body[1:]):  # an Args field's docstring goes with it
            if (isinstance(field, ast.AnnAssign) and field.lineno in out
                    and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)):
                out.update(range(doc.lineno, doc.end_lineno + 1))
    return out


def unheld(algo):
    """The lines of `algo`.py that it shares with grpo.py word for word (diff's common lines, blank
    lines left out) and that no copy test holds: outside every unit dev/algorithms.py's SHARED
    says the file holds (tests/test_layers.py holds those to one text)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_layers import unit_span

    ref = (ROOT / "grpo.py").read_text().splitlines()
    source = (ROOT / f"{algo}.py").read_text()
    lines, held = source.splitlines(), set()
    for unit, holders in SHARED:
        span = unit_span(source, unit) if algo in holders else None
        if span:
            held.update(range(span[0] - 1, span[1]))
    common = set()
    for _, b, size in difflib.SequenceMatcher(None, ref, lines, autojunk=False).get_matching_blocks():
        common.update(b + k for k in range(size) if lines[b + k].strip())
    return len(common - held)


def core(path):
    """The lines of an algorithm file a core diff compares: no module docstring, no variant's, no
    blank line."""
    source = path.read_text()
    tree = ast.parse(source)
    first = tree.body[0].end_lineno if ast.get_docstring(tree) else 0
    drop = variant_lines(source)
    return [line for i, line in enumerate(source.splitlines(), 1)
            if i > first and i not in drop and line.strip()]  # blank lines are no code


def core_diff(a, b):
    """Lines that differ between the cores of a.py and b.py (diff's < and > lines)."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in (a, b):
            Path(tmp, name).write_text("\n".join(core(ROOT / f"{name}.py")) + "\n")
        out = subprocess.run(["diff", "-b", a, b], cwd=tmp, capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if line[:1] in "<>")


def plain_diff(a, b):
    """Lines that differ between a.py and b.py, as `diff a.py b.py` shows them."""
    out = subprocess.run(["diff", f"{a}.py", f"{b}.py"], cwd=ROOT, capture_output=True,
                         text=True).stdout
    return sum(1 for line in out.splitlines() if line[:1] in "<>")


def speedup_lines():
    """{module: lines} of the speedup modules, common/models/fast/*.py."""
    return {p.stem: len(p.read_text().splitlines())
            for p in sorted((COMMON / "models/fast").glob("*.py")) if p.stem != "__init__"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reach", default="grpo", help="the algorithm file to trace")
    parser.add_argument("--diffs", action="store_true", help="only the core diffs (no run)")
    parser.add_argument("--whole", action="store_true",
                        help="only the whole run's figure, by module and by function")
    parser.add_argument("--json", action="store_true", help="the figures as one JSON line")
    args = parser.parse_args()
    if args.whole and args.json:  # whole_run_apart's child
        print(json.dumps([[m, name, n] for (m, name), n in sorted(whole_run(args.reach).items())]))
        return
    if args.whole:
        whole = whole_run(args.reach)
        for module, lines in sorted(by_module(whole).items(), key=lambda m: -m[1]):
            defs = sorted(((n, name) for (m, name), n in whole.items() if m == module),
                          reverse=True)
            print(f"common/{module}.py: {lines} lines in {len(defs)}: "
                  + ", ".join(f"{name} {n}" for n, name in defs))
        print(f"the whole run calls {len(whole)} functions of common/: "
              f"{sum(whole.values()):,} lines")
        return
    if args.json:  # what tests/test_docs.py checks the page against
        whole = whole_run_apart(args.reach)
        print(json.dumps({"reached": by_module(reached(args.reach)),
                          "default": by_module(reached(args.reach, plain=False)),
                          "whole": by_module(whole), "whole_functions": len(whole),
                          "speedups": speedup_lines(),
                          "diffs": [[a, b, plain_diff(a, b), core_diff(a, b)]
                                    for a, b in SIBLINGS],
                          "unheld": {a: unheld(a) for a in ALGORITHMS if a != "grpo"}}))
        return
    for a, b in SIBLINGS:
        print(f"{a}.py -> {b}.py: {plain_diff(a, b)} lines differ, {core_diff(a, b)} in the cores")
    free = {a: unheld(a) for a in ALGORITHMS if a != "grpo"}
    print(f"lines shared word for word with grpo.py that no copy test holds: {sum(free.values())} "
          f"({', '.join(f'{a} {n}' for a, n in free.items())})")
    if args.diffs:
        return
    counted = reached(args.reach)
    units_of = {}
    for (module, name), lines in sorted(counted.items()):
        units_of.setdefault(module, []).append((name, lines))
    for module, defs in sorted(units_of.items()):
        print(f"common/{module}.py: {sum(n for _, n in defs)} lines: "
              + ", ".join(f"{name} {n}" for name, n in defs))
    print(f"{args.reach}.py reaches {sum(counted.values())} lines of common/ on the plain path "
          f"(--plain)")
    default = by_module(reached(args.reach, plain=False))
    print(f"and {sum(default.values())} on the default path, as `python {args.reach}.py` runs: "
          + ", ".join(f"{m} {n}" for m, n in sorted(default.items())))
    whole = whole_run_apart(args.reach)
    print(f"and {sum(whole.values()):,} on the whole run (parse_args to the last checkpoint, "
          f"--plain, one update): {len(whole)} functions of common/ called")
    fast = speedup_lines()
    print(f"the speedups beside it: {sum(fast.values())} lines in {len(fast)} modules")


if __name__ == "__main__":
    main()
