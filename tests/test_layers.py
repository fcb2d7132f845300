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


# ---- one name per concept ---------------------------------------------------------------------
ALGOS = ["grpo", "ppo", "reinforce", "appo", "tppo", "online_dpo"]
SIBLINGS = [("grpo", "ppo"), ("grpo", "reinforce"), ("grpo", "online_dpo"), ("appo", "tppo")]
# a name the files used for the same concept as another, now retired: (retired, the name to use)
RETIRED = [("action_mask", "response_mask")]


def signatures(source):
    """{name: parameter names} of the functions defined at the top level of `source`."""
    return {node.name: [a.arg for a in node.args.posonlyargs + node.args.args
                        + node.args.kwonlyargs]
            for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}


def name_violations(common, files, siblings=SIBLINGS):
    """common, files: {module: source}. A function of common/ is defined once there, and a file
    that defines one of the same name gives it the same parameters (no second meaning under a
    known name); sibling files give a shared name the same parameters, so their diff shows the
    algorithm; no source uses a retired name."""
    bad, defined = [], {}
    for module, source in sorted(common.items()):
        for name, params in signatures(source).items():
            if name == "main":  # each script's entry point (python -m common.plot)
                continue
            if name in defined and not name.startswith("_"):
                bad.append(f"{name}: defined in common/{defined[name][0]}.py and {module}.py")
            defined.setdefault(name, (module, params))
    for module, source in sorted(files.items()):
        for name, params in signatures(source).items():
            if name in defined and defined[name][1] != params and not name.startswith("_"):
                bad.append(f"{module}.{name}{tuple(params)} shadows common/{defined[name][0]}.py's "
                           f"{name}{tuple(defined[name][1])}")
    for a, b in siblings:
        sa, sb = signatures(files[a]), signatures(files[b])
        for name in sorted(set(sa) & set(sb)):
            if sa[name] != sb[name]:
                bad.append(f"{a}.{name}{tuple(sa[name])} vs {b}.{name}{tuple(sb[name])}")
    for module, source in sorted({**common, **files}.items()):
        names = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
        names |= {n.arg for n in ast.walk(ast.parse(source)) if isinstance(n, ast.arg)}
        names |= {n.value for n in ast.walk(ast.parse(source))
                  if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        bad += [f"{module} uses {old}: the name is {new}" for old, new in RETIRED if old in names]
    return bad


def test_one_name_per_concept_in_common_and_the_five_files():
    common = {p.stem: p.read_text() for p in (ROOT / "common").glob("*.py")}
    files = {a: (ROOT / f"{a}.py").read_text() for a in ALGOS}
    assert name_violations(common, files) == []


def test_a_planted_second_signature_or_retired_name_fails():
    common = {"distributed": "def minibatches(n, num_mini_batches, seeds, device='cpu'):\n    pass\n"}
    files = {
        "appo": "def minibatches(step, epoch, num_envs):\n    pass\n"
                "def policy_loss(logprobs, mask):\n    pass\n",
        "tppo": "def policy_loss(logprobs, action_mask):\n    pass\n",
    }
    assert name_violations(common, files, [("appo", "tppo")]) == [
        "appo.minibatches('step', 'epoch', 'num_envs') shadows common/distributed.py's "
        "minibatches('n', 'num_mini_batches', 'seeds', 'device')",
        "appo.policy_loss('logprobs', 'mask') vs tppo.policy_loss('logprobs', 'action_mask')",
        "tppo uses action_mask: the name is response_mask",
    ]
