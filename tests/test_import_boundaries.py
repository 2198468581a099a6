"""The package's layers import downward only (checked statically with `ast`, nothing imported).

Every import is counted, including those inside functions; only ``if TYPE_CHECKING:``
blocks are ignored (they never run). The rules:

* nothing under ``airflow_streambatch/engine`` imports Airflow: the engine runs on
  Spark executors and in notebooks, where Airflow is not installed;
* ``engine/worker`` (what runs on executors) never imports the driver's layers
  (``engine.execution``, ``engine.spark``, ``engine.plan``);
* layers import their own rank or lower (`RANKS`).
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

import pytest

PACKAGE = "airflow_streambatch"
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), PACKAGE)

# (module-name prefix, rank): a module takes the rank of its longest matching prefix.
RANKS: list[tuple[str, int]] = [
    (f"{PACKAGE}", 0),  # the package root: its version, nothing else
    (f"{PACKAGE}.engine.context", 0),
    (f"{PACKAGE}.engine.errors", 0),
    (f"{PACKAGE}.engine.network_settings", 0),
    (f"{PACKAGE}.engine.filesystems", 0),
    (f"{PACKAGE}.engine.worker", 1),
    (f"{PACKAGE}.engine.plan", 2),
    (f"{PACKAGE}.engine.spark", 3),
    (f"{PACKAGE}.engine.output", 3),
    (f"{PACKAGE}.engine.execution", 4),
    (f"{PACKAGE}.engine", 5),  # engine/__init__.py
    (f"{PACKAGE}.engine.dataset", 5),
    (f"{PACKAGE}.engine.read_api", 5),
    (f"{PACKAGE}.engine.read_options", 5),
    (f"{PACKAGE}.engine.read_formats", 5),
    (f"{PACKAGE}.engine.parquet_ranges", 5),
    (f"{PACKAGE}.engine.read_pruning", 5),
    (f"{PACKAGE}.engine.datasource", 5),
    (f"{PACKAGE}.engine.in_memory", 5),
    (f"{PACKAGE}.engine.dataset_methods", 5),
    (f"{PACKAGE}.engine.dataset_writes", 5),
    (f"{PACKAGE}.engine.split", 5),
    (f"{PACKAGE}.epochs", 6),
    (f"{PACKAGE}.hooks", 7),
    (f"{PACKAGE}.operators", 7),
    (f"{PACKAGE}.decorators", 7),  # @task.streambatch: the operator with a function for its pipeline
    (f"{PACKAGE}.sensors", 7),
    (f"{PACKAGE}.triggers", 7),
    (f"{PACKAGE}.get_provider_info", 7),
    (f"{PACKAGE}.demo", 7),
    (f"{PACKAGE}.plugins", 7),
]
EXACT_ONLY = {PACKAGE, f"{PACKAGE}.engine"}  # these rank only the package module itself, not what is under it


def rank_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, rank)
    for prefix, rank in RANKS:
        if module == prefix or (prefix not in EXACT_ONLY and module.startswith(prefix + ".")):
            if best is None or len(prefix) > best[0]:
                best = (len(prefix), rank)
    return best[1] if best else None


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    imported: str  # dotted module name (a submodule where ``from pkg import name`` names one)
    line: int

    def where(self) -> str:
        return f"{self.importer} (line {self.line}) imports {self.imported}"


def module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(ROOT))[: -len(".py")].split(os.sep)
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join(rel)


def all_modules() -> dict[str, str]:
    """Dotted name -> file path, for every module under the package."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                found[module_name(path)] = path
    return found


MODULES = all_modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool):
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.imports: list[Import] = []

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for child in node.orelse:  # the else branch runs
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.imports.append(Import(self.module, alias.name, node.lineno))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            # ``from pkg import mod`` imports the submodule; ``from pkg import name`` imports pkg
            self.imports.append(Import(self.module, sub if sub in MODULES else target, node.lineno))


def imports_of(module: str) -> list[Import]:
    path = MODULES[module]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    collector = _Collector(module, path.endswith("__init__.py"))
    collector.visit(tree)
    return collector.imports


