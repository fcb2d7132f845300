"""common/ is four packages, env < models < rl < run, on a floor of modules that each needs (user
errors; ranks, collectives and seeds); a package imports only from the floor and the packages below
it, and inside a package a module imports only from the layers below its own, so there is no import
cycle and a student reads it bottom up. The order is written once, in docs/reading.md (the picture
under "Layers"); this test reads it there, parses every import of every common/ module (inside
functions too) and fails on one that points sideways or up. Every algorithm file imports from the
five faces only (the floor's, common/__init__.py, and the packages' __init__), names that the face
lists, and each face names only its own package's names."""

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest

from dev.algorithms import ALGORITHMS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("env", "models", "rl", "run")  # bottom to top
FLOOR = ("errors", "distributed")  # the modules of common/ itself, below every package


def common_modules():
    """{dotted name under common: source} of every module of common/, faces (package.__init__
    as the package's own name) included."""
    out = {}
    for p in sorted((ROOT / "common").rglob("*.py")):
        parts = p.relative_to(ROOT / "common").with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p.read_text()  # "": the floor's face, common/__init__.py
    return out


def layers_from_docs(text):
    """{module: layer} from the ```layers block of docs/reading.md: lines '  N  mod · mod   why'."""
    block = re.search(r"```layers\n(.*?)```", text, re.S).group(1)
    order = {}
    for line in block.splitlines():
        m = re.match(r"\s*(\d+)\s+([a-z_.]+(?:\s+·\s+[a-z_.]+)*)", line)
        if m:
            for name in m.group(2).split("·"):
                order[name.strip()] = int(m.group(1))
    return order


def common_imports(source, modules):
    """(line, module) of every common/ module (or package face) that `source` imports, at any
    depth: `from common.models.sampler import x` is models.sampler, `from common.models import
    sampler` the module when it is one, else the face `models`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("common"):
            base = node.module[len("common."):] if node.module != "common" else ""
            for a in node.names:
                sub = f"{base}.{a.name}" if base else a.name
                found.append((node.lineno, sub if sub in modules else base))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name[len("common."):]) for a in node.names
                      if a.name.startswith("common.")]
    return found


def package(module):
    return "floor" if module in FLOOR or not module else module.split(".")[0]


def violations(sources, order):
    """'module:line imports X (...)' for each import that is not strictly downward: to a lower
    package, or in its own package to a lower layer. A face (a package's __init__) may import its
    own modules and lower packages; nothing imports a face of its own package or one above."""
    bad = []
    for module, source in sorted(sources.items()):
        for line, target in common_imports(source, sources):
            if target == "" and module:  # the floor's face is the files': common/ takes modules
                bad.append(f"{module}:{line} imports common: name the floor's module")
                continue
            if package(target) not in ("floor", *PACKAGES):
                bad.append(f"{module}:{line} imports common.{target}: not one of the packages")
                continue
            if package(target) == "floor" and package(module) != "floor":
                continue  # every package stands on the floor
            here, there = (("floor", *PACKAGES).index(package(module)),
                           ("floor", *PACKAGES).index(package(target)))
            if there > here:
                bad.append(f"{module}:{line} imports {target} (package {package(module)} -> "
                           f"{package(target)}: above)")
            elif there < here:
                continue
            elif module in PACKAGES or module == "":  # a face reads its own modules
                continue
            elif target not in order or module not in order:
                bad.append(f"{module}:{line} imports {target}: not in the docs' layers")
            elif order[target] >= order[module]:
                bad.append(f"{module}:{line} imports {target} "
                           f"(layer {order[module]} -> {order[target]}: not below)")
    return bad


def test_every_common_module_has_a_layer_in_the_docs_and_only_those():
    order = layers_from_docs((ROOT / "docs/reading.md").read_text())
    modules = set(common_modules()) - set(PACKAGES) - {"models.fast", ""}
    assert set(order) == modules


def test_the_layers_keep_each_package_in_one_band_in_package_order():
    order = layers_from_docs((ROOT / "docs/reading.md").read_text())
    bands = [(min(v for k, v in order.items() if package(k) == p),
              max(v for k, v in order.items() if package(k) == p)) for p in ("floor", *PACKAGES)]
    assert all(hi < lo for (_, hi), (lo, _) in zip(bands, bands[1:])), bands


def test_common_imports_only_point_down():
    order = layers_from_docs((ROOT / "docs/reading.md").read_text())
    assert violations(common_modules(), order) == []


def test_a_planted_upward_or_sideways_import_fails():
    order = {"models.distributed": 1, "models.sampler": 3, "models.loading": 3, "rl.numerics": 2}
    sources = {
        "models.distributed": "import torch\n",
        # function-local, as the cycles of the old common/ were held together
        "rl.numerics": "from common.distributed import x\n\ndef f():\n    from common.run import y\n",
        "models.loading": "import common.models.sampler\nfrom common.rl import numerics\n",
        "models.sampler": "from common.distributed import masked_mean\n",
        "models": "from common.models.loading import z\n",
        "env.tasks": "from common import models\n",
    }
    assert violations(sources, order) == [
        "env.tasks:1 imports models (package env -> models: above)",
        "models.loading:1 imports models.sampler (layer 3 -> 3: not below)",
        "models.loading:2 imports rl.numerics (package models -> rl: above)",
        "rl.numerics:4 imports run (package rl -> run: above)",
    ]


# ---- each algorithm file imports from the four faces -----------------------------------------
MOST_NAMES = {"grpo": 20}  # the file a student reads first: issue 65's bound


def file_imports(source):
    """[(line, module, [names])] of the top-level `from common... import` lines of an algorithm
    file, and every other mention of common in an import, anywhere in it."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("common"):
            out.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names if a.name.startswith("common")]
    return out


