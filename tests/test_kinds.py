"""The README's event reference is generated from auditlog.core.kinds and kept in sync."""

from __future__ import annotations

from pathlib import Path

import torch
from helpers import REPO
from torch import nn

import auditlog
from auditlog.core.kinds import KINDS, kinds_markdown


def test_readme_embeds_the_generated_kinds_reference() -> None:
    readme = (REPO / "README.md").read_text()
    begin, end = "<!-- kinds:begin -->", "<!-- kinds:end -->"
    assert begin in readme and end in readme
    embedded = readme.split(begin, 1)[1].split(end, 1)[0].strip()
    assert embedded == kinds_markdown().strip(), "regenerate with: python -m auditlog.core.kinds"


def test_every_emitted_kind_and_field_is_documented(store: Path) -> None:
    with auditlog.record(store, backward="grad", nonfinite_check=True) as run:
        model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        loss_fn = nn.MSELoss()  # metrics: the loss of every step
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss_fn(model(torch.randn(3, 2)), torch.zeros(3, 2)).backward()
        opt.step()
        model[1].weight.requires_grad_(False)  # no hook: found by the structural check
        model(torch.randn(3, 2)).sum().backward()
        opt.step()
        run.annotate("note", text="hello")
        run.log(acc=0.5)
        (model(torch.randn(3, 2)).sum() * float("nan")).backward()  # nonfinite_found
        opt.step()
    with auditlog.open(store) as s:
        events = list(s.run().events())
    seen = {e["kind"] for e in events}
    assert seen <= set(KINDS)
    assert seen >= set(KINDS) - {"recorder_error"}
    for event in events:
        documented = set(KINDS[event["kind"]].fields)
        extra = set(event["payload"]) - documented
        assert not extra, f"{event['kind']} has undocumented fields {extra}"



def test_readme_embeds_the_generated_view_reference() -> None:
    from auditlog.store.readmodel.views import views_markdown

    readme = (REPO / "README.md").read_text()
    embedded = readme.split("<!-- views:begin -->", 1)[1].split("<!-- views:end -->", 1)[0].strip()
    assert embedded == views_markdown().strip(), "regenerate with: python -m auditlog.store.readmodel.views"
