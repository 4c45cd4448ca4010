"""The architecture as imports: which package may import which, and no import cycles; and the size fence.

Read statically from the source (every `import`, also inside functions, and `importlib.import_module`
of a literal name), so a lazy import cannot hide an edge. The map of what may import what is read
from docs/design.md's table ("Packages and what they may import"): for each subpackage or top-level
module of verl_memagent, and for the examples and the benchmarks, which of our packages they may use.
A benchmark runs as a script, its folder on `sys.path`: a bare `import shared` is `benchmarks.shared`,
and a bare name of a test helper (tests/ is on pytest's path) is that helper, so the arrow shows.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("verl_memagent", "memagent_examples", "retriever_server", "benchmarks")
#: the example tasks: each is a folder of memagent_examples that neither the floor nor another task imports
TASKS = ("learn_codes", "composed_doors")

#: package -> the packages it must never import (docs/design.md, "Packages and what they may import")
FORBIDDEN = {
    "verl_memagent": ("retriever_server", "memagent_examples", "tests", "benchmarks", "recipes"),
    "verl_memagent.reward": ("verl_memagent.agent", "verl_memagent.algo"),
    "verl_memagent.algo": ("verl_memagent.agent",),
    "verl_memagent.trajectories": ("verl_memagent.agent", "verl_memagent.algo", "verl_memagent.eval"),
    "memagent_examples": ("tests", "benchmarks"),
    "retriever_server": ("verl", "verl_memagent", "memagent_examples", "tests", "benchmarks", "recipes"),
    "benchmarks": ("tests",),
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
#: our top-level packages (and the folders beside them) an import may name
OURS = ("verl_memagent", "retriever_server", "memagent_examples", "benchmarks", "tests", "recipes")


def package_map(design: str = "") -> dict[str, tuple[str, ...]]:
    """`memagent_examples` and `benchmarks` -> the other packages of ours they may import: the names of
    `OURS` in code in their row's "may import" column of docs/design.md, before any "never"."""
    design = design or DESIGN.read_text(encoding="utf-8")
    allowed = {}
    for line in design.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        if len(cells) == 3 and cells[0] in ("`memagent_examples/`", "`benchmarks/`"):
            names = re.findall(r"`([^`]+)`", cells[2].split("never")[0])
            allowed[cells[0].strip("`/")] = tuple(name for name in names if name in OURS)
    return allowed


def unlisted_package_imports(package: str, root: Path = REPO, map_: dict | None = None) -> list[str]:
    """Imports of our packages from `package` that its row of the map does not list."""
    allowed = (package, *(map_ or package_map())[package])
    return sorted(
        f"{module_name(path, root)} imports {name}"
        for path in (root / package).rglob("*.py")
        for name in imported_names(path, root)
        if name.split(".")[0] in OURS and name.split(".")[0] not in allowed
    )


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
    if module.startswith("benchmarks."):
        names = {script_import(name, root) for name in names}
    return names


def script_import(name: str, root: Path = REPO) -> str:
    """What a bare import in a script of benchmarks/ (its folder first on `sys.path`) resolves to: a module
    beside it, else a test helper of the same name (were tests/ put on the path), else `name` itself."""
    top, _, rest = name.partition(".")
    if (root / "benchmarks" / f"{top}.py").is_file():
        return f"benchmarks.{name}"
    helper = helper_modules(root).get(top)
    return ".".join([helper, rest] if rest else [helper]) if helper else name


@functools.cache
def helper_modules(root: Path) -> dict[str, str]:
    """Each helper module of the tests (neither a test nor a conftest) by its bare name -> its dotted path."""
    modules = (path for path in (root / "tests").rglob("*.py") if not path.name.startswith(("test_", "conftest")))
    return {path.stem: module_name(path, root) for path in modules}


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
    narrowed = design.replace("`generation`, `import_hooks` |", "`import_hooks` |")
    assert unlisted_imports("cpu", map_=may_import(narrowed)) == [
        "verl_memagent.cpu.hf_rollout imports verl_memagent.generation.generator",
        "verl_memagent.cpu.hf_rollout imports verl_memagent.generation.generator.HFGenerator",
    ]


def test_the_plugins_registration_modules_are_edges_of_the_map():
    """`plugin.py` imports the modules `PROVIDES` names in a loop; the reader counts them as its imports."""
    modules = {"verl_memagent.cpu.register", "verl_memagent.agent.register", "verl_memagent.algo.register"}
    assert modules <= imported_names(REPO / "verl_memagent" / "plugin.py", REPO)
    assert all((REPO / (name.replace(".", "/") + ".py")).is_file() for name in modules)


@pytest.mark.parametrize("package", PACKAGES)
def test_package_has_no_import_cycle(package):
    assert import_cycles(package) == []


@pytest.mark.parametrize("package", ["memagent_examples", "benchmarks"])
def test_the_examples_and_benchmarks_import_only_the_packages_the_map_allows(package):
    assert set(package_map()) == {"memagent_examples", "benchmarks"}
    assert unlisted_package_imports(package) == []


def test_the_map_of_packages_is_read_from_the_design_table_and_sees_a_hidden_test_helper(tmp_path):
    """A benchmark importing a test helper by its bare name (tests/ put on `sys.path`) imports tests."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "vllm_cpu.py").write_text("")
    (tmp_path / "benchmarks" / "shared.py").write_text("")
    (tmp_path / "benchmarks" / "bench.py").write_text("import shared\nfrom vllm_cpu import X\nimport verl_memagent\n")
    assert imported_names(tmp_path / "benchmarks" / "bench.py", tmp_path) == {
        "benchmarks.shared",
        "tests.vllm_cpu",
        "tests.vllm_cpu.X",
        "verl_memagent",
    }
    design = DESIGN.read_text(encoding="utf-8")
    narrowed = re.sub(r"(\| `benchmarks/` \|[^|]*\|)[^|]*\|", r"\1 `verl_memagent` |", design)
    assert package_map(narrowed)["benchmarks"] == ("verl_memagent",)
    assert unlisted_package_imports("benchmarks", tmp_path, package_map(narrowed)) == [
        "benchmarks.bench imports tests.vllm_cpu",
        "benchmarks.bench imports tests.vllm_cpu.X",
    ]


def test_no_benchmark_puts_a_folder_on_the_import_path():
    """`sys.path` edits hide where an import comes from (the packages install; the script's folder is first)."""
    found = [
        f"{path.name}:{node.lineno}"
        for path in sorted((REPO / "benchmarks").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys"
    ]
    assert found == []


def test_no_example_task_imports_another_and_the_floor_imports_none():
    """The tasks stand on the floor (the modules of memagent_examples beside them), never on each other."""
    found = []
    for path in sorted((REPO / "memagent_examples").rglob("*.py")):
        module = module_name(path, REPO)
        own = module.split(".")[1] if module.count(".") and module.split(".")[1] in TASKS else None
        for name in imported_names(path, REPO):
            task = name.split(".")[1] if name.startswith("memagent_examples.") and name.count(".") else None
            if task in TASKS and task != own and (own or path.parent.name == "memagent_examples"):
                found.append(f"{module} imports {name}")
    assert found == []


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


#: the most lines a module, class or function of ours may have: past them it holds two subjects
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


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_class_or_function_is_oversized(package):
    found = {
        str(path.relative_to(REPO)): sizes
        for path in sorted((REPO / package).rglob("*.py"))
        if (sizes := oversized(path))
    }
    assert found == {}, f"split along the subjects (limits {MAX_LINES}): {found}"