def face_violations(algo, source, faces):
    """What breaks the rule for one file: an import of anything but a face, a name the face does
    not list, more than five places (the floor and the four packages), or more names than
    MOST_NAMES allows."""
    bad, places, names = [], set(), 0
    for line, module, imported in file_imports(source):
        face = "" if module == "common" else (
            module[len("common."):] if module.startswith("common.") else None)
        if face not in faces or not imported:
            bad.append(f"{algo}.py:{line} imports {module}: only the faces "
                       f"{', '.join(('common.' + f).rstrip('.') for f in faces)}")
            continue
        places.add(face)
        names += len(imported)
        bad += [f"{algo}.py:{line} imports {name} from {module}, whose face does not name it"
                for name in imported if name not in faces[face]]
    if len(places) > 5:
        bad.append(f"{algo}.py imports from {len(places)} places")
    if names > MOST_NAMES.get(algo, names):
        bad.append(f"{algo}.py takes {names} names, more than {MOST_NAMES[algo]}")
    return bad


def faces():
    return {p: set(importlib.import_module(f"common.{p}".rstrip(".")).__all__)
            for p in ("", *PACKAGES)}


@pytest.mark.parametrize("algo", [*ALGORITHMS, "eval"])
def test_each_file_imports_only_what_the_faces_name(algo):
    assert face_violations(algo, (ROOT / f"{algo}.py").read_text(), faces()) == []


def test_every_name_a_face_lists_is_there():
    for p, names in faces().items():
        module = importlib.import_module(f"common.{p}".rstrip("."))
        assert all(hasattr(module, n) for n in names), p


def foreign_names(face, source):
    """The names a face's source imports from outside its own package (the floor's face: from
    outside the floor's modules)."""
    own = tuple(f"common.{m}" for m in FLOOR) if face == "" else (f"common.{face}.",)
    return sorted(a.name for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("common")
                  and not node.module.startswith(own) for a in node.names
                  if a.name not in FLOOR)


def test_each_face_names_only_its_own_packages_names():
    sources = common_modules()
    assert {face: foreign_names(face, sources[face]) for face in ("", *PACKAGES)} == {
        face: [] for face in ("", *PACKAGES)}
    assert foreign_names("run", "from common.run.run import Run\n"
                                "from common.distributed import print0\n") == ["print0"]


