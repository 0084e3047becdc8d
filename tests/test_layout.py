"""What the folder tree promises, checked: small modules, SQL only in the store,
private torch internals only in ``capture/torch_compat.py``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers import REPO

SOURCES = [*sorted((REPO / "auditlog").rglob("*.py")), *sorted((REPO / "cli").glob("*.py"))]
SQL = re.compile(
    r"(?is)\bselect\b.+\bfrom\b|\binsert\s+(or\s+\w+\s+)?into\b|\bupdate\s+\w+(\.\w+)?\s+set\b|"
    r"\bdelete\s+from\b|\bcreate\s+(temp\s+|or\s+replace\s+)*(table|view|index|schema)\b|\bpragma\s+\w+"
)
TORCH_PRIVATE = re.compile(
    r"_(modules|parameters|buffers|version|non_persistent_buffers_set|orig_mod|foreach_\w+|global_\w+)"
)
# The DataLoader's (capture/loader_compat.py: torch_compat.py is at its size limit).
LOADER_PRIVATE = re.compile(
    r"_(BaseDataLoaderIter|next_index|sampler_iter|index_sampler|dataset_kind|DatasetKind|base_seed)"
)


def _strings(path: Path) -> list[tuple[int, str]]:
    """String constants that are not docstrings (docstrings may describe SQL in prose)."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
        ):
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    out = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            text = "".join(
                v.value
                for v in node.values
                if isinstance(v, ast.Constant) and isinstance(v.value, str)
            )
            out.append((node.lineno, text))
    return out


def test_no_module_is_over_600_lines() -> None:
    big = {
        str(path.relative_to(REPO)): n
        for path in [*SOURCES, *sorted((REPO / "benchmarks").glob("*.py"))]
        if (n := len(path.read_text().splitlines())) > 600
    }
    assert not big


def test_sql_is_written_only_in_the_store() -> None:
    store = REPO / "auditlog" / "store"
    found = [
        f"{path.relative_to(REPO)}:{line}: {text[:60]!r}"
        for path in SOURCES
        if not path.is_relative_to(store)
        for line, text in _strings(path)
        if SQL.search(text)
    ]
    assert not found


def test_the_sql_check_finds_sql(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        '"""Docstrings may say: select x from y."""\nQ = f"SELECT seq FROM {t} WHERE id = 1"\n'
    )
    assert {line for line, text in _strings(planted) if SQL.search(text)} == {2}


def test_private_torch_internals_only_in_torch_compat() -> None:
    """Attribute access such as ``module._parameters`` or ``torch._foreach_norm`` happens in
    one module, so a torch upgrade breaks one place (``tests/test_torch_compat.py``); the
    DataLoader's private parts in ``capture/loader_compat.py``."""
    allowed = REPO / "auditlog" / "capture" / "torch_compat.py"
    loaders = REPO / "auditlog" / "capture" / "loader_compat.py"
    found = [
        f"{path.relative_to(REPO)}:{node.lineno}: .{node.attr}"
        for path in SOURCES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and (
            (path != allowed and TORCH_PRIVATE.fullmatch(node.attr))
            or (path != loaders and LOADER_PRIVATE.fullmatch(node.attr))
        )
    ]
    assert not found
