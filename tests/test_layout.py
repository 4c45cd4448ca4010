"""The architecture as imports: which package may import which, and no import cycles.

Read statically from the source (every `import`, also inside functions, and `importlib.import_module`
of a literal name), so a lazy import cannot hide an edge. The map of what may import what is read
from docs/design.md's table ("Packages and what they may import").
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("verl_memagent", "memagent_examples", "retriever_server")

#: package -> the packages it must never import (docs/design.md, "Packages and what they may import")
FORBIDDEN = {
    "verl_memagent": ("retriever_server", "memagent_examples", "tests", "benchmarks", "recipes"),
    "verl_memagent.reward": ("verl_memagent.agent", "verl_memagent.algo"),
    "verl_memagent.algo": ("verl_memagent.agent",),
    "verl_memagent.trajectories": ("verl_memagent.agent", "verl_memagent.algo", "verl_memagent.eval"),
    "memagent_examples": ("tests", "benchmarks"),
    "retriever_server": ("verl", "verl_memagent", "memagent_examples", "tests", "benchmarks", "recipes"),
}

DESIGN = REPO / "docs" / "design.md"
#: a "may import" cell that allows every module of ours
ANY = "any of `verl_memagent`"


def our_module(name: str, root: Path = REPO) -> bool:
    path = root / "verl_memagent" / name.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").is_file()


def may_import(design: str = "", root: Path = REPO) -> dict[str, tuple[str, ...] | None]:
    """Subpackage or top-level module of verl_memagent -> the modules of ours outside itself it may
    import (None: any), read from docs/design.md's "may import" column: the names in code there
    that are our modules, before any "never"."""
    design = design or DESIGN.read_text(encoding="utf-8")
    allowed = {}
    for line in design.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        if len(cells) != 3 or not cells[0].startswith("`verl_memagent/"):
            continue
        names = [span.removeprefix("verl_memagent/") for span in re.findall(r"`([^`]+)`", cells[0])]
        column = cells[2].split("never")[0]
        imports = None if ANY in column else tuple(n for n in re.findall(r"`([^`]+)`", column) if our_module(n, root))
        for name in names:
            if "*" not in name:
                allowed[name.removesuffix("/").removesuffix(".py")] = imports
    return allowed


#: subpackage or top-level module of verl_memagent -> the only modules of ours outside itself it may
#: import: docs/design.md's "may import" column (third-party imports are not checked)
MAY_IMPORT = may_import()


def our_units(root: Path = REPO) -> set[str]:
    """verl_memagent's subpackages and top-level modules."""
    return {
        path.stem if path.suffix == ".py" else path.name
        for path in (root / "verl_memagent").iterdir()
        if path.suffix == ".py" or (path / "__init__.py").is_file()
    }


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, root: Path) -> set[str]:
    """Every module name `path` imports (for `from a import b`: `a` and `a.b`, whichever is a module)."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    if module == "verl_memagent.plugin":
        names |= registration_modules(root)
    return names


def registration_modules(root: Path = REPO) -> set[str]:
    """The modules `plugin.py` imports by name from `PROVIDES` (a loop the import reader cannot see)."""
    tree = ast.parse((root / "verl_memagent" / "plugin.py").read_text(encoding="utf-8"))
    provides = next(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "PROVIDES"
    )
    return {key.value for key in provides.keys if isinstance(key, ast.Constant)}


def unlisted_imports(unit: str, root: Path = REPO, map_: dict | None = None) -> list[str]:
    """Imports of our own modules from `verl_memagent.<unit>` (a subpackage or a top-level module) that
    the map (`MAY_IMPORT`) does not list."""
    listed = (map_ or MAY_IMPORT)[unit]
    if listed is None:
        return []
    allowed = (f"verl_memagent.{unit}", *(f"verl_memagent.{name}" for name in listed))
    base = root / "verl_memagent" / unit
    files = sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
    return sorted(
        f"{module_name(path, root)} imports {name}"
        for path in files
        for name in imported_names(path, root)
        if name.startswith("verl_memagent") and not any(name == a or name.startswith(a + ".") for a in allowed)
    )


def forbidden_imports(package: str, root: Path = REPO) -> list[str]:
    return sorted(
        f"{module_name(path, root)} imports {name}"
        for path in (root / package.replace(".", "/")).rglob("*.py")
        for name in imported_names(path, root)
        if any(name == banned or name.startswith(banned + ".") for banned in FORBIDDEN[package])
    )


def import_cycles(package: str, root: Path = REPO) -> list[list[str]]:
    """Groups of modules of `package` that import each other, directly or around a loop."""
    files = {module_name(path, root): path for path in sorted((root / package).rglob("*.py"))}
    graph = nx.DiGraph()
    for name, path in files.items():
        graph.add_edges_from((name, target) for target in imported_names(path, root) if target in files)
    return sorted(sorted(group) for group in nx.strongly_connected_components(graph) if len(group) > 1)


@pytest.mark.parametrize("package", FORBIDDEN)
def test_package_imports_only_what_the_map_allows(package):
    assert forbidden_imports(package) == []


@pytest.mark.parametrize("unit", sorted(MAY_IMPORT))
def test_each_module_imports_only_the_modules_of_ours_it_may(unit):
    assert unlisted_imports(unit) == []


def test_design_md_has_a_row_for_every_subpackage_and_top_level_module():
    assert set(MAY_IMPORT) == our_units()
    for leaf in ("output_fields", "config_sections", "grammar", "progress"):
        assert MAY_IMPORT[leaf] == (), leaf  # the leaves import nothing of ours
    assert "reward" not in MAY_IMPORT["agent"]  # the walk from a turn's text to its calls stays in agent/


def test_the_map_is_read_from_the_design_table():
    """A name added to or taken from the design table's column changes what the check allows."""
    design = DESIGN.read_text(encoding="utf-8")
    search_row = "probe (`endpoint.py`) | httpx; nothing else of ours |"
    assert search_row in design
    widened = design.replace(search_row, "probe (`endpoint.py`) | httpx, `output_fields` |")
    assert may_import(widened)["search"] == ("output_fields",)
    narrowed = design.replace("`hf_generator`, `import_hooks` |", "`import_hooks` |")
    assert unlisted_imports("cpu", map_=may_import(narrowed)) == [
        "verl_memagent.cpu.hf_rollout imports verl_memagent.hf_generator",
        "verl_memagent.cpu.hf_rollout imports verl_memagent.hf_generator.HFGenerator",
    ]