def test_a_file_that_reaches_past_a_face_or_takes_too_many_names_fails():
    source = ("from common.models import generate, secret\n"
              "from common.models.sampler import Decoder\n"
              "def f():\n    import common.rl.numerics\n"
              "from common.run import a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p, q, r, s\n")
    known = {"models": {"generate"}, "run": set("abcdefghijklmnopqrs")}
    assert face_violations("grpo", source, known) == [
        "grpo.py:1 imports secret from common.models, whose face does not name it",
        "grpo.py:2 imports common.models.sampler: only the faces common.models, common.run",
        "grpo.py:4 imports common.rl.numerics: only the faces common.models, common.run",
        "grpo.py takes 21 names, more than 20",
    ]
    floor = {"": {"UsageError"}, "models": {"generate"}}
    assert face_violations("grpo", "from common import UsageError, secret\n", floor) == [
        "grpo.py:1 imports secret from common, whose face does not name it"]


# ---- one name per concept ---------------------------------------------------------------------
from dev.algorithms import SIBLINGS  # noqa: E402
# a name the files used for the same concept as another, now retired: (retired, the name to use)
RETIRED = [("action_mask", "response_mask")]


def signatures(source):
    """{name: parameter names} of the functions defined at the top level of `source`."""
    return {node.name: [a.arg for a in node.args.posonlyargs + node.args.args
                        + node.args.kwonlyargs]
            for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}


def required(source):
    """{name: how many of its parameters have no default} of the top-level functions."""
    return {node.name: len(node.args.posonlyargs + node.args.args) - len(node.args.defaults)
            for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}


def path(module):
    return module.replace(".", "/") + ".py"


def name_violations(common, files, siblings=SIBLINGS):
    """common, files: {module: source}. A function of common/ is defined once there, and a file
    that defines one of the same name gives it the same parameters (no second meaning under a
    known name); sibling files give a shared name the same parameters, so their diff shows the
    algorithm; no source uses a retired name."""
    bad, defined = [], {}
    for module, source in sorted(common.items()):
        for name, params in signatures(source).items():
            if name == "main":  # each script's entry point (python -m common.run.plot)
                continue
            if name in defined and not name.startswith("_"):
                bad.append(f"{name}: defined in common/{path(defined[name][0])} and "
                           f"{path(module)}")
            defined.setdefault(name, (module, params))
    for module, source in sorted(files.items()):
        for name, params in signatures(source).items():
            if name in defined and defined[name][1] != params and not name.startswith("_"):
                bad.append(f"{module}.{name}{tuple(params)} shadows common/{path(defined[name][0])}'s "
                           f"{name}{tuple(defined[name][1])}")
    for a, b in siblings:
        sa, sb = signatures(files[a]), signatures(files[b])
        ra, rb = required(files[a]), required(files[b])
        for name in sorted(set(sa) & set(sb)):
            # the parameters a call must pass are the same; those with a default are each file's
            # own (grpo.py's reference log-probs, async_grpo.py's sampler's, distill.py's
            # divergences)
            if sa[name][:ra[name]] != sb[name][:rb[name]]:
                bad.append(f"{a}.{name}{tuple(sa[name])} vs {b}.{name}{tuple(sb[name])}")
    for module, source in sorted({**common, **files}.items()):
        names = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
        names |= {n.arg for n in ast.walk(ast.parse(source)) if isinstance(n, ast.arg)}
        names |= {n.value for n in ast.walk(ast.parse(source))
                  if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        bad += [f"{module} uses {old}: the name is {new}" for old, new in RETIRED if old in names]
    return bad


def test_one_name_per_concept_in_common_and_the_algorithm_files():
    common = {m: s for m, s in common_modules().items() if m not in PACKAGES}
    files = {a: (ROOT / f"{a}.py").read_text() for a in ALGORITHMS}
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


# ---- options are derived once, in main ---------------------------------------------------------
def args_writes(source):
    """Line numbers where `source` writes an attribute of `args` (or `self.args`): an assignment,
    an augmented one, setattr, or vars(args)[...] = ..."""
    def is_args(node):
        return ((isinstance(node, ast.Name) and node.id == "args")
                or (isinstance(node, ast.Attribute) and node.attr == "args"
                    and isinstance(node.value, ast.Name) and node.value.id == "self"))

    lines = []
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets
                       for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and is_args(t.value):
                lines.append(t.lineno)
            if (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Call)
                    and getattr(t.value.func, "id", None) == "vars" and is_args(t.value.args[0])):
                lines.append(t.lineno)
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr"
                and node.args and is_args(node.args[0])):
            lines.append(node.lineno)
    return sorted(lines)


