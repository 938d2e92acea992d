"""One-way layers, read from the folders and the imports in the source (ast):

    weights <- cost <- core <- tools <- api <- faces

weights: via_sd/weights/ (GGUF codes, low-bit linears, heads, row attention, the lean forward); cost:
via_sd/cost/ (the cost model, pure Python); core: via_sd/core/ (the method); tools: via_sd/bench/,
via_sd/route_search/; api: via_sd/__init__.py, which re-exports core and tools; faces: via_sd/cli/,
via_sd/__main__.py, app.py, studio/ and viz/. A module's layer is its folder's: there is no default.
Importing a module also runs its packages' __init__ first; that implicit step is not an edge here.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RANKS = {"weights": 0, "cost": 1, "core": 2, "tools": 3, "api": 4, "faces": 5}
FOLDERS = {"via_sd.weights": "weights", "via_sd.cost": "cost", "via_sd.core": "core", "via_sd.bench": "tools",
           "via_sd.route_search": "tools", "via_sd.cli": "faces", "via_sd.__main__": "faces", "viz": "faces",
           "studio": "faces", "app": "faces"}
MODEL_CODE = {"torch", "transformers", "accelerate", "safetensors", "tokenizers", "gguf"}
# Functions longer than this are split into named steps; the exceptions say why they stay long.
MAX_FUNCTION_LINES = 80
LONG_FUNCTIONS: dict[str, str] = {}


def module_files() -> dict[str, Path]:
    files = {"app": ROOT / "app.py"}
    for package in ("via_sd", "viz", "studio"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


FILES = module_files()


def layer(module: str) -> str:
    """The layer of a module: the folder it lives in (via_sd/__init__.py is the API)."""
    if module == "via_sd":
        return "api"
    folders = [f for f in FOLDERS if module == f or module.startswith(f + ".")]
    if not folders:
        raise AssertionError(f"{module} lives in no layer folder: move it into one of {sorted(FOLDERS)}")
    return FOLDERS[max(folders, key=len)]


def imports(module: str) -> set[str]:
    """Every module this one imports, anywhere in the file (lazy and TYPE_CHECKING imports count):
    project modules by name, others by their top-level name."""
    path = FILES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name if a.name in FILES else a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module
            if source not in FILES and source.split(".")[0] not in ("via_sd", "viz", "studio", "app"):
                found.add(source.split(".")[0])
                continue
            for alias in node.names:  # `from pkg import submodule` imports the submodule, not the package's API
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in FILES else source)
    found.discard(module)
    return found


GRAPH = {m: imports(m) for m in FILES}


def project_imports(module: str) -> set[str]:
    return {m for m in GRAPH[module] if m in FILES}


def reachable(*modules: str) -> set[str]:
    """The modules these import, directly or through others (themselves included)."""
    reached, todo = set(), list(modules)
    while todo:
        m = todo.pop()
        if m not in reached:
            reached.add(m)
            todo += project_imports(m)
    return reached


def test_the_parser_sees_the_imports_the_layering_is_about():
    assert "via_sd.core.routing" in project_imports("via_sd.core.pair")
    assert "via_sd.route_search.resolve" in project_imports("via_sd.cli.args")
    assert "via_sd" in project_imports("via_sd.cli.args")  # `from .. import load_pair`: the API
    assert "via_sd.bench" in project_imports("via_sd.cli.bench")
    assert "torch" in GRAPH["via_sd.core.routing"]
    assert [layer(m) for m in ("via_sd.weights.linears", "via_sd.cost.model", "via_sd.core.sampling",
                               "via_sd.bench.report", "via_sd", "viz.figures")] == list(RANKS)


def test_every_module_lives_in_a_layer_folder():
    for module in FILES:
        assert layer(module) in RANKS


@pytest.mark.parametrize("module", sorted(FILES))
def test_no_module_imports_a_layer_above_its_own(module):
    above = sorted(m for m in project_imports(module) if RANKS[layer(m)] > RANKS[layer(module)])
    assert not above, f"{module} ({layer(module)}) imports {above}, from a layer above it"


def test_the_import_graph_has_no_cycles():
    state, path = {}, []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for n in sorted(project_imports(m)):
            if state.get(n) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                visit(n)
        path.pop()
        state[m] = "done"

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for m in sorted(FILES):
        if m not in state:
            visit(m)


def test_loading_a_model_does_not_pull_in_route_search_or_any_tool():
    assert not [m for m in reachable("via_sd.core.pair", "via_sd.core.decoding") if RANKS[layer(m)] > RANKS["core"]]


def test_the_app_and_its_runtime_are_covered():
    assert {"app", "studio", "studio.models", "studio.sessions", "studio.runs", "viz.page", "viz.costs"} <= set(FILES)
    assert layer("studio.runs") == layer("app") == "faces"
    assert "studio.runs" in project_imports("app") and "viz.page" in project_imports("studio.runs")


def test_viz_imports_no_model_code():
    for module in (m for m in FILES if m == "viz" or m.startswith("viz.")):
        reached = reachable(module)
        assert "via_sd" not in reached, f"{module} imports the via_sd package API, which loads the models' code"
        for m in reached:
            assert not GRAPH[m] & MODEL_CODE, f"{module} reaches {m}, which imports {GRAPH[m] & MODEL_CODE}"


def test_importing_viz_loads_neither_torch_nor_transformers():
    code = "import sys, viz; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_module_says_what_it_is_for():
    for module, path in FILES.items():
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        assert doc and doc.strip(), f"{path.relative_to(ROOT)} has no module docstring"


# Modules longer than this are split where the code divides; the exceptions say why they stay long (never past 400).
MAX_MODULE_LINES = 300
LONG_MODULES = {
    "via_sd/cost/model.py": "the cost model is one sheet of formulas: a pass's cost, a recorded run priced call by "
                            "call, a round's expected tokens and cost (the rule that sizes rounds), other machines",
    "via_sd/core/pair.py": "loading a pair: the presets, the embedded pair's build and the tiny random pair",
    "via_sd/core/routing.py": "a route and the slim verifier that runs it, for every decoder family it supports",
    "via_sd/core/trace_fields.py": "every field of a trace with its type and bounds: one table the gate checks",
    "via_sd/weights/linears.py": "the low-bit linear layers and the rule that picks each pass's kernel",
    "viz/what_if.py": "the what-if replay mirrors the engine's round step by step: read as one algorithm",
    "viz/figures.py": "the page's figures, each a short function over one trace",
    "studio/mcp_tools.py": "the MCP server: its per-connection runs and every tool it serves, with their schemas",
    "studio/models.py": "the loaded pair shared by every session: loading, warming, routes and the status line",
}


def test_every_module_fits_in_a_head():
    long = {}
    for module, path in FILES.items():  # app.py, studio/, via_sd/ (every layer) and viz/
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= 400, f"{path.relative_to(ROOT)} has {lines} lines"
        if lines > MAX_MODULE_LINES:
            long[path.relative_to(ROOT).as_posix()] = lines
    assert set(long) <= set(LONG_MODULES), {k: v for k, v in long.items() if k not in LONG_MODULES}
    assert set(LONG_MODULES) <= set(long), "an exception that is no longer long: remove it from the list"


def test_the_round_fits_on_a_screen_and_sees_a_drafter_through_two_methods():
    """The round (core/round.py) is one function a reader checks in a screen; the run and the round use a drafter
    only through propose and update (and read its name and the profile its forwards are priced with)."""
    assert dict(functions("via_sd.core.round"))["via_sd.core.round.speculative_round"] <= 60
    used = set()
    for module in ("via_sd.core.round", "via_sd.core.decoding"):
        for node in ast.walk(ast.parse(FILES[module].read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "drafter" and isinstance(node.value.value, ast.Name) \
                    and node.value.value.id == "self":
                used.add(node.attr)
    assert used == {"propose", "update", "name", "costs"}, used


def functions(module: str):
    """(qualified name, lines) of every function and method of a module."""
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{prefix}.{child.name}", child.end_lineno - child.lineno + 1
                yield from walk(child, f"{prefix}.{child.name}")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}.{child.name}")

    yield from walk(ast.parse(FILES[module].read_text(encoding="utf-8")), module)


def test_every_function_fits_on_a_screen():
    long = {name: n for m in FILES for name, n in functions(m) if n > MAX_FUNCTION_LINES}
    assert set(long) <= set(LONG_FUNCTIONS), {k: v for k, v in long.items() if k not in LONG_FUNCTIONS}
    assert set(LONG_FUNCTIONS) <= set(long), "an exception that is no longer long: remove it from the list"


@pytest.mark.parametrize("command", [[], ["generate"], ["setup"], ["bench"], ["route"], ["profile"]])
def test_the_command_line_and_every_sub_command_print_their_help(command, capsys):
    from via_sd.__main__ import main

    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("usage: python -m via_sd")