def test_the_plugins_registration_modules_are_edges_of_the_map():
    """`plugin.py` imports the modules `PROVIDES` names in a loop; the reader counts them as its imports."""
    modules = {"verl_memagent.cpu.register", "verl_memagent.agent.register", "verl_memagent.algo.register"}
    assert modules <= imported_names(REPO / "verl_memagent" / "plugin.py", REPO)
    assert all((REPO / (name.replace(".", "/") + ".py")).is_file() for name in modules)


@pytest.mark.parametrize("package", PACKAGES)
def test_package_has_no_import_cycle(package):
    assert import_cycles(package) == []


def test_the_checks_find_a_hidden_cycle_and_a_forbidden_import(tmp_path):
    fake = tmp_path / "verl_memagent"
    (fake / "sub").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "sub" / "__init__.py").write_text("")
    (fake / "a.py").write_text("def f():\n    from .sub import b\n")
    (fake / "sub" / "b.py").write_text("import importlib\n\nimportlib.import_module('verl_memagent.a')\n")
    (fake / "c.py").write_text("def serve():\n    from retriever_server.app import create_app\n")
    (fake / "search").mkdir()
    (fake / "search" / "client.py").write_text("from verl_memagent.agent import turns\n")
    assert import_cycles("verl_memagent", tmp_path) == [["verl_memagent.a", "verl_memagent.sub.b"]]
    assert forbidden_imports("verl_memagent", tmp_path) == [
        "verl_memagent.c imports retriever_server.app",
        "verl_memagent.c imports retriever_server.app.create_app",
    ]
    assert unlisted_imports("search", tmp_path) == [
        "verl_memagent.search.client imports verl_memagent.agent",
        "verl_memagent.search.client imports verl_memagent.agent.turns",
    ]


#: the most lines a module, class or function of verl_memagent may have: past them it holds two subjects
MAX_LINES = {"module": 350, "class": 250, "function": 80}


def oversized(path: Path) -> list[str]:
    """`kind name: lines` of the module at `path` and of its classes and functions over `MAX_LINES`."""
    text = path.read_text(encoding="utf-8")
    found = [f"module: {len(text.splitlines())}"] if len(text.splitlines()) > MAX_LINES["module"] else []
    for node in ast.walk(ast.parse(text)):
        kind = {ast.ClassDef: "class", ast.FunctionDef: "function", ast.AsyncFunctionDef: "function"}.get(type(node))
        if kind and (lines := node.end_lineno - node.lineno + 1) > MAX_LINES[kind]:
            found.append(f"{kind} {node.name}: {lines}")
    return found


def test_the_size_check_sees_a_long_function(tmp_path):
    long = tmp_path / "long.py"
    long.write_text("def f():\n" + "    x = 1\n" * 80)
    assert oversized(long) == ["function f: 81"]


def test_no_module_class_or_function_of_the_plugin_is_oversized():
    found = {
        str(path.relative_to(REPO)): sizes
        for path in sorted((REPO / "verl_memagent").rglob("*.py"))
        if (sizes := oversized(path))
    }
    assert found == {}, f"split along the subjects (limits {MAX_LINES}): {found}"
