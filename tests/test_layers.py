"""One-way layers: core <- tools <- the package's API <- faces, read from the imports in the source (ast).

core: the method (tiers, trace, routing, models, decoding, ...); tools: route search, benchmark,
fidelity; api: via_sd/__init__.py, which re-exports both; faces: the command line, app.py, the app's
runtime (studio/) and viz.
Importing a module also runs its packages' __init__ first; that implicit step is not an edge here.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RANKS = {"core": 0, "tools": 1, "api": 2, "faces": 3}
TOOLS = ("via_sd.bench", "via_sd.route_search", "via_sd.fidelity")
FACES = ("via_sd.cli", "via_sd.__main__", "viz", "studio", "app")
MODEL_CODE = {"torch", "transformers", "accelerate", "safetensors", "tokenizers", "gguf"}


def module_files() -> dict[str, Path]:
    files = {"app": ROOT / "app.py"}
    for package in ("via_sd", "viz", "studio"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


FILES = module_files()


def layer(module: str) -> str:
    if module == "via_sd":
        return "api"
    if any(module == p or module.startswith(p + ".") for p in FACES):
        return "faces"
    if any(module == p or module.startswith(p + ".") for p in TOOLS):
        return "tools"
    return "core"


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
    assert "via_sd.routing" in project_imports("via_sd.models")
    assert "via_sd.route_search.resolve" in project_imports("via_sd.cli.args")
    assert "via_sd" in project_imports("via_sd.cli.args")  # `from .. import load_pair`: the API
    assert "via_sd.bench" in project_imports("via_sd.cli.bench")
    assert "torch" in GRAPH["via_sd.routing"]
    assert {layer("via_sd.tiers"), layer("via_sd.bench.report"), layer("via_sd"), layer("viz.figures")} == \
        {"core", "tools", "api", "faces"}


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
    assert not [m for m in reachable("via_sd.models", "via_sd.decoding") if layer(m) != "core"]


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


def test_every_module_fits_in_a_head():
    for module, path in FILES.items():  # app.py, studio/, via_sd/ (core, tools, faces) and viz/
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= 400, f"{path.relative_to(ROOT)} has {lines} lines"


@pytest.mark.parametrize("command", [[], ["generate"], ["setup"], ["bench"], ["route"], ["profile"]])
def test_the_command_line_and_every_sub_command_print_their_help(command, capsys):
    from via_sd.__main__ import main

    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("usage: python -m via_sd")
