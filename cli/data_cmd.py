"""``auditlog data``: the datasets a run trained on, and which steps trained on one sample."""

from __future__ import annotations

import click
from auditlog.cli.options import format_option, run_argument, store_option
from auditlog.cli.output import echo_line, emit_json, emit_rows

SAMPLE_COLUMNS = ("rank", "dataset", "epoch", "batch", "step", "times", "no_grad")
BATCH_COLUMNS = ("rank", "dataset", "epoch", "batch", "step", "no_grad", "hash")


@click.command()
@store_option
@format_option(formats=("table", "json"))
@click.option(
    "--sample",
    "sample",
    type=int,
    default=None,
    metavar="I",
    help="Which steps (and ranks) trained on sample I: every batch that held it.",
)
@click.option(
    "--dataset",
    "dataset",
    default=None,
    metavar="D",
    help="With --sample: only dataset D (its id, or its class name); default every map-style dataset.",
)
@click.option(
    "--batch-hash",
    "batch_hash",
    default=None,
    metavar="H",
    help="Which steps (and ranks) trained on the batch of an iterable dataset whose content hash "
    "(auditlog.batch_hash) is H, or starts with H (8 hex digits at least).",
)
@run_argument
def data(
    store: str | None,
    fmt: str,
    sample: int | None,
    dataset: str | None,
    batch_hash: str | None,
    run: str,
) -> None:
    """The data RUN trained on: every dataset a DataLoader iterated, with its identity.

    One row per dataset (and rank): class, length, how it is identified
    (tensors, files, hf_datasets, subset, concat, or unidentified with the
    reason), its fingerprint (SHA-256 of its identity: equal data, equal
    fingerprint), epochs, batches, samples drawn, distinct samples and coverage;
    then one row per loader: iterations, batch size, shuffle, workers, sampler
    and seed. With --sample I: every batch that held sample I (rank, dataset,
    epoch, batch, the step that trained on it), then one line: the steps, or
    'never drawn'. With --batch-hash H (iterable datasets, whose samples have
    no index): the same for the batches whose content hash is H. Exit 0 either
    way; a --dataset that names no dataset, or --sample on an iterable dataset,
    exits 2.
    """
    from auditlog.read.api import open_store
    from auditlog.read.data import DATASET_COLUMNS, LOADER_COLUMNS
    from auditlog.read.forensics import jsonable

    if dataset is not None and sample is None:
        raise click.UsageError("--dataset needs --sample")
    if batch_hash is not None and sample is not None:
        raise click.UsageError("--batch-hash and --sample ask different questions: give one")
    with open_store(store) as opened:
        selected = opened.run(run)
        if batch_hash is not None:
            found = selected.batch(batch_hash)
            if fmt == "json":
                emit_json(jsonable(found.as_dict()))
                return
            if found.batches:
                emit_rows(
                    (
                        {
                            "rank": b["rank"],
                            "dataset": b["dataset_id"],
                            "epoch": b["epoch"],
                            "batch": b["batch"],
                            "step": b["step"],
                            "no_grad": b["no_grad"] or None,
                            "hash": b["hash"][:16],
                        }
                        for b in found.batches
                    ),
                    BATCH_COLUMNS,
                    fmt,
                )
            echo_line(found.answer)
            return
        if sample is not None:
            history = selected.sample(sample, dataset)
            if fmt == "json":
                emit_json(jsonable(history.as_dict()))
                return
            if history.batches:
                emit_rows(
                    (
                        {
                            "rank": b["rank"],
                            "dataset": b["dataset_id"],
                            "epoch": b["epoch"],
                            "batch": b["batch"],
                            "step": b["step"],
                            "times": b["times"],
                            "no_grad": b["no_grad"] or None,
                        }
                        for b in history.batches
                    ),
                    SAMPLE_COLUMNS,
                    fmt,
                )
            echo_line(history.answer)
            return
        summary = selected.data()
    if fmt == "json":
        emit_json(jsonable(summary.as_dict()))
        return
    if not summary.datasets:
        echo_line("no DataLoader iteration was recorded in this run")
        return
    emit_rows(summary.dataset_rows(), DATASET_COLUMNS, fmt, title="datasets")
    emit_rows(summary.loader_rows(), LOADER_COLUMNS, fmt, title="loaders")