def derived_block(source):
    """(first, last) line of main's derived-options block: from its '# ---- derived options'
    banner to the blank line after it."""
    lines = source.splitlines()
    first = next(i for i, line in enumerate(lines, 1) if "# ---- derived options" in line)
    last = next(i for i in range(first + 1, len(lines) + 1) if not lines[i - 1].strip())
    return first, last


def test_nothing_in_common_writes_to_args():
    found = {m: args_writes(s) for m, s in common_modules().items()}
    assert {name: lines for name, lines in found.items() if lines} == {}


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_a_file_writes_args_only_in_mains_derived_block(algo):
    source = (ROOT / f"{algo}.py").read_text()
    first, last = derived_block(source)
    writes = args_writes(source)
    assert writes and all(first < line < last for line in writes), (writes, first, last)


def test_a_planted_write_to_args_is_found():
    source = ("def f(args, self):\n"
              "    args.lr = 1\n"             # 2
              "    x, args.n = 1, 2\n"        # 3
              "    self.args.mb += 1\n"       # 4
              "    setattr(args, 'k', 3)\n"   # 5
              "    vars(args)['j'] = 4\n"     # 6
              "    y = args.lr\n"             # a read
              "    other.args = args\n")      # another object's attribute named args
    assert args_writes(source) == [2, 3, 4, 5, 6]
    main = "def main(args):\n    run = 1\n    # ---- derived options\n    args.a = 1\n\n    args.b = 2\n"
    first, last = derived_block(main)
    assert (first, last) == (3, 5) and [w for w in args_writes(main) if not first < w < last] == [6]


# ---- one meaning per option name ---------------------------------------------------------------
# option names retired for a concept another name holds: (retired, the option to use)
RETIRED_OPTIONS = [("non_stop_penalty", "missing_eos_penalty"), ("target_kl", "skip_kl")]
# where a retired name is still a field, the files that keep it with its own meaning
RETIRED_KEPT = {"target_kl": {"ppo"}}


def option_fields(algo):
    """{option: (annotation text, docstring)} of a file's Args, its TrainArgs fields included."""
    import importlib
    import typing

    from common.run.args import field_docs

    cls = importlib.import_module(algo).Args
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)

    def kind(hint):  # Optional[X] is X left unset (a default decided later): the same option
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return str(args[0]) if typing.get_origin(hint) is typing.Union and len(args) == 1 else (
            str(hint))
    return {name: (kind(hints[name]), docs.get(name, "")) for name in cls.__dataclass_fields__}


def meaning(doc):
    """What an option's docstring says it is: its head, before the first ' (', ':', ';' or ', ',
    lower-cased; a leading 'stepwise: ' or 'full form: ' (where the option acts) is passed over."""
    doc = re.sub(r"^(stepwise|full form|sampled form|tools|dynamic sampling|tis|icepop|seq_mis): ",
                 "", doc.strip())
    return re.split(r" \(|:|;|, ", doc)[0].strip().lower()


def option_violations(fields):
    """fields: {algo: {option: (annotation, docstring)}}. An option that several files have takes
    the same type and, for a choice, the same values in each (defaults may differ: they are the
    algorithm's), and its docstring says it is the same thing (`meaning`): the same name never
    means two things, as grpo.py's KL weight and a divergence's mix once were both --beta; a
    retired name is nowhere a field but where it is kept with its own meaning."""
    bad = []
    names = sorted({n for f in fields.values() for n in f})
    for name in names:
        kinds = {algo: f[name][0] for algo, f in fields.items() if name in f}
        if len(set(kinds.values())) > 1:
            bad.append(f"--{name}: " + "; ".join(f"{a} {k}" for a, k in sorted(kinds.items())))
        said = {algo: meaning(f[name][1]) for algo, f in fields.items() if name in f}
        if len(set(said.values())) > 1:
            bad.append(f"--{name} means: " + "; ".join(f"{a} '{m}'" for a, m in
                                                        sorted(said.items())))
    for old, new in RETIRED_OPTIONS:
        for algo in sorted(a for a, f in fields.items() if old in f):
            if algo not in RETIRED_KEPT.get(old, ()):
                bad.append(f"{algo} has --{old}: the option is --{new}")
    return bad


