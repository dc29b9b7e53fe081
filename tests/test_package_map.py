"""The package's shape, checked against the code: the plug-in (what a checkpoint carries) imports only torch,
transformers and itself; no toolkit module is imported by the plug-in; translating imports neither datasets nor the
training stack; and docs/package.md's table of who imports what is the one the code has (run this file with
`python tests/test_package_map.py` to print the table the code has now)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vanilla_transformer"
PLUG_IN = [
    "configuration_vanilla_transformer",
    "modeling_vanilla_transformer",
    "loss_vanilla_transformer",
    "input_checks_vanilla_transformer",
    "pipeline_vanilla_transformer",
]
STANDARD = set(sys.stdlib_module_names) | {"__future__"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> tuple[set[str], set[str]]:
    """(the package's modules, the other distributions' top-level names) that `path` imports, lazily or not."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    own, other = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:  # `from . import x` names a module
                candidate = f"{target}.{alias.name}"
                own.add(candidate if (ROOT / Path(*candidate.split("."))).with_suffix(".py").exists() else target)
        else:
            names = [node.module] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            for imported in filter(None, names):
                (own if imported.startswith("vanilla_transformer") else other).add(imported.split(".")[0])
    own = {m for m in own if m.startswith("vanilla_transformer")}
    return own - {name}, other - STANDARD


def short(name: str) -> str:
    return name.removeprefix("vanilla_transformer.").removeprefix("vanilla_transformer") or "(package)"


def import_table() -> str:
    """docs/package.md's table: each module, the package's modules it imports, and the libraries it imports."""
    rows = ["| module | imports from the package | libraries |", "| --- | --- | --- |"]
    for path in sorted(PACKAGE.rglob("*.py")):
        own, other = imports_of(path)
        if path.name == "__init__.py" and not own and not other:
            continue
        uses = ", ".join(f"`{short(m)}`" for m in sorted(own)) or "-"
        rows.append(f"| `{short(module_name(path))}` | {uses} | {', '.join(sorted(other)) or '-'} |")
    return "\n".join(rows)


def test_the_plug_in_imports_only_torch_transformers_and_itself():
    for name in PLUG_IN:
        own, other = imports_of(PACKAGE / f"{name}.py")
        assert other <= {"torch", "transformers", "huggingface_hub"}, name  # huggingface_hub: transformers' @strict
        assert {short(m) for m in own} <= set(PLUG_IN), name


def test_no_arrow_runs_back_up():
    """training/ stands above inference/, hub/ and plots/ (it evaluates through inference/ and writes the model card):
    none of them imports training/; no toolkit module imports scripts/ or benchmarks/."""
    for path in PACKAGE.rglob("*.py"):
        own, other = imports_of(path)
        assert not other & {"scripts", "benchmarks", "speed", "common"}, path
        if short(module_name(path)).startswith(("inference", "hub", "plots")):
            assert not {m for m in own if short(m).startswith("training")}, path


def test_the_docs_table_is_the_one_the_code_has():
    table = import_table()
    assert table in (ROOT / "docs" / "package.md").read_text(), f"docs/package.md's table is out of date:\n{table}"


def test_translating_imports_neither_datasets_nor_the_training_stack():
    code = (
        "import sys, transformers.modeling_utils; before = set(sys.modules)\n"
        "import vanilla_transformer.inference.translate, vanilla_transformer.inference.ctranslate2\n"
        "sys.argv = ['translate.py', '--help']\n"
        "import runpy\n"
        "try:\n    runpy.run_path('scripts/translate.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "new = set(sys.modules) - before\n"
        "print(sorted(m for m in new if m.split('.')[0] in ('datasets', 'pyarrow', 'accelerate', 'evaluate')"
        " or m.startswith(('vanilla_transformer.training.data', 'vanilla_transformer.training.batching',"
        " 'vanilla_transformer.training.trainer'))))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


if __name__ == "__main__":
    print(import_table())
