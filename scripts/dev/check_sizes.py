"""Check the project's size limits on the distributions' source code (run by scripts/lint.sh).

Every function or method under packages/*/src is at most 80 lines long (from its ``def`` line to
its last line, docstring included; decorators such as a command's click options are declarations,
not steps, and do not count) and every module at most 700 lines. A function that long
mixes several steps, which then cannot be named, tested or read one at a time; a module that long
usually holds several concepts. The exceptions below are listed with their reason; one that no
longer exceeds its limit is reported too, so the list stays honest.

    .venv/bin/python scripts/dev/check_sizes.py [ROOT ...]   # default: packages/*/src
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 700

# Module paths (relative to the repository root) allowed past MAX_MODULE_LINES, and why.
MODULE_EXCEPTIONS: dict[str, str] = {
    "packages/dynres-testkit/src/dynres/testkit/checks.py": (
        "the conformance suite: one public check per property, each short, kept in one module so a "
        "policy author finds every check (and its message) in one place"
    ),
}
# "path::qualified.name" of functions allowed past MAX_FUNCTION_LINES (data tables only), and why.
FUNCTION_EXCEPTIONS: dict[str, str] = {}


def _functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method of a module with its qualified name (Class.method, outer.inner)."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append((prefix + child.name, child))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def check_file(path: Path, rel: str) -> tuple[list[str], set[str]]:
    """Problems in one module (``path:line: message``) and the exceptions it used."""
    text = path.read_text(encoding="utf-8")
    problems: list[str] = []
    used: set[str] = set()
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES:
        if rel in MODULE_EXCEPTIONS:
            used.add(rel)
        else:
            problems.append(f"{rel}:1: module has {lines} lines (limit {MAX_MODULE_LINES}): split it by concept")
    for name, node in _functions(ast.parse(text, filename=rel)):
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length <= MAX_FUNCTION_LINES:
            continue
        key = f"{rel}::{name}"
        if key in FUNCTION_EXCEPTIONS:
            used.add(key)
        else:
            problems.append(
                f"{rel}:{node.lineno}: {name} has {length} lines (limit {MAX_FUNCTION_LINES}): "
                "split it into named steps"
            )
    return problems, used


def main(argv: list[str]) -> int:
    """Check every module under the roots; print each problem; 1 when there is any."""
    roots = [Path(a).resolve() for a in argv] or sorted(REPO.glob("packages/*/src"))
    problems: list[str] = []
    used: set[str] = set()
    for root in roots:
        for path in sorted(root.rglob("*.py") if root.is_dir() else [root]):
            rel = path.relative_to(REPO).as_posix()
            found, excepted = check_file(path, rel)
            problems += found
            used |= excepted
    if not argv:  # a partial run cannot tell whether an exception is still needed
        for key in sorted((MODULE_EXCEPTIONS.keys() | FUNCTION_EXCEPTIONS.keys()) - used):
            problems.append(f"{key.split('::')[0]}:1: {key} is within its limit now: remove its exception")
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
