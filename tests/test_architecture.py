"""docs/architecture.md's package map is what the packages say of themselves.

The part between `<!-- packages -->` and `<!-- /packages -->` is generated from each
package's docstring and each module's first docstring line, floor by floor:

    python tests/test_architecture.py --write
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_layers import FLOORS  # noqa: E402

BEGIN, END = "<!-- packages -->", "<!-- /packages -->"


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def _summary(path: Path) -> str:
    """A module's first docstring paragraph, on one line."""
    return " ".join(_docstring(path).split("\n\n")[0].split()) or "(no docstring)"


def package_map() -> str:
    out = []
    for floor, pkgs in enumerate(FLOORS):
        for pkg in pkgs:
            folder = ROOT / "sim" / pkg
            modules = sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")
            doc = " ".join(_docstring(folder / "__init__.py").split())
            out.append(f"### {floor + 1}. `sim/{pkg}/` ({len(modules)} modules)\n\n{doc}\n")
            out += [f"- `{p.stem}`: {_summary(p)}" for p in modules]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def rendered(text: str) -> str:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{package_map()}{END}{tail}"


def test_the_architecture_page_lists_every_package_and_module_as_they_describe_themselves():
    text = DOC.read_text()
    assert text == rendered(text), "docs/architecture.md is stale: python tests/test_architecture.py --write"


def test_every_package_and_module_has_a_docstring():
    missing = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "sim").rglob("*.py"))
               if p.name != "__main__.py" and not _docstring(p)]
    assert missing == []


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    DOC.write_text(rendered(DOC.read_text()))
