"""The import contracts' check as installed, and the allow-list contract type.

``pyproject.toml`` ``[tool.importlinter]`` holds the contracts, written for the
source tree (``cli/`` is the root package ``cli``), so a plain ``lint-imports``
in a checkout runs. But ``cli/`` is installed as ``auditlog.cli`` and every import
in it is spelled so: in the source tree those names resolve to nothing, and an
import of the CLI from the library (``import auditlog.cli.output`` in
``read/``) would be seen only as an import of ``auditlog``. So ``make
lint-imports`` (and ``tests/test_layers.py``) run the same contracts on a copy
laid out as installed (``stage``): ``auditlog/cli`` and ``auditlog/migrations``
in place, ``cli`` renamed ``auditlog.cli`` in the contracts. There the CLI is a
layer like any other, and a planted ``read -> cli`` import is reported as exactly
that.

``AllowListContract`` (``type = "allowlist"``) says what a package may import
rather than what it may not: its own modules, the ``allowed_modules`` and,
with ``allow_stdlib``, the standard library; anything else is reported with its
line. ``python tests/importcontracts.py`` stages a copy in a temporary directory
and runs ``lint-imports`` there (its exit code).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck

REPO = Path(__file__).resolve().parents[1]
_SKIP = shutil.ignore_patterns("__pycache__")


class AllowListContract(Contract):
    """``source_modules`` import only themselves, ``allowed_modules`` (packages, internal
    or external) and, when ``allow_stdlib``, the standard library."""

    type_name = "allowlist"

    source_modules = fields.ListField(subfield=fields.ModuleField())
    allowed_modules = fields.ListField(subfield=fields.ModuleField())
    allow_stdlib = fields.BooleanField(required=False, default=True)

    def _allowed(self, imported: str, source: str) -> bool:
        names = [source, *(m.name for m in self.allowed_modules)]  # type: ignore[attr-defined]
        if any(imported == n or imported.startswith(n + ".") for n in names):
            return True
        return bool(self.allow_stdlib) and imported.split(".")[0] in sys.stdlib_module_names

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        found: list[dict[str, Any]] = []
        for module in self.source_modules:  # type: ignore[attr-defined]
            source = module.name
            for importer in sorted({source} | graph.find_descendants(source)):
                for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                    if not self._allowed(imported, source):
                        lines = [
                            d["line_number"]
                            for d in graph.get_import_details(importer=importer, imported=imported)
                        ]
                        found.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(kept=not found, metadata={"found": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        allowed = ", ".join(m.name for m in self.allowed_modules)  # type: ignore[attr-defined]
        for item in check.metadata["found"]:
            where = ", ".join(f"l.{n}" for n in item["lines"])
            output.print_error(f"{item['importer']} -> {item['imported']} ({where})", bold=False)
        output.new_line()
        output.print_error(
            f"Allowed: the package itself, {allowed}"
            + (", the standard library" if self.allow_stdlib else ""),
            bold=False,
        )


def staged_contracts(pyproject: str) -> str:
    """The ``[tool.importlinter]`` part of ``pyproject`` with ``cli`` named as installed."""
    section = pyproject[pyproject.index("[tool.importlinter]") :]
    end = re.search(r"^\[tool\.(?!importlinter)", section, re.MULTILINE)
    section = section[: end.start()] if end else section
    section = re.sub(
        r"^root_packages = .*$", 'root_packages = ["auditlog"]', section, flags=re.MULTILINE
    )
    return re.sub(r'"cli(?=[". ])', '"auditlog.cli', section)


def stage(root: Path) -> Path:
    """A copy of the source laid out as installed, with the contracts to match, under ``root``."""
    shutil.copytree(REPO / "auditlog", root / "auditlog", ignore=_SKIP)
    shutil.copytree(REPO / "cli", root / "auditlog" / "cli", ignore=_SKIP)
    shutil.copytree(REPO / "migrations", root / "auditlog" / "migrations", ignore=_SKIP)
    (root / "tests").mkdir()
    shutil.copy(Path(__file__), root / "tests" / "importcontracts.py")
    (root / "pyproject.toml").write_text(staged_contracts((REPO / "pyproject.toml").read_text()))
    return root


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on a staged copy (its own directory first on the path)."""
    command = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(command), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="auditlog-imports-") as directory:
        done = lint(stage(Path(directory)))
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