ALL_IMPORTS = [imp for module in sorted(MODULES) for imp in imports_of(module)]
INTERNAL = [imp for imp in ALL_IMPORTS if imp.imported == PACKAGE or imp.imported.startswith(PACKAGE + ".")]


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_scan_sees_the_package():
    """Guards the other tests: a scan that finds nothing would pass them all."""
    assert f"{PACKAGE}.engine.worker.streams" in MODULES
    assert f"{PACKAGE}.engine.execution.operators.map" in MODULES
    assert any(imp.importer == f"{PACKAGE}.engine.execution.memory"
               and imp.imported == f"{PACKAGE}.engine.execution.stream_watcher" for imp in INTERNAL)
    # imports inside functions count
    src = "def f():\n    from airflow.models import DAG\n"
    collector = _Collector(f"{PACKAGE}.engine.x", False)
    collector.visit(ast.parse(src))
    assert [i.imported for i in collector.imports] == ["airflow.models"]
    # TYPE_CHECKING blocks do not, their else branch does
    src = "import typing\nif typing.TYPE_CHECKING:\n    import airflow\nelse:\n    import json\n"
    collector = _Collector(f"{PACKAGE}.engine.x", False)
    collector.visit(ast.parse(src))
    assert [i.imported for i in collector.imports] == ["typing", "json"]


def test_relative_imports_resolve():
    collector = _Collector(f"{PACKAGE}.engine.worker.blocks", False)
    collector.visit(ast.parse("from .owner import OWNER_FILE\nfrom ..execution import memory\nfrom . import udf\n"))
    assert [i.imported for i in collector.imports] == [
        f"{PACKAGE}.engine.worker.owner", f"{PACKAGE}.engine.execution.memory", f"{PACKAGE}.engine.worker.udf"]


def test_every_module_has_a_rank():
    unranked = sorted(m for m in MODULES if rank_of(m) is None)
    assert not unranked, f"modules without a layer rank (add them to RANKS in this test): {unranked}"


def test_the_engine_never_imports_airflow():
    bad = [imp.where() for imp in ALL_IMPORTS
           if _under(imp.importer, f"{PACKAGE}.engine") and imp.imported.split(".")[0] == "airflow"]
    assert not bad, ("rule 'the engine does not import Airflow (it runs on Spark executors and without "
                     "Airflow)' broken:\n" + "\n".join(bad))


@pytest.mark.parametrize("driver_layer", ["execution", "spark", "plan"])
def test_the_worker_never_imports_driver_layers(driver_layer):
    layer = f"{PACKAGE}.engine.{driver_layer}"
    bad = [imp.where() for imp in INTERNAL
           if _under(imp.importer, f"{PACKAGE}.engine.worker") and _under(imp.imported, layer)]
    assert not bad, f"rule 'engine.worker never imports engine.{driver_layer}' broken:\n" + "\n".join(bad)


def test_layers_import_downward_only():
    bad = []
    for imp in INTERNAL:
        mine, theirs = rank_of(imp.importer), rank_of(imp.imported)
        if theirs is None:
            bad.append(f"{imp.where()}, which is not a module of the package")
        elif mine is not None and theirs > mine:
            bad.append(f"{imp.where()}: rule 'import only rank <= own rank' broken "
                       f"(rank {mine} imports rank {theirs})")
    assert not bad, "layer violations:\n" + "\n".join(bad)


def test_the_rank_table_orders_the_layers():
    """The ranks themselves (so a typo in the table cannot silently allow an upward import)."""
    e = f"{PACKAGE}.engine"
    assert rank_of(f"{e}.errors") < rank_of(f"{e}.worker.blocks") < rank_of(f"{e}.plan.planner") \
        < rank_of(f"{e}.spark.session") < rank_of(f"{e}.execution.operators.map") < rank_of(e) \
        == rank_of(f"{e}.dataset") < rank_of(f"{PACKAGE}.epochs.runner") < rank_of(f"{PACKAGE}.hooks.streambatch")
    assert rank_of(f"{e}.unknown") is None
