"""The package's layers import downward only (checked statically with `ast`, nothing imported).

Every import is counted, including those inside functions; only ``if TYPE_CHECKING:``
blocks are ignored (they never run). The rules:

* nothing under ``airflow_streambatch/engine`` imports Airflow: the engine runs on
  Spark executors and in notebooks, where Airflow is not installed;
* ``engine/protocol`` (the contracts between driver and executors: block refs, task specs
  and results, check-in messages, stream ids, staging layout) sits below both sides and
  imports nothing of the package but itself and the basics (rank 0);
* ``engine/worker`` (what runs on executors) never imports the driver's layers
  (``engine.execution``, ``engine.spark``, ``engine.plan``);
* the driver's layers import from ``engine/worker`` only the names listed in
  `DRIVER_USES_OF_THE_WORKER`, each with why: contracts come from ``engine/protocol``;
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
    (f"{PACKAGE}.engine.atomic_files", 0),
    (f"{PACKAGE}.engine.execution_resources", 0),  # Ray's ExecutionOptions and ExecutionResources, held by DataContext
    (f"{PACKAGE}.engine.save_mode", 0),  # Ray's SaveMode, which the output layer takes too
    (f"{PACKAGE}.engine.protocol", 1),  # contracts between the driver and the executors
    (f"{PACKAGE}.engine.worker", 2),
    (f"{PACKAGE}.engine.plan", 3),
    (f"{PACKAGE}.engine.spark", 4),
    (f"{PACKAGE}.engine.output", 4),
    (f"{PACKAGE}.engine.execution", 5),
    (f"{PACKAGE}.engine", 6),  # engine/__init__.py
    (f"{PACKAGE}.engine.dataset", 6),
    (f"{PACKAGE}.engine.read_api", 6),
    (f"{PACKAGE}.engine.read_options", 6),
    (f"{PACKAGE}.engine.read_formats", 6),
    (f"{PACKAGE}.engine.parquet_ranges", 6),
    (f"{PACKAGE}.engine.read_pruning", 6),
    (f"{PACKAGE}.engine.datasource", 6),
    (f"{PACKAGE}.engine.in_memory", 6),
    (f"{PACKAGE}.engine.dataset_methods", 6),
    (f"{PACKAGE}.engine.lineage_serialization", 6),  # Ray's serialize_lineage/deserialize_lineage
    (f"{PACKAGE}.engine.dataset_writes", 6),
    (f"{PACKAGE}.engine.split", 6),
    (f"{PACKAGE}.engine.path_args", 6),  # Ray's paths (pathlib.Path) and shuffle= checks of reads and writes
    (f"{PACKAGE}.engine.block", 6),  # Ray's ray.data.block names (BlockMetadata)
    (f"{PACKAGE}.engine.compute", 6),  # ActorPoolStrategy/TaskPoolStrategy -> concurrency
    (f"{PACKAGE}.engine.custom_source", 6),  # custom Datasource/ReadTask, read_datasource
    (f"{PACKAGE}.engine.metadata_providers", 6),
    (f"{PACKAGE}.engine.transform_args", 6),  # repartition/random_sample argument checks
    (f"{PACKAGE}.engine.consumption", 6),  # take/take_all/schema/input_files, Ray's consumption semantics
    (f"{PACKAGE}.engine.iteration", 6),  # drop_last, the local shuffle buffer, iteration argument checks
    (f"{PACKAGE}.engine.schema", 6),  # Ray's Schema
    (f"{PACKAGE}.engine.dataset_sort", 6),  # sort/groupby/aggregate on Dataset
    (f"{PACKAGE}.engine.grouped_data", 6),  # Ray's ray.data.grouped_data.GroupedData
    (f"{PACKAGE}.engine.aggregate", 6),  # Ray's ray.data.aggregate names (Count, Sum, ...)
    (f"{PACKAGE}.engine.dataset_combine", 6),  # union/zip/random_shuffle/streaming_split on Dataset
    (f"{PACKAGE}.engine.dataset_repr", 6),  # repr(ds) in Ray's form
    (f"{PACKAGE}.engine.meta_count", 6),  # count() from metadata (Parquet footers, known sources)
    (f"{PACKAGE}.engine.parquet_meta", 6),  # what a Parquet read knows from its footers before it runs
    (f"{PACKAGE}.engine.read_resources", 6),  # Ray's num_cpus/concurrency/ray_remote_args of a read
    (f"{PACKAGE}.engine.num_blocks_alias", 6),  # Ray's deprecated parallelism= on reads, from_items, range
    (f"{PACKAGE}.engine.range_tensor", 6),  # Ray's range_tensor source
    (f"{PACKAGE}.engine.read_numpy", 6),  # Ray's read_numpy: .npy files as tensor rows
    (f"{PACKAGE}.engine.parquet_args", 6),  # Ray's batch_size/tensor_column_schema/_block_udf of Parquet reads
    (f"{PACKAGE}.engine.parquet_bulk", 6),  # Ray's read_parquet_bulk: named Parquet files, no footers up front
    (f"{PACKAGE}.engine.extensions", 6),  # Ray's ray.data.extensions names (ArrowTensorType)
    (f"{PACKAGE}.epochs", 7),
    (f"{PACKAGE}.hooks", 8),
    (f"{PACKAGE}.operators", 8),
    (f"{PACKAGE}.decorators", 8),  # @task.streambatch: the operator with a function for its pipeline
    (f"{PACKAGE}.sensors", 8),
    (f"{PACKAGE}.triggers", 8),
    (f"{PACKAGE}.get_provider_info", 8),
    (f"{PACKAGE}.demo", 8),
    (f"{PACKAGE}.plugins", 8),
]
DRIVER_LAYERS = ["execution", "spark", "plan"]

# What the driver's layers take from engine/worker, (worker module, name) -> why. Everything
# else they share with the executors is a contract and comes from engine/protocol. A name
# imported but not listed fails `test_driver_layers_import_from_the_worker_only_on_purpose`;
# one listed but no longer imported fails it too, so the list stays the truth.
DRIVER_USES_OF_THE_WORKER: dict[tuple[str, str], str] = {
    ("block_room", "check_block_room"): "the driver checks its own block directory before a run",
    ("blocks", "create_run_dir"): "the driver creates (and owns) the run's block directory on its host",
    ("transport", "read_any"): "the driver reads output blocks, from its host or a host agent",
    ("transport", "delete_blocks"): "the driver deletes blocks it consumed, on whichever host holds them",
    ("listen", "listen_on"): "the control server binds the way host agents do (one port-range rule)",
    ("task_runner", "run_partition"): "the Spark backend hands Spark the partition function executors run",
    ("udf", "visible_devices"): "local mode counts the driver host's GPUs as CUDA reads CUDA_VISIBLE_DEVICES",
    ("udf", "*"): "plan transforms call the executor-side UDF runners from methods that run on executors",
    ("batches", "DEFAULT_BATCH_FORMAT"): "plan nodes default to the batch format executors convert to",
    ("batches", "check_batch_format"): "a bad batch_format fails when the plan is built, not on an executor",
    ("sinks", "SinkOptions"): "a write node carries the sink's options to the executors",
    ("sinks", "write_task_output"): "a write node's method, run on executors, writes through the sink",
    ("sorting", "*"): "sort/groupby plan nodes call the executor-side sort and group code from methods run there",
    ("shuffle_rows", "permuted"): "random_shuffle's plan node permutes rows in a method run on executors",
    ("zip_columns", "zipped"): "zip's plan node joins columns in a method run on executors",
    ("tensors", "rows_table"): "from_items' read tasks, run on executors, turn items with arrays into tensor columns",
}
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


def _worker_names_taken_by(module: str) -> set[tuple[str, str]]:
    """(worker module, name) for each name ``module`` imports from engine/worker (``*``: the module itself)."""
    worker = f"{PACKAGE}.engine.worker"
    with open(MODULES[module], encoding="utf-8") as f:
        tree = ast.parse(f.read())
    collector = _Collector(module, MODULES[module].endswith("__init__.py"))
    collector.visit(tree)
    lines = {imp.line for imp in collector.imports if _under(imp.imported, worker)}  # TYPE_CHECKING left out
    taken: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) not in lines:
            continue
        if isinstance(node, ast.Import):
            taken.update((a.name.rsplit(".", 1)[1], "*") for a in node.names if _under(a.name, worker))
        elif isinstance(node, ast.ImportFrom):
            base = collector.package.split(".")
            target = ".".join(base[: len(base) - (node.level - 1)] + [node.module or ""]).strip(".") \
                if node.level else node.module or ""
            if target == worker:  # ``from engine.worker import udf``: whole modules
                taken.update((a.name, "*") for a in node.names)
            elif _under(target, worker):
                taken.update((target[len(worker) + 1:], a.name) for a in node.names)
    return taken


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


@pytest.mark.parametrize("driver_layer", DRIVER_LAYERS)
def test_the_worker_never_imports_driver_layers(driver_layer):
    layer = f"{PACKAGE}.engine.{driver_layer}"
    bad = [imp.where() for imp in INTERNAL
           if _under(imp.importer, f"{PACKAGE}.engine.worker") and _under(imp.imported, layer)]
    assert not bad, f"rule 'engine.worker never imports engine.{driver_layer}' broken:\n" + "\n".join(bad)


def test_the_protocol_imports_only_basics():
    """The contracts sit below both sides: a protocol module that imported the worker or a driver
    layer would drag executor or driver code into the other side again."""
    protocol = f"{PACKAGE}.engine.protocol"
    bad = [imp.where() for imp in INTERNAL if _under(imp.importer, protocol)
           and not _under(imp.imported, protocol) and rank_of(imp.imported) != 0]
    assert any(_under(imp.importer, protocol) for imp in INTERNAL), "the scan found no engine.protocol imports"
    assert not bad, "rule 'engine.protocol imports only itself and rank-0 basics' broken:\n" + "\n".join(bad)


def test_driver_layers_import_from_the_worker_only_on_purpose():
    taken: dict[tuple[str, str], list[str]] = {}
    for module in sorted(MODULES):
        if any(_under(module, f"{PACKAGE}.engine.{layer}") for layer in DRIVER_LAYERS):
            for use in _worker_names_taken_by(module):
                taken.setdefault(use, []).append(module)
    unlisted = [f"{importers} import {name} from engine.worker.{mod}"
                for (mod, name), importers in sorted(taken.items()) if (mod, name) not in DRIVER_USES_OF_THE_WORKER]
    assert not unlisted, ("driver layers import executor code they do not run on purpose; contracts belong in "
                          "engine.protocol, or list the name in DRIVER_USES_OF_THE_WORKER with why:\n"
                          + "\n".join(unlisted))
    stale = sorted(set(DRIVER_USES_OF_THE_WORKER) - set(taken))
    assert not stale, f"DRIVER_USES_OF_THE_WORKER lists names no driver layer imports any more: {stale}"


def test_the_driver_scan_sees_names_and_modules(tmp_path, monkeypatch):
    """Guards the test above: it must see names imported from the worker, by name and as modules."""
    src = ("from airflow_streambatch.engine.worker.blocks import read_block, write_block\n"
           "from airflow_streambatch.engine.worker import udf\n"
           "import airflow_streambatch.engine.worker.transport\n")
    path = tmp_path / "probe.py"
    path.write_text(src)
    module = f"{PACKAGE}.engine.execution.probe"
    monkeypatch.setitem(MODULES, module, str(path))
    assert _worker_names_taken_by(module) == {("blocks", "read_block"), ("blocks", "write_block"), ("udf", "*"),
                                             ("transport", "*")}


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
    assert rank_of(f"{e}.errors") == rank_of(f"{e}.atomic_files") < rank_of(f"{e}.protocol.tasks") \
        < rank_of(f"{e}.worker.blocks") < rank_of(f"{e}.plan.planner") \
        < rank_of(f"{e}.spark.session") < rank_of(f"{e}.execution.operators.map") < rank_of(e) \
        == rank_of(f"{e}.dataset") < rank_of(f"{PACKAGE}.epochs.runner") < rank_of(f"{PACKAGE}.hooks.streambatch")
    assert rank_of(f"{e}.unknown") is None
