"""The layers as walls: the import-linter contracts of setup.cfg hold, and the planner's imports of frontends
and the executor, which those contracts let through, stay inside functions (DESIGN.md: the planner imports
them lazily, to read a model and for `memplan run`)."""
import ast
from pathlib import Path

import pytest

lint_imports = pytest.importorskip("importlinter.cli", reason="needs import-linter (make install-test)").lint_imports

ROOT = Path(__file__).resolve().parents[1]
UPPER = ("executor", "frontends")


def module_level_imports(source, packages=UPPER):
    """(line, module) of each import of `packages` that runs when the module is imported: at its top level
    or in a class body, not inside a function."""
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and not in_function:
                names = [child.module or ""] if isinstance(child, ast.ImportFrom) and child.level == 0 else \
                    [alias.name for alias in child.names] if isinstance(child, ast.Import) else []
                found.extend((child.lineno, name) for name in names if name.split(".")[0] in packages)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def test_contracts_hold(capsys):
    status = lint_imports(config_filename=str(ROOT / "setup.cfg"), no_cache=True, no_logo=True)
    assert status == 0, capsys.readouterr().out[-4000:]


def test_planner_imports_upper_layers_only_in_functions():
    found = [f"{path.relative_to(ROOT)}:{line} imports {name}"
             for path in sorted((ROOT / "planner").rglob("*.py"))
             for line, name in module_level_imports(path.read_text())]
    assert not found, "the planner imports these at module level: " + "; ".join(found)


@pytest.mark.parametrize("source, expected", [
    ("import executor\n", [(1, "executor")]),
    ("from frontends.zoo import build\n", [(1, "frontends.zoo")]),
    ("try:\n    import executor.arena\nexcept ImportError:\n    pass\n", [(2, "executor.arena")]),
    ("class A:\n    from executor import Executor\n", [(2, "executor")]),
    ("def run():\n    from executor import Executor\n", []),
    ("def read():\n    class B:\n        import frontends\n", []),
    ("from . import executor\nimport executors\n", []),
])
def test_module_level_imports_are_found(source, expected):
    assert module_level_imports(source) == expected