def test_one_meaning_per_option_name_in_every_file():
    assert option_violations({a: option_fields(a) for a in ALGORITHMS}) == []


def test_a_planted_second_vocabulary_or_retired_option_fails():
    kl = "weight of the KL to the frozen reference (0: none)"
    fields = {"grpo": {"loss_type": ("Literal['grpo', 'dapo']", ""), "beta": ("float", kl)},
              "ppo": {"loss_type": ("Literal['token', 'sequence']", ""), "beta": ("float", kl),
                      "non_stop_penalty": ("float", "")},
              "distill": {"beta": ("float", "full form: which divergence: 1 reverse KL")},
              "appo": {"target_kl": ("float", "")}}
    assert option_violations(fields) == [
        "--beta means: distill 'which divergence'; grpo 'weight of the kl to the frozen "
        "reference'; ppo 'weight of the kl to the frozen reference'",
        "--loss_type: grpo Literal['grpo', 'dapo']; ppo Literal['token', 'sequence']",
        "ppo has --non_stop_penalty: the option is --missing_eos_penalty",
        "appo has --target_kl: the option is --skip_kl",
    ]


# ---- the copies: a helper that several files hold keeps one text ------------------------------
@functools.lru_cache(maxsize=None)
def parsed(source):
    """ast.parse(source), once a source: every unit of every file asks for its file's tree."""
    return ast.parse(source)


@functools.lru_cache(maxsize=None)
def statements(source):
    """[(first line, last line)] of every statement of `source`."""
    return [(n.lineno, n.end_lineno) for n in ast.walk(parsed(source)) if isinstance(n, ast.stmt)]


def unit_span(source, name):
    """(first, last) 1-based lines of a shared unit of `source`, or None where it has none: a
    top-level function or class by its name, or `main[a:b]`, main's lines after its `# ---- a`
    banner to the last line before its `# ---- b` banner ("" for a: from `def main`; for b: to
    main's end)."""
    tree = parsed(source)
    top = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    if not name.startswith("main["):
        node = top.get(name)
        return None if node is None else (node.lineno, node.end_lineno)
    a, b = name[len("main["):-1].split(":")
    node, lines = top.get("main"), source.splitlines()

    def banner(word):
        return next((k for k in range(node.lineno, node.end_lineno + 1)
                     if lines[k - 1].strip().startswith(f"# ---- {word}")), None)
    if node is None or (a and banner(a) is None) or (b and banner(b) is None):
        return None
    first, last = banner(a) if a else node.lineno, banner(b) - 1 if b else node.end_lineno
    while not lines[last - 1].strip():
        last -= 1
    return first, last


def tagged(source, tags):
    """The 1-based lines of `source` that a comment starting with one of `tags` takes: its own
    line; after code, the statement that starts on that line; on a line of its own, the comment
    lines under it and the next statement, each with its whole block."""
    lines = source.splitlines()
    mark = re.compile(r"#\s*(" + "|".join(re.escape(t) for t in tags) + "):") if tags else None
    marked = {i for i, line in enumerate(lines, 1) if mark and mark.search(line)}
    heads, out = set(marked), set(marked)
    for i in marked:
        if lines[i - 1].lstrip().startswith("#"):
            k = i + 1
            while k <= len(lines) and (not lines[k - 1].strip()
                                       or lines[k - 1].lstrip().startswith("#")):
                out.add(k)
                k += 1
            heads.add(k)
    for first, last in statements(source):
        if first in heads:
            out.update(range(first, last + 1))
    return out


