"""Every kind the recorder emits, and every payload field, is in auditlog.core.kinds (docs/events.md)."""

from __future__ import annotations

import warnings
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn
from torch.nn.modules import module as nn_module

import auditlog
from auditlog.core.kinds import KINDS


class _Stream(torch.utils.data.IterableDataset[int]):
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(3))


def test_every_emitted_kind_and_field_is_documented(store: Path) -> None:
    registration_hooks = nn_module._global_module_registration_hooks
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the hooks_removed warning
            with auditlog.record(store, backward="grad", nonfinite_check=True) as run:
                model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
                loss_fn = nn.MSELoss()  # metrics: the loss of every step
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                # module_wrapped (CPU: DataParallel calls the model)
                loss_fn(nn.DataParallel(model)(torch.randn(3, 2)), torch.zeros(3, 2)).backward()
                opt.step()
                model[1].weight.requires_grad_(False)  # no hook: found by the structural check
                nn_module._global_module_registration_hooks = OrderedDict()  # other code drops our hook
                model(torch.randn(3, 2)).sum().backward()
                opt.step()
                run.annotate("note", text="hello")
                # dataset_seen, loader_started, batches (one under no_grad, one of an iterable dataset)
                data = torch.utils.data.TensorDataset(torch.randn(4, 2), torch.zeros(4, 2))
                with torch.no_grad():
                    for x, _ in torch.utils.data.DataLoader(data, batch_size=2, shuffle=True):
                        model(x)
                list(torch.utils.data.DataLoader(_Stream(), batch_size=2))
                run.log(acc=0.5)
                (model(torch.randn(3, 2)).sum() * float("nan")).backward()  # nonfinite_found
                opt.step()
                scaler = torch.amp.GradScaler("cpu")  # step_skipped: the NaN gradients again
                scaler.scale(model(torch.randn(3, 2)).sum() * float("nan")).backward()
                scaler.step(opt)
                scaler.update()
    finally:
        nn_module._global_module_registration_hooks = registration_hooks
    with auditlog.open(store) as s:
        events = list(s.run().events())
    seen = {e["kind"] for e in events}
    assert seen <= set(KINDS)
    assert seen >= set(KINDS) - {"recorder_error"}
    for event in events:
        documented = set(KINDS[event["kind"]].fields)
        extra = set(event["payload"]) - documented
        assert not extra, f"{event['kind']} has undocumented fields {extra}"
