"""The package's shape: role folders in layers, no import from a lower layer up to a higher one (at module level
or inside a function), no import cycle at module level, no module over 400 lines, and ``wire`` free of Spark
and torch at import."""
import ast
import os
import subprocess
import sys

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "spark_dist")

# Lowest first; a module may import its own layer and those below it.
LAYERS = [
    ["spark_dist.errors"],
    ["spark_dist.wire", "spark_dist.host"],
    ["spark_dist.spark"],
    ["spark_dist.config"],
    ["spark_dist.data", "spark_dist.backends"],
    ["spark_dist.task"],
    ["spark_dist.driver"],
    ["spark_dist.ml", "spark_dist.inference", "spark_dist.tune", "spark_dist.dropins", "spark_dist.cli",
     "spark_dist.__main__"],
]


def layer_of(module: str) -> int:
    if module == "spark_dist":  # the package's __init__: the public names, on top
        return len(LAYERS) - 1
    for level, roots in enumerate(LAYERS):
        if any(module == root or module.startswith(root + ".") for root in roots):
            return level
    raise AssertionError(f"{module} is in no layer: add its folder to LAYERS")


def modules():
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                yield ".".join(parts), path


def imports(module: str, path: str):
    """(imported spark_dist module, at module level?) for every import statement in the file."""
    tree = ast.parse(open(path).read())
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # `from pkg import mod` imports pkg.mod when mod is a module
            names = [f"{origin}.{alias.name}" if is_module(f"{origin}.{alias.name}") else origin
                     for alias in node.names]
        else:
            continue
        for name in names:
            if name == "spark_dist" or name.startswith("spark_dist."):
                yield name, id(node) in top_level


def is_module(name: str) -> bool:
    rel = os.path.join(os.path.dirname(PACKAGE), *name.split("."))
    return os.path.isfile(rel + ".py") or os.path.isfile(os.path.join(rel, "__init__.py"))


ALL = dict(modules())


def test_every_module_is_in_a_layer_and_imports_only_downwards():
    upward = []
    for module, path in ALL.items():
        for imported, _ in imports(module, path):
            if layer_of(imported) > layer_of(module):
                upward.append(f"{module} imports {imported}")
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("inside_functions", [False, True], ids=["module level", "inside functions too"])
def test_no_import_cycle(inside_functions):
    """No cycle among the modules' imports: at module level (an import error), nor counting the imports inside
    functions (two modules that need each other are one job split in two)."""
    graph = {m: {i for i, top in imports(m, p) if (top or inside_functions) and i in ALL and i != m}
             for m, p in ALL.items()}
    # A package's __init__ running its children is not a cycle through them, nor a child reading its package.
    graph = {m: {i for i in deps if not i.startswith(m + ".") and not m.startswith(i + ".")}
             for m, deps in graph.items()}
    state = {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                pytest.fail("import cycle: " + " -> ".join(trail[trail.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for module in graph:
        if module not in state:
            visit(module, [module])


def test_no_module_over_400_lines():
    long = {m: n for m, p in ALL.items() if (n := sum(1 for _ in open(p))) > 400}
    assert not long, long


def test_every_package_states_its_contract():
    bare = [m for m, p in ALL.items() if p.endswith("__init__.py") and ast.get_docstring(ast.parse(open(p).read())) is None]
    assert not bare, bare


def test_the_wire_imports_neither_spark_nor_torch():
    code = ("import sys, pkgutil, importlib, spark_dist.wire as w\n"
            "[importlib.import_module(m.name) for m in pkgutil.iter_modules(w.__path__, 'spark_dist.wire.')]\n"
            "print(sorted(n for n in ('torch', 'pyspark') if n in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