def own_words(source):
    """The 1-based lines of `source` that say what its file runs, in its own words, and so are
    every file's own: its `run.print(...)` statements (the line it prints at its start) and its
    section banners (`# ---- rollout: G responses to ...`)."""
    out = {i for i, line in enumerate(source.splitlines(), 1)
           if line.strip().startswith("# ---- ")}
    for node in ast.walk(parsed(source)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) == "run.print"):
            out.update(range(node.lineno, node.end_lineno + 1))
    return out


def args_fields(source, span):
    """{field: (its first line, its lines with the default value left out)} of the Args class at
    `span`: the annotation line and the docstring under it."""
    lines = source.splitlines()
    body = next(n for n in parsed(source).body if isinstance(n, ast.ClassDef)
                and n.lineno == span[0]).body
    out = {}
    for k, node in enumerate(body):
        if isinstance(node, ast.AnnAssign):
            doc = body[k + 1] if k + 1 < len(body) else None
            end = (doc.end_lineno if isinstance(doc, ast.Expr)
                   and isinstance(doc.value, ast.Constant) else node.end_lineno)
            head = lines[node.lineno - 1].split("  #")[0]
            head = head.split(" = ")[0]  # the default is the algorithm's own
            out[node.target.id] = (node.lineno, [head, *lines[node.lineno:end]])
    return out


def metric_lines(source, span):
    """{first key on the line: (line, its text)} of the `metrics = {...}` dict literal inside
    `span`, a line at a time (`**env.reward_metrics()` named by its text, a comment line by its
    line number): each file logs the metrics of its own method beside the shared ones, so the
    dict is compared key by key."""
    lines, out = source.splitlines(), {}
    for node in ast.walk(parsed(source)):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and [ast.unparse(t) for t in node.targets] == ["metrics"]
                and span[0] <= node.lineno <= span[1]):
            for k in range(node.lineno + 1, node.end_lineno):
                text = lines[k - 1].strip()
                key = (text.split('"')[1] if text.startswith('"') else
                       text.split("#")[0].strip() or f"line {k}")
                out[key] = (k, lines[k - 1])
    return out


def copy_violations(sources, shared, tags, variants=()):
    """'file.py:line: unit ...' for each copy of a shared unit whose text is not its first
    holder's. Every line that differs must be one the file tags (`tags`: each file's own tag),
    standing where the first holder's lines stand; a copy may leave out only the first holder's
    lines of a variant (`variants`: GSPO's, in grpo.py). `Args` is compared field by field: a
    field the two files both have keeps the first holder's text, its default aside."""
    import difflib

    bad = []
    for unit, holders in shared:
        ref_source = sources[holders[0]]
        ref_span = unit_span(ref_source, unit)
        ref_lines = ref_source.splitlines()
        optional = tagged(ref_source, variants) | own_words(ref_source)
        for algo in holders[1:]:
            source = sources[algo]
            span = unit_span(source, unit)
            if span is None:
                bad.append(f"{algo}.py holds no {unit}, which dev/algorithms.py says it shares")
                continue
            said = tagged(source, [tags.get(algo, algo)]) | own_words(source)
            lines = source.splitlines()
            why = f"differs from {holders[0]}.py's without a '# {tags.get(algo, algo)}:' tag"
            if unit == "Args":
                ref_fields, fields = args_fields(ref_source, ref_span), args_fields(source, span)
                bad += [f"{algo}.py:{fields[f][0]}: Args.{f} {why}" for f in sorted(
                    set(ref_fields) & set(fields)) if fields[f][1] != ref_fields[f][1]
                        and fields[f][0] not in said]
                continue
            # the metrics dict, key by key: a key both files log keeps one text
            ref_metrics, metrics = metric_lines(ref_source, ref_span), metric_lines(source, span)
            bad += [f"{algo}.py:{metrics[key][0]}: {unit}'s metric {key} {why}"
                    for key in sorted(set(ref_metrics) & set(metrics))
                    if metrics[key][1] != ref_metrics[key][1] and metrics[key][0] not in said]
            skip_ref = {k for k, _ in ref_metrics.values()}
            skip = {k for k, _ in metrics.values()}
            ref = [(k, ref_lines[k - 1]) for k in range(ref_span[0], ref_span[1] + 1)
                   if k not in skip_ref]
            mine = [(k, lines[k - 1]) for k in range(span[0], span[1] + 1) if k not in skip]
            matcher = difflib.SequenceMatcher(None, [x for _, x in ref], [x for _, x in mine],
                                              autojunk=False)
            for op, i1, i2, j1, j2 in matcher.get_opcodes():
                left_out = all(k in optional or not x.strip() for k, x in ref[i1:i2])
                if op == "equal" or op == "delete" and left_out:
                    continue
                if j1 == j2 or not all(k in said or not x.strip() for k, x in mine[j1:j2]):
                    where = mine[j1][0] if j1 < j2 else mine[max(0, j1 - 1)][0]
                    bad.append(f"{algo}.py:{where}: {unit} {why}")
                    break
    return bad


