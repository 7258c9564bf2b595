"""Every fenced ``bash``/``python`` block of README.md and docs/*.md runs, or says why it cannot here.

A block is run unless an HTML comment right after its closing fence says otherwise:

* ``<!-- docs-samples: skip: REASON -->``: not run here, for the reason given (a download, a GPU,
  a change to the user's machine); the reason must name what runs it instead when something does.
* ``<!-- docs-samples: drop "TEXT" "TEXT" because REASON -->``: the block runs without the lines
  containing any TEXT.
* ``<!-- docs-samples: fails: REASON -->``: the block runs and must exit non-zero (it shows a
  failure on purpose).
* ``<!-- docs-samples: needs: MODULE -->``: runs only where MODULE imports (an optional
  distribution that ``scripts/install.sh --dev`` installs); elsewhere pytest reports a skip.
* ``<!-- docs-samples: prelude: CODE -->``: CODE runs first (hidden from readers), e.g. to name the
  ``MyPolicy`` a snippet assumes (Python preludes see ``DOCS_ROOT``, the repository root). Several
  comments may follow one block.

Python blocks of one page share a namespace, in order, like a reader following the page. Bash
blocks run with ``bash -e`` in a scratch directory holding links to ``examples/`` and the
installed ``dynres`` first on PATH; ``dynres simulate`` gets ``--set steps=2`` appended so that
the whole test stays short (the numbers are not what is tested here, that each command works).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if (ROOT / "docs").is_dir() else []
DIRECTIVE = re.compile(r"^<!-- docs-samples: (.*) -->\s*$")

pytestmark = pytest.mark.skipif(not PAGES, reason="README.md and docs/ are only in a checkout of the repository")


@dataclass
class Block:
    """One fenced block and what its directives say."""

    page: Path
    line: int
    lang: str
    code: str
    skip: str = ""
    fails: str = ""
    needs: list[str] = field(default_factory=list)
    drops: list[str] = field(default_factory=list)
    preludes: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        """``page.md:LINE``, the test id."""
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    """Every bash/python block of the pages, with its directives."""
    found = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"^```(bash|python)\s*$", lines[i])
            if not m:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            block = Block(page, i + 1, m.group(1), "\n".join(lines[i + 1 : end]) + "\n")
            k = end + 1
            while k < len(lines) and (d := DIRECTIVE.match(lines[k])):
                text = d.group(1)
                if text.startswith("skip:"):
                    block.skip = text.removeprefix("skip:").strip()
                elif text.startswith("needs:"):
                    block.needs.append(text.removeprefix("needs:").strip())
                elif text.startswith("fails:"):
                    block.fails = text.removeprefix("fails:").strip()
                elif text.startswith("prelude:"):
                    block.preludes.append(text.removeprefix("prelude:").strip())
                elif text.startswith("drop "):
                    quoted, _, reason = text.removeprefix("drop ").partition(" because ")
                    assert reason.strip(), f"{block.id}: a drop directive needs 'because REASON'"
                    block.drops.extend(shlex.split(quoted))
                else:
                    raise AssertionError(f"{block.id}: unknown docs-samples directive {text!r}")
                k += 1
            found.append(block)
            i = end + 1
    return found


def _restore_imports(path: list[str], modules: dict[str, ModuleType]) -> None:
    """Undo what a page's code did to the import system, so later tests import the real modules.

    Modules a snippet or prelude added from outside the installed (or editable) packages (a stand-in placed
    in sys.modules, a package imported from examples/ or the scratch directory) are dropped and
    replaced entries restored; modules of installed distributions imported on the way stay.
    """
    sys.path[:] = path
    for name, module in list(sys.modules.items()):
        if name in modules:
            if modules[name] is not module:
                sys.modules[name] = modules[name]  # restoring what was there
            continue
        where = str(getattr(module, "__file__", "") or "")
        installed = "site-packages" in where or where.startswith((sys.base_prefix, str(ROOT / "packages")))
        if not installed:  # editable dynres installs live under packages/ and count as installed
            del sys.modules[name]


BLOCKS = blocks()
NAMESPACES: dict[Path, dict[str, object]] = {}


def test_every_block_is_run_or_says_why_not() -> None:
    """The pages have their blocks (a parse slip would silently test nothing); a skip gives a real reason."""
    assert len(BLOCKS) >= 25, [b.id for b in BLOCKS]
    skipped = [b for b in BLOCKS if b.skip]
    assert all(len(b.skip) > 15 for b in skipped), [(b.id, b.skip) for b in skipped]


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in BLOCKS if not b.skip], ids=lambda b: b.id)
def test_block_runs(block: Block, tmp_path: Path) -> None:
    for module in block.needs:
        pytest.importorskip(module, reason=f"{block.id} needs {module} (scripts/install.sh --dev installs it)")
    code = "\n".join(ln for ln in block.code.splitlines() if not any(t in ln for t in block.drops)) + "\n"
    if block.lang == "python":
        namespace = NAMESPACES.setdefault(block.page, {"__name__": f"docs_{block.page.stem}", "DOCS_ROOT": ROOT})
        cwd, path, modules = Path.cwd(), list(sys.path), dict(sys.modules)
        os.chdir(tmp_path)
        try:
            for prelude in block.preludes:
                exec(compile(prelude, f"{block.id} (prelude)", "exec"), namespace)
            exec(compile(code, block.id, "exec"), namespace)
        finally:
            os.chdir(cwd)
            _restore_imports(path, modules)
        return
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    bindir = Path(sys.executable).parent
    script = (
        "set -eo pipefail\n"
        'dynres() { if [ "$1" = simulate ] && [[ " $* " != *" --list-presets "* ]]; '
        'then command dynres "$@" --set steps=2; else command dynres "$@"; fi; }\n'
        + "".join(p + "\n" for p in block.preludes)
        + code
    )
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "80"}
    env.pop("PYTHONPATH", None)
    res = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if block.fails:
        assert res.returncode != 0, f"{block.id} should fail ({block.fails}) but exited 0:\n{res.stdout}"
        return
    assert res.returncode == 0, (
        f"{block.id} failed ({res.returncode}):\n{code}\n--- stdout\n{res.stdout}\n--- stderr\n{res.stderr}"
    )
