"""The layers, as ARCHITECTURE.md draws them: imports only go down, and nothing goes in a circle.

ground: workbench.errors, workbench.executor, workbench.jit, workbench.store.*  (format-blind: no ingest, no detectors)
middle: ingest.*  |  detectors.*                  (side by side: neither imports the other)
faces:  workbench (the package: the Python API, workbench.api), workbench.cli, workbench.render,
        workbench.watch, workbench.notify, workbench.app.*, app.py

And the store's private views (`_chunks`, `_parts`, `_points`, ...) are named in SQL only inside
workbench/store/: everything above asks the store's questions (workbench/store/reads.py).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("workbench", "ingest", "detectors")


def _modules() -> dict[str, Path]:
    mods = {"app": ROOT / "app.py"}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            mods[".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")] = p
    return mods


MODULES = _modules()


# sample_runs/ is a folder of scripts (no package): its modules import each other by bare name
SAMPLE_RUNS = {p.stem: p for p in (ROOT / "sample_runs").glob("*.py")}


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, modules: dict[str, Path] = MODULES) -> set[str]:
    """The modules of `modules` that `module` imports, at any depth of its code (function-level too)."""
    path = modules[module]
    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(n, ast.Import):
            names = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in n.names]
        found |= {o for t in names if (o := _owner(t, modules)) and o != module}
    return found


def layer(module: str) -> str:
    # the executors map a function over items and import nothing of the layers (Ray only when
    # asked), the JIT wrapper only numba; the `workbench` package is the library's face (it
    # imports nothing when imported: its names resolve on first use)
    ground = (
        "workbench.errors",
        "workbench.executor",
        "workbench.ray_executor",
        "workbench.jit",
    )
    if module in ground or module.startswith("workbench.store"):
        return "ground"
    if module.startswith(("ingest", "detectors")):
        return module.split(".")[0]
    return "faces"


ALLOWED = {
    "ground": {"ground"},
    "ingest": {"ground", "ingest"},
    "detectors": {"ground", "detectors"},
    "faces": {"ground", "ingest", "detectors", "faces"},
}


def test_imports_only_go_down():
    upward = [
        f"{m} ({layer(m)}) imports {t} ({layer(t)})"
        for m in MODULES
        for t in _imports(m)
        if layer(t) not in ALLOWED[layer(m)]
    ]
    assert upward == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    cycles = []

    def visit(m, path):
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(path[path.index(t) :] + [t])
            elif t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def test_no_import_cycles():
    assert _cycles({m: _imports(m) for m in MODULES}) == []


def test_sample_runs_generator_has_no_import_cycles():
    """One way down: generate.py drives corpus/trainers/labels, which read specs.py's registry."""
    graph = {m: _imports(m, SAMPLE_RUNS) for m in SAMPLE_RUNS}
    assert {"generate", "specs", "trainers", "labels"} <= graph.keys()
    assert _cycles(graph) == []
    assert [m for m, deps in graph.items() if "generate" in deps] == []  # the entry point, on top
    assert graph["specs"] == set()  # the registry imports no trainer: no registration by side effect