def test_the_helpers_that_files_share_keep_one_text():
    from dev.algorithms import SHARED, TAGS, VARIANTS

    sources = {a: (ROOT / f"{a}.py").read_text() for a in ALGORITHMS}
    assert copy_violations(sources, SHARED, TAGS, VARIANTS) == []


def test_a_planted_change_to_one_copy_of_group_advantages_fails():
    from dev.algorithms import SHARED, TAGS, VARIANTS

    sources = {a: (ROOT / f"{a}.py").read_text() for a in ALGORITHMS}
    line = "        advantages = advantages / (r.std(dim=1, keepdim=True) + 1e-4)"
    assert all(sources[a].count(line) == 1 for a in dict(SHARED)["group_advantages"])
    planted = dict(sources, tools=sources["tools"].replace(line, line.replace("1e-4", "1e-6")))
    where = sources["tools"][:sources["tools"].index(line)].count("\n") + 1
    assert copy_violations(planted, SHARED, TAGS, VARIANTS) == [
        f"tools.py:{where}: group_advantages differs from grpo.py's without a '# new to tools:' tag"]
    # the same change, tagged with the file's reason, is the file's own
    said = dict(sources, tools=sources["tools"].replace(
        line, line.replace("1e-4", "1e-6") + "  # new to tools: a smaller epsilon"))
    assert copy_violations(said, SHARED, TAGS, VARIANTS) == []
    mean = "    advantages = r - r.mean(dim=1, keepdim=True)\n"
    dropped = dict(sources, dapo=sources["dapo"].replace(mean, ""))
    assert [v.split(":", 2)[2] for v in copy_violations(dropped, SHARED, TAGS, VARIANTS)] == [
        " group_advantages differs from grpo.py's without a '# new to DAPO:' tag"]


def test_a_planted_change_to_a_region_of_main_or_a_field_of_args_fails():
    from dev.algorithms import SHARED, TAGS, VARIANTS

    sources = {a: (ROOT / f"{a}.py").read_text() for a in ALGORITHMS}
    # the update loop's micro-batch statistics, in the region from the log-probs to the logging
    line = 'loss_stats["entropy"] = masked_mean(entropy.detach(), mask[rows]).item()'
    assert sources["dapo"].count(line) == 1
    planted = dict(sources, dapo=sources["dapo"].replace(line, line.replace("mask[rows]",
                                                                            "mask")))
    assert [v.split(":", 2)[2] for v in copy_violations(planted, SHARED, TAGS, VARIANTS)] == [
        " main[log-probs:logging] differs from grpo.py's without a '# new to DAPO:' tag"]
    # a field both files have keeps its docstring; its default is the file's own
    doc = '    """nucleus sampling mass"""'
    planted = dict(sources, ppo=sources["ppo"].replace(doc, '    """nucleus mass"""'))
    assert [v.split(":", 2)[2] for v in copy_violations(planted, SHARED, TAGS, VARIANTS)] == [
        " Args.top_p differs from grpo.py's without a '# new to PPO:' tag"]
    default = "    top_p: float = 1.0\n"
    planted = dict(sources, ppo=sources["ppo"].replace(default, "    top_p: float = 0.9\n"))
    assert copy_violations(planted, SHARED, TAGS, VARIANTS) == []
    # a copy may leave out grpo.py's GSPO lines, and only those
    assert "GSPO" in sources["grpo"] and "GSPO" not in sources["tools"]
    assert copy_violations(sources, SHARED, TAGS, ()) != []  # GSPO's lines as any others


