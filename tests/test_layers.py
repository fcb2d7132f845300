"""common/ is layered: a module imports only from the layers below its own, so there is no import
cycle and a student can read it bottom up. The order is written once, in docs/reading.md (the
picture under "Layers"); this test reads it there, parses every import of every common/ module
(inside functions too) and fails on one that points sideways or up."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layers_from_docs(text):
    """{module: layer} from the ```layers block of docs/reading.md: lines '  N  mod · mod   why'."""
    block = re.search(r"```layers\n(.*?)```", text, re.S).group(1)
    order = {}
    for line in block.splitlines():
        m = re.match(r"\s*(\d+)\s+([a-z_]+(?:\s+·\s+[a-z_]+)*)", line)
        if m:
            for name in m.group(2).split("·"):
                order[name.strip()] = int(m.group(1))
    return order


def common_imports(source):
    """(line, module) of every common/ module that `source` imports, at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "common":
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("common."):
            found.append((node.lineno, node.module.split(".")[1]))
        elif isinstance(node, ast.ImportFrom) and node.level:  # from . import x / from .x import y
            found += ([(node.lineno, node.module.split(".")[0])] if node.module
                      else [(node.lineno, a.name) for a in node.names])
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[1]) for a in node.names
                      if a.name.startswith("common.")]
    return found


def violations(sources, order):
    """'module:line imports X (layer i -> j)' for each import that is not strictly downward."""
    bad = []
    for module, source in sorted(sources.items()):
        for line, target in common_imports(source):
            if target not in order or module not in order:
                bad.append(f"{module}:{line} imports {target}: not in the docs' layers")
            elif order[target] >= order[module]:
                bad.append(f"{module}:{line} imports {target} "
                           f"(layer {order[module]} -> {order[target]}: not below)")
    return bad


def test_every_common_module_has_a_layer_in_the_docs_and_only_those():
    order = layers_from_docs((ROOT / "docs/reading.md").read_text())
    modules = {p.stem for p in (ROOT / "common").glob("*.py")} - {"__init__"}
    assert set(order) == modules


def test_common_imports_only_point_down():
    order = layers_from_docs((ROOT / "docs/reading.md").read_text())
    sources = {p.stem: p.read_text() for p in (ROOT / "common").glob("*.py") if p.stem != "__init__"}
    assert violations(sources, order) == []


def test_a_planted_upward_or_sideways_import_fails():
    order = {"numerics": 2, "distributed": 1, "models": 3, "sampler": 3}
    sources = {
        "distributed": "import torch\n",
        # function-local, as the cycles of the old common/ were held together
        "numerics": "from common.distributed import x\n\ndef f():\n    from common.models import y\n",
        "models": "import common.sampler\nfrom common import numerics\n",
        "sampler": "from common.numerics import masked_mean\n",
    }
    assert violations(sources, order) == [
        "models:1 imports sampler (layer 3 -> 3: not below)",
        "numerics:4 imports models (layer 2 -> 3: not below)",
    ]
