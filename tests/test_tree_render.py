"""``auditlog tree`` prints the same text whether rich draws it or the plain fast path does.

The plain path (``tree_text.plain_lines``) is taken in pipes and files, where
rich prints no colour; it must give rich's exact text, and step aside (None)
whenever rich would print something else (a wrapped label, a control
character).
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from auditlog.present import tree_text


def _tensor(name: str, **facts: Any) -> dict[str, Any]:
    return {
        "name": name,
        "shape": [2, 3],
        "dtype": "float32",
        "persistent": None,
        "requires_grad": True,
        "sha256": "ab" * 32,
        "snapshot_step": 3,
        **facts,
    }


def _module(
    name: str, cls: str | None, children: list[dict[str, Any]] = (), **facts: Any
) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "name": name,
        "class": cls,
        "wrapped_by": [],
        "source": "model.py:12",
        "parameters": [],
        "buffers": [],
        "children": list(children),
        **facts,
    }


def _rich_text(item: dict[str, Any], width: int = 200) -> str:
    out = io.StringIO()
    top = Tree(Text.assemble(*tree_text.root_label(item)))
    tree_text.add_children(item, top)
    Console(file=out, soft_wrap=False, width=width, color_system=None).print(top, highlight=False)
    return out.getvalue()


def _sample(name: str = "[bold]x\\") -> dict[str, Any]:
    leaf = _module(
        "0", "torch.nn.Linear", parameters=[_tensor("weight"), _tensor("bias", requires_grad=False)]
    )
    norm = _module(
        "norm",
        "torch.nn.BatchNorm1d",
        source=None,
        buffers=[
            _tensor("running_mean", persistent=True),
            _tensor("num_batches", persistent=False, sha256=None),
        ],
    )
    inner = _module(name, None, [leaf, _module("act", "torch.nn.Tanh")])
    return _module(
        "",
        "my.Model",
        [inner, norm, _module("héllo", "x.Y")],
        wrapped_by=["torch.nn.DataParallel"],
        parameters=[_tensor("scale")],
    )


def test_plain_lines_are_richs_text() -> None:
    item = _sample()
    lines = tree_text.plain_lines(item, 200)
    assert lines is not None
    assert "\n".join(lines) + "\n" == _rich_text(item)


@pytest.mark.parametrize("name", ["a\nb", "tab\there", "bell\x07", "wide名前"])
def test_plain_lines_step_aside_or_agree(name: str) -> None:
    item = _sample(name)
    lines = tree_text.plain_lines(item, 200)
    if lines is not None:
        assert "\n".join(lines) + "\n" == _rich_text(item)
    else:
        assert not name.isprintable()


def test_a_label_rich_would_wrap_is_left_to_rich() -> None:
    item = _sample("n" * 300)
    assert tree_text.plain_lines(item, 200) is None
    narrow = _sample()
    assert tree_text.plain_lines(narrow, 30) is None
    assert "\n".join(tree_text.plain_lines(narrow, 60) or []) + "\n" == _rich_text(narrow, 60)


def test_tree_text_is_what_the_cli_prints_in_a_pipe() -> None:
    """Python users' ``present.tree_text.tree_text``: the plain lines where they fit, else rich's."""
    item = _sample()
    assert tree_text.tree_text(item, 200) == _rich_text(item)
    wrapped = _sample("n" * 300)
    assert tree_text.tree_text(wrapped, 200) == _rich_text(wrapped, 200)