def test_a_tag_takes_its_line_its_statement_and_a_comment_s_next_statement():
    source = ("def f(a,\n"
              "      b):  # new to X: b\n"          # 2: its own line
              "    x = 1\n"
              "    # new to X: y, over\n"          # 4: the comment, the lines under it and
              "    # two lines\n"
              "    y = [1,\n"                       # 6-7: the next statement, whole
              "         2]\n"
              "    if x:  # new to X: the block\n"  # 8-9: the statement that starts there
              "        x = 2\n"
              "    z = 3\n")
    assert tagged(source, ["new to X"]) == {2, 4, 5, 6, 7, 8, 9}
    assert tagged(source, []) == set()

# ---- a module docstring names only what its file has ------------------------------------------
INDICES = ("i", "t", "j", "k", "it", "old", "ref", "prox", "T")  # subscripts of the equations


def docstring_violations(algo, source, options, reads):
    """What a module docstring names that its file lacks: a snake_case word in its equations
    that is neither an option nor a name of the code (eps_high in a file without it; rho_it, a
    symbol with an index, is the equations' own), or a --flag that the file neither has nor reads
    as a seed's name (`reads`), torchrun's own before the file's name aside."""
    doc = ast.get_docstring(ast.parse(source), clean=False) or ""
    names = set(re.findall(r"[A-Za-z_]\w*", source.split('"""', 2)[-1]))
    bad = []
    for line in doc.splitlines():
        if line.startswith("    ") and "=" in line and not line.split()[0] in ("python",
                                                                               "torchrun"):
            for word in re.findall(r"\b[a-z]{2,}(?:_[a-z0-9]{2,})+\b", line):
                if word.rsplit("_", 1)[1] not in INDICES and word not in options | names:
                    bad.append(f"{algo}.py's docstring: {word} is not an option or a name here")
        own = line.split(f"{algo}.py", 1)[1] if f"{algo}.py" in line else line
        for flag in re.findall(r"--([a-z]\w*)", own):
            if flag.removeprefix("no_") not in options and flag not in reads:
                bad.append(f"{algo}.py's docstring: --{flag} is not an option of the file")
    return bad


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_a_module_docstring_names_only_options_and_names_of_its_file(algo):
    from common.run.seed_flags import aliases_for

    options = set(importlib.import_module(algo).Args.__dataclass_fields__)
    source = (ROOT / f"{algo}.py").read_text()
    assert docstring_violations(algo, source, options, set(aliases_for(algo))) == []


def test_a_docstring_that_names_a_missing_option_fails():
    source = ('"""X.\n    L = clip(rho_it, 1 - eps, 1 + eps_high) A_i + beta KL_it\n'
              'Launch:\n    torchrun --nproc_per_node 2 x.py --beta 0.1 --no_eval --epsilon_high 1\n'
              '"""\nbeta = 1\n')
    assert docstring_violations("x", source, {"beta", "eval"}, set()) == [
        "x.py's docstring: eps_high is not an option or a name here",
        "x.py's docstring: --epsilon_high is not an option of the file"]


def test_every_file_holds_at_most_five_lines_of_a_named_variant():
    # a named method is a sibling file; what stays tagged is one option of the file's own method
    from dev.algorithms import VARIANTS

    sources = {a: (ROOT / f"{a}.py").read_text() for a in ALGORITHMS}
    lines = sources["grpo"].splitlines()
    gspo = [lines[i - 1].strip() for i in sorted(tagged(sources["grpo"], VARIANTS))]
    assert [line.split("#")[0].strip()[:40] for line in gspo] == [
        'importance_sampling_level: Literal["toke',
        'if args.importance_sampling_level == "se',
        "ratio = torch.exp(masked_mean(log_ratio,"]
    counts = {a: len(tagged(source, VARIANTS)) for a, source in sources.items()}
    assert max(counts.values()) <= 5, counts
