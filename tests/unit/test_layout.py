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
    ["spark_dist.wire", "spark_dist.host", "spark_dist.horovod"],
    ["spark_dist.spark"],
    ["spark_dist.conf_values", "spark_dist.config"],
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


# spark_dist.data: two rooms and the contract between them (docs/layout.md). A new module of the contract (directly
# under spark_dist/data/) is named here: what travels between the rooms is a decision, not an accident.
DATA_ROOMS = {"spark_dist.data.prepare": "the driver's room", "spark_dist.data.read": "the rank's room"}
DATA_CONTRACT = {"spark_dist.data.handle", "spark_dist.data.schema", "spark_dist.data.urls", "spark_dist.data.codecs"}


def data_room(module: str) -> str:
    """Where ``module`` sits in spark_dist.data: one of :data:`DATA_ROOMS`, "the contract", "the package's face"
    (``spark_dist.data`` itself) or "" (outside)."""
    for root, room in DATA_ROOMS.items():
        if module == root or module.startswith(root + "."):
            return room
    if module == "spark_dist.data":
        return "the package's face"
    return "the contract" if module.startswith("spark_dist.data.") else ""


def outside_imports(path: str):
    """The top-level names of the modules a file imports from outside the package (``pyspark``, ``torch``, ...), at
    module level or inside a function."""
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.module.split(".")[0]


def test_the_data_rooms_meet_only_in_their_contract():
    """The rank's room never imports the driver's, nor PySpark or spark_dist.spark: a rank has no Spark. The driver's
    room never imports the rank's: what both need is the contract, which imports neither room. None of them imports
    the package's face (its driver names are the driver room's). Imports inside functions count."""
    allowed = {"the driver's room": {"the driver's room", "the contract", ""},
               "the rank's room": {"the rank's room", "the contract", ""},
               "the contract": {"the contract", ""}}
    crossings, data = [], {m: p for m, p in ALL.items() if data_room(m) in allowed}
    for module, path in data.items():
        room = data_room(module)
        if room == "the contract" and module not in DATA_CONTRACT:
            crossings.append(f"{module} is in neither room nor in DATA_CONTRACT: move it into a room, or name it there")
        for imported, _ in imports(module, path):
            if data_room(imported) not in allowed[room]:
                crossings.append(f"{module} ({room}) imports {imported} ({data_room(imported)})")
            elif room == "the rank's room" and (imported + ".").startswith("spark_dist.spark."):
                crossings.append(f"{module} (the rank's room) imports {imported}: a rank has no Spark")
        if room == "the rank's room" and "pyspark" in set(outside_imports(path)):
            crossings.append(f"{module} (the rank's room) imports pyspark: a rank has no Spark")
    assert not crossings, "\n".join(crossings)
    assert {data_room(m) for m in data} == set(allowed)  # both rooms and the contract hold modules


def test_the_data_rooms_test_sees_a_crossing_inside_a_function(tmp_path):
    """The rule above catches a rank module's import of the driver's room inside a function (and a module-level one
    of PySpark): it reads what :func:`imports` and :func:`outside_imports` find."""
    code = tmp_path / "crossing.py"
    code.write_text("import numpy\n\n\ndef later():\n    from ..prepare import registry\n    import pyspark.sql\n")
    found = [name for name, top in imports("spark_dist.data.read.crossing", str(code))]
    assert found == ["spark_dist.data.prepare.registry"] and data_room(found[0]) == "the driver's room"
    assert set(outside_imports(str(code))) == {"numpy", "pyspark"}
