"""Keep the docs' links to code lines true. A link [`name`](../grpo.py#L97) points at the line that
defines `name` (def, class, an assignment, or an Args field) in that file; `python docs/links.py`
lists the links whose line moved, `python docs/links.py --fix` rewrites their line numbers.
tests/test_docs.py runs the check.

A name that no line defines, or that more than one line defines, is an error: link a unique name.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[`([A-Za-z_][\w.]*)`\]\(\.\./([\w/]+\.py)#L(\d+)\)")


def definition_line(path, name):
    """The 1-based line of `name`'s definition in path, or an error message."""
    lines = (ROOT / path).read_text().splitlines()
    short = name.split(".")[-1]
    name_ = re.escape(short)
    pattern = re.compile(rf"^\s*(?:def|class)\s+{name_}\b|^\s*{name_}\s*(?::[^=]+)?=")
    found = [i + 1 for i, line in enumerate(lines) if pattern.match(line)]
    if len(found) != 1:
        return f"{path}: `{name}` is defined on {len(found)} lines ({found[:5]}), not one"
    return found[0]


def check(fix=False):
    """Stale links as (doc, name, path, old line, new line or error)."""
    stale = []
    for doc in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        text = doc.read_text()

        def repair(m):
            name, path, line = m.group(1), m.group(2), int(m.group(3))
            where = definition_line(path, name)
            if where != line:
                stale.append((doc.name, name, path, line, where))
            return m.group(0) if isinstance(where, str) else f"[`{name}`](../{path}#L{where})"

        new = LINK.sub(repair, text)
        if fix and new != text:
            doc.write_text(new)
    return stale


if __name__ == "__main__":
    fix = "--fix" in sys.argv
    problems = check(fix)
    for doc, name, path, old, new in problems:
        print(f"docs/{doc}: `{name}` -> {path}#L{old}: "
              f"{'now at line %d' % new if isinstance(new, int) else new}"
              f"{' (fixed)' if fix and isinstance(new, int) else ''}")
    sys.exit(1 if any(isinstance(p[4], str) for p in problems) or (problems and not fix) else 0)
