"""Docs that cannot drift from the code: every link to a code line points at the line that defines what it
names (docs/links.py), every command line in the docs and in the files' docstrings parses with that file's
own options, and no line of the library runs past 100 characters."""

import ast
import importlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from common.args import parse_args

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ["grpo", "ppo", "reinforce", "appo", "tppo", "online_dpo"]
LIBRARY = [*(f"{a}.py" for a in ALGOS), "eval.py", *(str(p.relative_to(ROOT)) for p in (ROOT / "common").glob("*.py"))]


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
    sources += [ROOT / f for f in [*(f"{a}.py" for a in ALGOS), "eval.py"]]
    for path in sources:
        text = path.read_text()
        if path.suffix == ".py":
            text = text[:text.index('"""', 3)].replace("\\\\\n", "\\\n")
        text = re.sub(r"\\\n\s*", " ", text)
        for line in text.splitlines():
            m = re.search(r"(?:python|torchrun[^#]*?)\s+(grpo|ppo|reinforce|appo|tppo|online_dpo|eval)\.py((?:\s+[^#`|]*)?)", line)
            if not m or "..." in m.group(2) or "$" in m.group(2):
                continue
            found.append((path.name, m.group(1), shlex.split(m.group(2))))
    return found


def test_the_docs_hold_the_command_lines_they_should():
    files = {f for _, f, _ in command_lines()}
    assert set(ALGOS) <= files and len(command_lines()) >= 40


@pytest.mark.parametrize("source,algo,argv", command_lines(), ids=lambda x: x if isinstance(x, str) else None)
def test_every_command_line_parses(source, algo, argv, capsys):
    module = importlib.import_module(algo)
    parse_args(module.Args, argv)  # an unknown flag or a bad value exits here


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


def test_the_import_counts_the_reading_page_quotes_are_current():
    # issue 34's aims were at most 25 names for grpo.py and 30 for ppo.py; the page says how many
    text = (ROOT / "docs/reading.md").read_text()
    m = re.search(r"`grpo.py` imports (\d+) names from `common/`,\s+`ppo.py` (\d+)", text)
    assert [int(n) for n in m.groups()] == [names_imported_from_common(f)
                                            for f in ("grpo.py", "ppo.py")]


def definition_lines(file, names=None):
    """Lines of the top-level definitions `names` of `file` (decorators included), or of all of them."""
    tree = ast.parse((ROOT / file).read_text())
    sizes = {node.name: node.end_lineno - min([node.lineno] + [d.lineno for d in node.decorator_list]) + 1
             for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    missing = set(names or ()) - set(sizes)
    assert not missing, f"docs/reading.md names {sorted(missing)}, which {file} does not define"
    return sum(sizes[n] for n in names) if names else sum(sizes.values())


def test_the_line_counts_of_the_reading_page_are_current():
    # the note of issue 34 quotes these: the lines of common/ a student reads to follow GRPO, by file
    text = (ROOT / "docs/reading.md").read_text()
    rows = re.findall(r"^\| \d \| \[`([\w/]+\.py)`\]\([^)]*\)(.*?) \| ([\d,]+)(?: of ([\d,]+))? \|", text, re.M)
    assert [r[0] for r in rows][:2] == ["grpo.py", "common/numerics.py"] and len(rows) == 7
    total = 0
    for file, read, part, whole in rows:
        lines = len((ROOT / file).read_text().splitlines())
        if file == "grpo.py":  # the whole file
            assert int(part) == lines, f"docs/reading.md: grpo.py has {lines} lines"
            continue
        # names in parentheses say which parts of a class matter; the class is counted whole
        names = re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", read))
        assert (int(part), int(whole)) == (definition_lines(file, names), lines), file
        total += int(part)
    assert f"That is {total} lines" in text
    for file, quoted in re.findall(r"\[`(common/\w+\.py)`\]\([^)]*\) \((\d+) lines\)", text):
        assert int(quoted) == len((ROOT / file).read_text().splitlines()), file
    fast = sum(len(p.read_text().splitlines()) for p in (ROOT / "common").glob("fast_*.py"))
    assert f"`common/fast_*.py` modules ({fast} lines in all)" in text
    assert len(list((ROOT / "common").glob("fast_*.py"))) == 7  # fast_sampler.py and six more


def test_the_diff_counts_the_docs_quote_are_current():
    quoted = 0
    for page in (ROOT / "docs").glob("*.md"):
        for a, b, n in re.findall(r"`diff (\w+)\.py (\w+)\.py`(?::| is) (\d+)", page.read_text()):
            assert int(n) == changed_lines(a, b), f"docs/{page.name} quotes {n} lines for diff {a}.py {b}.py"
            quoted += 1
    row = re.search(r"\| `diff grpo.py X.py` lines \| (\d+) \| — \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|",
                    (ROOT / "docs/README.md").read_text())
    assert [int(n) for n in row.groups()] == [changed_lines("grpo", x)
                                              for x in ("reinforce", "ppo", "appo", "tppo", "online_dpo")]
    assert quoted >= 5
