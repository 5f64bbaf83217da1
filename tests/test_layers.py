"""The walls between sim's packages (docs/architecture.md), read from the source with `ast`.

Packages, bottom first: io < costmodel, policies, workload < config < engine < planning,
fit < report < calibrate < cli. A package imports only packages below it (never one on
its own floor); simpy only in engine/, torch only in calibrate/ and cli/calibrate.py;
only cli/ prints or exits; no import circles between modules; a registry (name -> class)
has exactly the names of its spec's Literal.

Each rule is a function of the import graph, so the tests below also feed it a graph
with a broken wall and check that the rule catches it.
"""

from __future__ import annotations

import ast
import typing
from dataclasses import fields
from pathlib import Path

import pytest

SIM = Path(__file__).resolve().parent.parent / "sim"
FLOORS = [("io",), ("costmodel", "policies", "workload"), ("config",), ("engine",),
          ("planning", "fit"), ("report",), ("calibrate",), ("cli",)]
FLOOR = {pkg: i for i, pkgs in enumerate(FLOORS) for pkg in pkgs}
OWN = {"simpy": ("engine",), "torch": ("calibrate", "cli/calibrate.py"),
       "triton": ("calibrate",)}


def module_name(path: Path) -> str:
    rel = path.relative_to(SIM.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def sources() -> dict[str, tuple[Path, ast.Module]]:
    return {module_name(p): (p, ast.parse(p.read_text(), str(p))) for p in sorted(SIM.rglob("*.py"))}


def imports(name: str, path: Path, tree: ast.Module) -> set[str]:
    """Every module this one imports (at any depth: in functions too, and under TYPE_CHECKING)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # `from sim.x import module`
    return out


def graph() -> dict[str, set[str]]:
    src = sources()
    return {name: {m for m in imports(name, p, t) if m in src or m.split(".")[0] in OWN}
            for name, (p, t) in src.items()}


def package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in FLOOR) else None


def wall_breaches(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in g.items():
        own = package(mod)
        for dep in deps:
            other = package(dep) if dep.startswith("sim.") else None
            if own is None or other is None or other == own:
                continue
            if FLOOR[other] >= FLOOR[own]:
                bad.append(f"{mod} imports {dep} ({other} is not below {own})")
    return sorted(bad)


def owner_breaches(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in g.items():
        path = mod.removeprefix("sim.").replace(".", "/")
        for dep in deps:
            owners = OWN.get(dep.split(".")[0])
            if owners and not any(path == o.removesuffix(".py") or path.startswith(o + "/")
                                  or path == o for o in owners):
                bad.append(f"{mod} imports {dep} (only {', '.join(owners)} may)")
    return sorted(bad)


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Import circles between modules (Tarjan's strongly connected components)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in g:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def no_package_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """Module-to-module edges only (`sim` itself re-exports lazily and is left out)."""
    return {m: {d for d in deps if d in g and d != "sim"} for m, deps in g.items() if m != "sim"}


def print_or_exit(g_src: dict[str, tuple[Path, ast.Module]]) -> list[str]:
    bad = []
    for mod, (_path, tree) in g_src.items():
        if mod.startswith("sim.cli") or mod == "sim.__main__":
            continue
        for node in ast.walk(tree):
            what = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                    "print", "exit", "quit", "input"):
                what = node.func.id + "()"
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and (
                    node.value.id == "sys" and node.attr in ("exit", "stdout", "stderr", "stdin")):
                what = f"sys.{node.attr}"
            elif isinstance(node, ast.Name) and node.id == "SystemExit":
                what = "SystemExit"
            if what:
                bad.append(f"{mod}:{node.lineno} uses {what}")
    return bad


# --- the walls hold --------------------------------------------------------------------

def test_every_module_lives_in_a_known_package():
    loose = [m for m in sources() if m not in ("sim", "sim.__main__") and package(m) is None]
    assert loose == []
    assert {m.split(".")[1] for m in sources() if package(m)} == set(FLOOR)


def test_a_package_imports_only_packages_below_it():
    assert wall_breaches(graph()) == []


def test_simpy_only_in_the_engine_and_torch_only_in_calibration():
    assert owner_breaches(graph()) == []


def test_no_import_circles():
    assert cycles(no_package_graph(graph())) == []


def test_only_the_cli_prints_or_exits():
    assert print_or_exit(sources()) == []


def test_the_cost_model_never_sees_a_scenario():
    for mod, deps in graph().items():
        if package(mod) == "costmodel":
            assert not {d for d in deps if package(d) in ("policies", "config", "engine")}, mod


# --- the rules catch a broken wall -------------------------------------------------------

def test_the_walls_catch_a_cost_model_that_reads_the_scenario():
    g = graph()
    g["sim.costmodel.latency"] = g["sim.costmodel.latency"] | {"sim.config.scenario"}
    assert wall_breaches(g) == ["sim.costmodel.latency imports sim.config.scenario "
                                "(config is not below costmodel)"]


def test_the_walls_catch_siblings_on_one_floor_and_an_upward_import():
    g = graph()
    g["sim.policies.kv"] = g["sim.policies.kv"] | {"sim.workload.traces"}
    g["sim.engine.replica"] = g["sim.engine.replica"] | {"sim.report.text"}
    assert wall_breaches(g) == [
        "sim.engine.replica imports sim.report.text (report is not below engine)",
        "sim.policies.kv imports sim.workload.traces (workload is not below policies)"]


def test_the_owner_rule_catches_simpy_outside_the_engine():
    g = graph()
    g["sim.planning.fleet"] = g["sim.planning.fleet"] | {"simpy"}
    assert owner_breaches(g) == ["sim.planning.fleet imports simpy (only engine may)"]


def test_the_cycle_rule_catches_a_circle():
    g = no_package_graph(graph())
    g["sim.io.specload"] = g["sim.io.specload"] | {"sim.io.outputs"}
    assert any({"sim.io.outputs", "sim.io.specload"} <= set(c) for c in cycles(g)), cycles(g)


def test_the_print_rule_catches_a_print_in_the_library():
    src = sources()
    path, _ = src["sim.engine.runner"]
    src["sim.engine.runner"] = (path, ast.parse("import sys\nprint('x')\nsys.exit(1)\n"))
    assert print_or_exit(src) == ["sim.engine.runner:2 uses print()", "sim.engine.runner:3 uses sys.exit"]


# --- registries ----------------------------------------------------------------------------

def _literal(spec: type, name: str) -> set[str]:
    hints = typing.get_type_hints(spec)
    (f,) = [f for f in fields(spec) if f.name == name]
    return set(typing.get_args(hints[f.name]))


def registries() -> dict[str, dict]:
    """Every module-level dict literal of sim whose keys are strings and values sim's classes."""
    import importlib

    out = {}
    for mod, (_path, tree) in sources().items():
        if mod.startswith("sim.calibrate") or mod == "sim.cli.calibrate":
            continue  # torch
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and node.value.keys and all(
                    isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.value.keys) and all(
                    isinstance(v, ast.Name) for v in node.value.values):
                value = getattr(importlib.import_module(mod), node.targets[0].id)
                if all(isinstance(v, type) and v.__module__.startswith("sim.") for v in value.values()):
                    out[f"{mod}.{node.targets[0].id}"] = value
    return out


@pytest.mark.parametrize("registry, spec, field", [
    ("sim.engine.build.POLICIES", "sim.policies.scheduler.SchedulerSpec", "policy"),
    ("sim.policies.router.ROUTERS", "sim.policies.router.RouterSpec", "policy"),
    ("sim.policies.kv.KV_MANAGERS", "sim.policies.kv.KVSpec", "manager"),
])
def test_a_registry_has_exactly_its_specs_names(registry, spec, field):
    import importlib

    found = registries()
    assert registry in found
    mod, _, cls = spec.rpartition(".")
    assert set(found[registry]) == _literal(getattr(importlib.import_module(mod), cls), field)


def test_every_registry_is_checked_against_a_spec():
    assert set(registries()) == {"sim.engine.build.POLICIES", "sim.policies.router.ROUTERS",
                                 "sim.policies.kv.KV_MANAGERS"}
