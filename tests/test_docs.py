"""Docs that cannot drift from the code: every link to a code line points at the line that defines what it
names (docs/links.py), every command line in the docs and in the files' docstrings parses with that file's
own options, and no line of the library runs past 100 characters."""

import ast
import importlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dev.algorithms import ALGORITHMS
from common.run.args import parse_args

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = [*(f"{a}.py" for a in ALGORITHMS), "eval.py",
           *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "common").rglob("*.py")))]


def test_links_to_code_lines_are_current():
    out = subprocess.run([sys.executable, "docs/links.py"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, "stale links (python docs/links.py --fix rewrites them):\n" + out.stdout
    text = "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    assert len(re.findall(r"\]\(\.\./\w+\.py#L\d+\)", text)) >= 30  # the pages do link to lines


def command_lines():
    """(source, file, argv) of every `python X.py ...` / `torchrun ... X.py ...` line in the docs, the README
    and the algorithm files' docstrings, with backslash continuations joined."""
    found = []
    sources = [*(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    sources += [ROOT / f for f in [*(f"{a}.py" for a in ALGORITHMS), "eval.py"]]
    for path in sources:
        text = path.read_text()
        if path.suffix == ".py":
            text = text[:text.index('"""', 3)].replace("\\\\\n", "\\\n")
        text = re.sub(r"\\\n\s*", " ", text)
        for line in text.splitlines():
            m = re.search(rf"(?:python|torchrun[^#]*?)\s+({'|'.join([*ALGORITHMS, 'eval'])})\.py((?:\s+[^#`|]*)?)",
                          line)
            if not m or "..." in m.group(2) or "$" in m.group(2):
                continue
            found.append((path.name, m.group(1), shlex.split(m.group(2))))
    return found


def test_the_docs_hold_the_command_lines_they_should():
    files = {f for _, f, _ in command_lines()}
    assert set(ALGORITHMS) <= files and len(command_lines()) >= 40


@pytest.mark.parametrize("source,algo,argv", command_lines(), ids=lambda x: x if isinstance(x, str) else None)
def test_every_command_line_parses(source, algo, argv, capsys):
    module = importlib.import_module(algo)
    parse_args(module.Args, argv)  # an unknown flag or a bad value exits here


# CleanRL's density, for a file a reader reads whole: on average at most 56 characters a non-blank
# line (CleanRL's ppo.py 46.6, nanoGPT's train.py 47.0, nanochat 55.9), at most 25 lines past 88,
# and no comment pushed onto a line past 88 (a line of code is read alone).
MOST_CHARACTERS_A_LINE, MOST_LONG_LINES, LONG = 56, 25, 88


def density(text):
    """(mean characters a non-blank line, lines past LONG, those of them that end in a comment)
    of a source."""
    lines = [line for line in text.splitlines() if line.strip()]
    long = [line for line in lines if len(line) > LONG]
    commented = [line for line in long if "  # " in line and not line.lstrip().startswith("#")]
    return sum(map(len, lines)) / len(lines), len(long), len(commented)


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_each_algorithm_file_is_as_dense_as_cleanrl(algo):
    mean, long, commented = density((ROOT / f"{algo}.py").read_text())
    assert mean <= MOST_CHARACTERS_A_LINE and long <= MOST_LONG_LINES and commented == 0, (
        f"{algo}.py: {mean:.1f} characters a line, {long} lines past {LONG}, {commented} with "
        "a comment pushed onto them")


def test_density_counts_by_hand():
    text = "x = 1\n\n" + "y" * 90 + "  # why\n" + "# " + "z" * 98 + "\n"
    assert density(text) == ((5 + 97 + 100) / 3, 2, 1)


@pytest.mark.parametrize("path", LIBRARY)
def test_lines_are_at_most_100_characters(path):
    long = [i for i, line in enumerate((ROOT / path).read_text().splitlines(), 1) if len(line) > 100]
    assert not long, f"{path}: lines {long[:10]} run past 100 characters"


def changed_lines(a, b):
    out = subprocess.run(["diff", f"{a}.py", f"{b}.py"], cwd=ROOT, capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if line[:1] in "<>")


def names_imported_from_common(file):
    """How many names `file` imports from common/ modules."""
    tree = ast.parse((ROOT / file).read_text())
    return sum(len(node.names) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and (node.module or "").startswith("common"))


def test_the_import_count_the_reading_page_quotes_is_current():
    # tests/test_layers.py holds grpo.py to at most 20 names (issue 65); the page says how many
    text = (ROOT / "docs/reading.md").read_text()
    m = re.search(r"`grpo.py` imports (\d+) names from the four packages", text)
    assert int(m.group(1)) == names_imported_from_common("grpo.py")


@pytest.mark.slow  # the second tier: three traced runs
def test_the_reading_page_quotes_the_lines_a_student_reads_and_the_core_diffs():
    # docs/reading.py traces three real runs of grpo.py, --plain and the default, and the whole
    # --plain run; issue 65: the plain path at most 600 lines (the verifier's rules have brought
    # it to 595: the next line the plain path gains needs one taken out)
    out = subprocess.run([sys.executable, "docs/reading.py", "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    text = (ROOT / "docs/reading.md").read_text()
    total, default = sum(figures["reached"].values()), sum(figures["default"].values())
    assert total <= 600
    assert f"## To follow GRPO: {total} lines of `common/`" in text and f"That is {total} lines" in text
    assert f"The default path, `python grpo.py` as it runs, reaches {default:,} lines" in text
    # issue 76: the whole --plain run, parse_args included, each function it calls once
    whole, functions = sum(figures["whole"].values()), figures["whole_functions"]
    assert re.search(rf"calls {functions} functions of `common/` that hold {whole:,} lines",
                     " ".join(text.split()))
    rows = re.findall(r"^\| \[`common/([\w/]+)\.py`\]\([^)]*\) \| (\d+) \|", text, re.M)
    assert {module: int(n) for module, n in rows} == figures["reached"]
    fast = sum(figures["speedups"].values())
    n = len(figures["speedups"])
    assert text.count(f"({fast} lines in {WORDS[n]} modules)") == 2
    for a, b, plain, core in figures["diffs"]:
        assert re.search(rf"^\| {a}\.py → {b}\.py \| {plain} \| {core} \|$", text, re.M), (a, b)
    # issue 76: the lines the files share with grpo.py word for word that no copy test holds, at
    # most 400 for the RL files; sft.py's (its Args fields, imports and setup lines, ~50) are
    # counted too, as it holds no copy of grpo.py's helpers
    unheld = sum(figures["unheld"].values())
    assert unheld <= 460 and f"no copy test holds, {unheld} in all" in " ".join(text.split())


def test_the_diff_counts_the_docs_quote_are_current():
    quoted = 0
    for page in (ROOT / "docs").glob("*.md"):
        for a, b, n in re.findall(r"`diff (\w+)\.py (\w+)\.py`(?::| is) (\d+)", page.read_text()):
            assert int(n) == changed_lines(a, b), f"docs/{page.name} quotes {n} lines for diff {a}.py {b}.py"
            quoted += 1
    # the side-by-side table of docs/README.md: a column per algorithm file, in its own order
    text = (ROOT / "docs/README.md").read_text()
    columns = re.findall(r"\[`(\w+)\.py`\]", re.search(r"^\| \| \[`.*$", text, re.M).group(0))
    assert sorted(columns) == sorted(ALGORITHMS)
    row = re.search(r"^\| `diff grpo.py X.py` lines \|(.*)\|$", text, re.M).group(1)
    assert [cell.strip() for cell in row.split("|")] == [
        "—" if x == "grpo" else str(changed_lines("grpo", x)) for x in columns]
    assert quoted >= 5


# ---- the counts the docs state ------------------------------------------------------------
WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
         "fifteen").split()
# A number of files from four up counts the algorithm files: fewer are a pair or a few named
# beside it ("the two stepwise files"). So does "all six" opening a table cell (the vocabulary's
# column of files); a digit counts them only as "N algorithm files" ("MATH-500 files" are data).
FILES_COUNT = re.compile(rf"\b({'|'.join(WORDS[4:])})\s+(?:algorithm\s+)?files\b"
                         rf"|(?<=\| )all\s+({'|'.join(WORDS[4:])})\b"
                         r"|\b(\d+)\s+algorithm\s+files\b", re.I)
# "`grpo.py` is 379 lines", "grpo.py (384 lines)", "[`common/run/run.py`](../common/run/run.py) (224 lines)"
LINE_COUNT = re.compile(r"`([\w/.-]+\.py)` is (\d[\d,]*) lines\b"
                        r"|([\w/.-]+\.py)`?(?:\]\([^)\s]*\))?\s+\((\d[\d,]*) lines[),;]")
# the pages, and the docstrings and comments of every script and module
COUNTED = ["README.md", "docs/*.md", "dev/README.md", "*.py", "common/**/*.py", "bench/*.py",
           "dev/*.py", "dev/lab/*.py"]


def stale_counts(texts):
    """'path:line: ...' for each count of the algorithm files in `texts` ({path: text}) that is not
    len(ALGORITHMS), and each line count of a file of this tree that is not the file's own."""
    stale = []
    for path, text in sorted(texts.items()):
        for m in FILES_COUNT.finditer(text):
            word = (m.group(1) or m.group(2) or m.group(3)).lower()
            n = int(word) if word.isdigit() else WORDS.index(word)
            if n != len(ALGORITHMS):
                line = text.count("\n", 0, m.start()) + 1
                stale.append(f"{path}:{line}: '{' '.join(m.group(0).split())}', but there are "
                             f"{len(ALGORITHMS)} algorithm files")
        for m in LINE_COUNT.finditer(text):
            name, quoted = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            file = next((f for f in (ROOT / name, ROOT / "common" / name) if f.is_file()), None)
            if file is None:  # a seed's file, or one of another repository: not ours to count
                continue
            lines = len(file.read_text().splitlines())
            if int(quoted.replace(",", "")) != lines:
                line = text.count("\n", 0, m.start()) + 1
                stale.append(f"{path}:{line}: {name} is quoted at {quoted} lines; it has {lines}")
    return stale


def test_the_list_of_algorithm_files_is_the_files_at_the_root():
    # every script at the root but eval.py is an algorithm file, and dev/algorithms.py lists it
    assert sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "eval") == sorted(ALGORITHMS)


def test_the_docs_count_the_algorithm_files_and_their_lines_right():
    texts = {str(p.relative_to(ROOT)): p.read_text()
             for pattern in COUNTED for p in ROOT.glob(pattern)}
    assert stale_counts(texts) == []


def test_the_readmes_tests_are_the_two_tiers_and_no_figure_to_go_stale():
    readme = (ROOT / "README.md").read_text()
    section = re.search(r"^## Tests\n(.*?)(?=^## |\Z)", readme, re.M | re.S).group(1)
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert commands == ["python -m pytest -q -n 2", "python -m pytest -q -n 2 -m slow"]
    # how many tests and how long they take change with every round: the section states neither
    assert not re.search(r"\d[\d,]* (?:tests|min\b|minutes|long runs)", section), section


def test_a_planted_stale_count_fails():
    n, grpo_lines = len(ALGORITHMS), len((ROOT / "grpo.py").read_text().splitlines())
    texts = {"docs/x.md": f"One name in all {WORDS[n - 1]}\n  files, `grpo.py` is {grpo_lines} "
                          f"lines.\n[`common/run/run.py`](../common/run/run.py) (3 lines), grpo.py "
                          f"({grpo_lines + 1} lines); the two stepwise files, {n + 1} algorithm "
                          f"files\n| `seed` | all {WORDS[n]}, eval |\n"
                          f"| `beta` | all {WORDS[n + 1]} |\n",
             "bench/y.py": f"# the {WORDS[n]} files, MATH-500 files, levels 1..5 (all five), in "
                           "all four seeds\n"}
    run_lines = len((ROOT / "common/run/run.py").read_text().splitlines())
    assert stale_counts(texts) == [
        f"docs/x.md:1: '{WORDS[n - 1]} files', but there are {n} algorithm files",
        f"docs/x.md:3: '{n + 1} algorithm files', but there are {n} algorithm files",
        f"docs/x.md:5: 'all {WORDS[n + 1]}', but there are {n} algorithm files",
        f"docs/x.md:3: common/run/run.py is quoted at 3 lines; it has {run_lines}",
        f"docs/x.md:3: grpo.py is quoted at {grpo_lines + 1} lines; it has {grpo_lines}",
    ]


# ---- the README's layout: the one list of what is at the root ----------------------------
def top_level(path):
    """The entry at the repository's root that a path names: `common/env/` -> `common/`."""
    head, slash, _ = path.partition("/")
    return head + slash


def named_by_the_readme():
    """{top-level entry: the path as written} of the first column of the README's tables: the
    algorithm files' table and the Layout."""
    paths = [path for line in (ROOT / "README.md").read_text().splitlines()
             if line.startswith("| ") for path in re.findall(r"`([^`]+)`", line.split(" | ")[0])]
    return {top_level(path): path for path in paths}


def test_the_readme_names_only_paths_that_are_there():
    layout = re.search(r"^## Layout\n(.*?)^## ", (ROOT / "README.md").read_text(), re.M | re.S)
    assert layout and "| path |" in layout.group(1)
    for path in named_by_the_readme().values():
        assert list(ROOT.glob(path.rstrip("/"))), f"README.md names {path}, which is not there"


def test_every_entry_a_user_meets_at_the_root_is_in_the_readme():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    tracked = {top_level(path) for path in out.stdout.splitlines()
               if (ROOT / path).exists()}  # a file deleted but not yet committed is gone
    # the page itself, pytest's settings and the dot-files (CI, .gitignore) are not met by a user
    met = {entry for entry in tracked if not entry.startswith(".")} - {"README.md", "pytest.ini"}
    missing = met - set(named_by_the_readme())
    assert not missing, f"{sorted(missing)}: add to README.md's Layout"
    assert {f"{a}.py" for a in ALGORITHMS} <= met


def test_docs_holds_the_pages_a_reader_uses_and_no_others():
    # measurement logs, raw device files and research notes belong in dev/notes/, not on the shelf
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    algorithm_pages = {f"{a}.md" for a in ALGORITHMS}
    assert algorithm_pages <= pages
    assert pages - algorithm_pages == {"README.md", "reading.md", "course.md", "your_own_task.md",
                                       "results.md", "gpu.md", "thinking.md"}