def test_detectors_and_store_load_no_face_and_no_reader():
    code = (
        "import sys, detectors.builtins, detectors.backtest, workbench.store;"
        "print(sorted(m for m in sys.modules if m.startswith(('workbench.cli', 'workbench.app', "
        "'workbench.render', 'streamlit', 'ingest'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_every_format_module_declares_the_contract():
    from ingest.base import Ingestor
    from ingest.registry import make_ingestors, precedence

    ingestors = make_ingestors()
    assert all(isinstance(i, Ingestor) for i in ingestors)
    names = [i.name for i in ingestors]
    assert len(set(names)) == len(names)
    # every format that stores points has a place in the precedence; text comes last
    ranked = precedence(ingestors)
    assert ranked[0] == "hf_trainer" and ranked[-1] == "text_log"
    assert set(ranked) == {i.name for i in ingestors if i.precedence is not None}


def test_importing_workbench_loads_nothing_heavy():
    """The CLI imports the package first: its names (wb.Store, wb.ingest, ...) load on use, and
    the store's reader loads DuckDB alone (its writer brings polars)."""
    code = (
        "import sys, workbench; heavy = ('polars', 'pyarrow', 'numba', 'duckdb', 'workbench.store');"
        "print(sorted(m for m in heavy if m in sys.modules)); workbench.Store;"
        "print(sorted(m for m in heavy if m in sys.modules)); workbench.store.StoreWriter;"
        "print('polars' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.splitlines() == ["[]", "['duckdb', 'workbench.store']", "True"]


def _private_views() -> set[str]:
    """The store's private names: `_` + each table of a generation, and each `_name` view."""
    from workbench.store import schema

    views = (ROOT / "workbench/store/views.py").read_text(encoding="utf-8")
    return {f"_{t}" for t in {**schema.META_TABLES, **schema.DERIVED_TABLES}} | set(
        re.findall(r"VIEW (_\w+) AS", views)
    )


PRIVATE = re.compile(r"(?<![\w.])(" + "|".join(sorted(_private_views(), key=len, reverse=True)) + r")\b")


def _private_names_in_strings(path: Path) -> list[str]:
    """`file:line: name` of every string constant (SQL text, f-string parts) naming a private view."""
    return [
        f"{path.relative_to(ROOT)}:{n.lineno}: {m[1]}"
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
        for m in PRIVATE.finditer(n.value)
    ]


def test_only_the_store_names_its_private_views():
    assert {
        "_chunks",
        "_chunk_tags",
        "_parts",
        "_points",
        "_files",
        "_cutoffs",
        "_tag_metric",
    } <= _private_views()
    # the check sees them where they are named: the store's own questions
    assert "_points" in " ".join(_private_names_in_strings(ROOT / "workbench/store/reads.py"))
    outside = [p for m, p in MODULES.items() if not m.startswith("workbench.store")]
    outside += sorted((ROOT / "benchmarks").glob("*.py")) + sorted(SAMPLE_RUNS.values())
    assert [hit for p in outside for hit in _private_names_in_strings(p)] == []


def test_view_names_list_every_view_the_store_creates(tmp_path):
    """`workbench sql` opens no table for a query that names no view (`SELECT 1`): that holds
    only while VIEW_NAMES lists every view."""
    from workbench.store import views

    made = set(re.findall(r"VIEW (\w+) AS", "\n".join(views.view_statements(tmp_path, tmp_path))))
    assert made == views.VIEW_NAMES
    assert views.reads_no_view("SELECT 1") and views.reads_no_view("select * from read_csv('x.csv')")
    assert not views.reads_no_view("SELECT count(*) FROM Scalars")
    # a name inside a string literal or a comment names no view; a quoted name does
    assert views.reads_no_view("SELECT 'runs' FROM read_parquet('/s/scalars/a.parquet') -- labels, it's")
    assert views.reads_no_view("/* what's in\n the runs */ SELECT 'a' FROM read_csv('x.csv')")
    assert not views.reads_no_view("/* it's */ SELECT * FROM runs WHERE run_id = 'a'")
    assert not views.reads_no_view('SELECT * FROM "Runs"')


def test_a_one_shot_query_makes_only_the_views_it_reads(tmp_path):
    """The parts' paths hold `scalars` (and a store's path may hold `runs`): a query of `runs`
    makes the views under it, none of the point views, and the shared metadata ones as tables."""
    from conftest import DATA, ingest_paths

    from workbench.store import Store

    store = Store(tmp_path / "runs" / "store")
    ingest_paths(store, DATA / "generated" / "tbx_run")
    con = store.connect("SELECT run_id, status FROM runs")
    made = dict(con.execute("SELECT view_name, 'view' FROM duckdb_views() WHERE NOT internal").fetchall())
    made |= dict(con.execute("SELECT table_name, 'table' FROM duckdb_tables()").fetchall())
    assert made["runs"] == "view" and made["_file_order"] == made["_tag_metric"] == "table"
    assert {"scalars", "scalars_all", "_points", "_cutoffs", "histograms"}.isdisjoint(made)
    # the same answer as a connection with every view (its status chain stays views)
    one_shot = con.execute("SELECT * EXCLUDE (ingested_at) FROM runs").fetchall()
    assert one_shot == store.connect().execute("SELECT * EXCLUDE (ingested_at) FROM runs").fetchall()
    assert [r[:2] for r in one_shot] == [("run_a", "completed")]
