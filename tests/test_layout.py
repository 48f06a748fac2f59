"""The package layout: no import cycles, the planning packages never import jax or the CLI,
the JAX-side packages import one another in one direction only, no package holds more than
15 modules, and no two modules share a name with different meanings."""

import ast
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "jax_blink")
PLANNING = ("topo", "planning", "schedule", "sim")
#: Modules planning must not reach: jax itself, the ops (and measurement) and the extension loader, the CLI.
FORBIDDEN = ("jax", "jaxlib", "jax_blink.ops", "jax_blink.choice", "jax_blink.processes",
             "jax_blink.measure", "jax_blink._ffi", "jax_blink.cli", "jax_blink.__main__")
#: The JAX side, lowest first (docs/architecture.md): a package imports only those before it.
JAX_SIDE = ("processes", "choice", "ops", "measure")
#: Module names found in more than one package, each with one meaning: the several-hosts
#: side of that package's layer.
SHARED_NAMES = {"hosts", "errors", "__init__"}


def modules():
    """``{module name: path}`` of every Python module of jax_blink."""
    out = {}
    for directory, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(directory, f), ROOT)[:-3].split(os.sep)
                name = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
                out[name] = os.path.join(directory, f)
    return out


def imports(name, path, known):
    """Every module ``name`` imports, at the top or inside functions (lazy imports count)."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = f"{base}.{node.module}" if node.level and node.module else (node.module or base)
            for alias in node.names:  # `from . import cost` imports the module jax_blink.planning.cost
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return found


def test_jax_blink_has_no_import_cycles():
    known = modules()
    graph = {name: {m for m in imports(name, path, known) if m in known and m != name}
             for name, path in known.items()}
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_planning_packages_import_neither_jax_nor_the_cli():
    known = modules()
    for name, path in known.items():
        if name.split(".")[1:2] and name.split(".")[1] in PLANNING:
            bad = sorted(m for m in imports(name, path, known)
                         if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
            assert not bad, f"{name} imports {bad}"


def test_every_planning_module_imports_alone_without_jax():
    names = [n for n in modules() if n.split(".")[1:2] and n.split(".")[1] in PLANNING]
    assert len(names) >= 29
    code = textwrap.dedent("""
        import importlib, sys
        sys.modules["jax"] = None  # any import of jax now fails
        importlib.import_module(sys.argv[1])
        reached = sorted(m for m, mod in sys.modules.items() if m in {forbidden!r} and mod is not None)
        assert not reached, reached
    """).format(forbidden=set(FORBIDDEN))
    runs = {name: subprocess.Popen([sys.executable, "-c", code, name], cwd=ROOT, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for name in names}
    for name, proc in runs.items():
        _, err = proc.communicate()
        assert proc.returncode == 0, f"{name}: {err}"


def test_the_public_names_resolve():
    code = textwrap.dedent("""
        import sys
        sys.modules["jax"] = None
        import jax_blink.planning.cost  # a submodule by its dotted name
        import jax_blink.sim
        import jax_blink
        assert callable(jax_blink.plan) and jax_blink.plan.__module__ == "jax_blink.planning.planner"
        for name in ("Topology", "Link", "TopologyError", "preset_names", "plan", "Plan", "Tree",
                     "PlanError", "plan_hosts", "HostPlan", "Schedule", "Step", "ScheduleError", "simulate"):
            assert name in jax_blink.__all__ and getattr(jax_blink, name) is not None, name
        assert jax_blink.simulate is jax_blink.sim.simulate
        p = jax_blink.plan(jax_blink.Topology.preset("shm:2"), cache=False)
        print(type(p).__name__, jax_blink.simulate(p.lower(64, "float32"), p.topology).time_s > 0)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["Plan", "True"]


def _package(name):
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and name != "jax_blink") else None


def test_the_jax_side_imports_in_one_direction():
    known = modules()
    wrong = []
    for name, path in known.items():
        here = _package(name)
        if here not in JAX_SIDE:
            continue
        for m in imports(name, path, known):
            there = _package(m) if m in known else None
            if there in JAX_SIDE and JAX_SIDE.index(there) > JAX_SIDE.index(here):
                wrong.append(f"{name} imports {m}")
    assert not wrong, wrong


def test_the_jax_side_packages_exist_as_documented():
    known = modules()
    for package in JAX_SIDE:
        assert f"jax_blink.{package}" in known, package
    arch = open(os.path.join(ROOT, "docs", "architecture.md")).read()
    for package in JAX_SIDE:
        assert f"{package}/" in arch, f"docs/architecture.md does not show {package}/"


def test_no_package_holds_more_than_15_modules_and_names_are_not_reused():
    known = modules()
    count, where = {}, {}
    for name, path in known.items():
        package = os.path.dirname(path)
        count[package] = count.get(package, 0) + (not path.endswith("__init__.py"))
        where.setdefault(os.path.basename(path)[:-3], set()).add(os.path.relpath(package, PACKAGE))
    crowded = {os.path.relpath(p, PACKAGE): n for p, n in count.items() if n > 15}
    assert not crowded, crowded
    reused = {m: sorted(ps) for m, ps in where.items() if len(ps) > 1 and m not in SHARED_NAMES}
    assert not reused, reused
    # a module may not share its name with a package either (ops/schedules.py beside schedule/)
    packages = {os.path.basename(p) for p in count}
    clashes = sorted(m for m in where if m in packages or m.rstrip("s") in packages or m + "s" in packages)
    assert not clashes, clashes
