"""How fast ``verify`` checks a long run (hash chain + Merkle tree), and how big proofs are.

A run of ``--events`` events (default 1,000,000) is written straight into a
fresh store with the real chain encoding (``auditlog.core.chain``): a
``run_started``, annotation-sized and optimizer-step-sized payloads in turn,
and a ``run_ended``; its end is signed as a tree head (``auditlog-checkpoint-v2``)
and exported (``auditlog-head-v2``) at the middle, so verification checks a
signature, every link, the tree head at both sizes and a consistency proof.

Reported, each measured in this one process, side by side:

- ``verify`` (``verify_run`` with the key and the mid-run exported head) in events/s;
- the chain alone (canonical row + link hash per event) and the tree alone
  (leaf hash + frontier per event), to attribute the cost;
- an inclusion proof of the middle event and a consistency proof from the
  middle to the end: hashes, JSON bytes, and time to make (``auditlog prove``
  reads the stream once) and to check (no store).

    python benchmarks/verify.py                    # 1M events: minutes on 2 cores
    python benchmarks/verify.py --events 20000     # quick look

Target (issue 16): ``verify`` of a 1M-event run at >= 300,000 events/s.

Figures measured on a loaded machine are not figures: rerun on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from auditlog.core.chain import canonical_payload, canonical_row, genesis_hash, link_hash
from auditlog.integrity import parallel
from auditlog.integrity.checkpoints import checkpoint_head, store_id
from auditlog.integrity.keys import KeyRing
from auditlog.integrity.merkle import Frontier, leaf_hash
from auditlog.integrity.proofs import check_consistency, check_inclusion
from auditlog.integrity.statements import StreamHead, sign_heads
from auditlog.integrity.verify import verify_run
from auditlog.read.proofs import prove_consistency, prove_inclusion
from auditlog.store.eventstore import EventStore

RUN_ID = "b" * 32
TARGET_RATE = 300_000  # issue 16: verify of a 1M-event run at >= 300k events/s


def _rows(n: int) -> list[dict[str, object]]:
    step_payload = canonical_payload(
        {
            "optimizer_id": 1,
            "optimizer_class": "torch.optim.adamw.AdamW",
            "optimizer_step": 1,
            "param_groups": [
                {
                    "lr": 0.001,
                    "betas": [0.9, 0.999],
                    "weight_decay": 0.01,
                    "params": list(range(1, 9)),
                }
            ],
            "tensor_ids": list(range(1, 9)),
            "grad_norm": [0.125] * 8,
            "update_norm": [0.001] * 8,
            "param_norm": [3.5] * 8,
            "nonfinite_grads": 0,
        }
    )
    note = canonical_payload(
        {"key": "dataset", "fields": {"name": "clean-data", "sha256": "0" * 64}}
    )
    started = canonical_payload(
        {"name": "bench", "world_size": 1, "rank": 0, "host": "bench", "pid": 1}
    )
    rows: list[dict[str, object]] = []
    start = time.time_ns()  # just after the runs index row was written
    for seq in range(1, n + 1):
        kind, payload = ("optimizer_step", step_payload) if seq % 2 else ("annotation", note)
        if seq == 1:
            kind, payload = "run_started", started
        elif seq == n:
            kind, payload = "run_ended", canonical_payload({"status": "completed", "exit_code": 0})
        rows.append(
            {
                "run_id": RUN_ID,
                "stream": 0,
                "seq": seq,
                "ts_ns": start + seq,
                "kind": kind,
                "step": seq // 2,
                "module_id": None,
                "tensor_id": None,
                "snapshot": None,
                "payload": payload,
            }
        )
    return rows


def _fill(store: EventStore, rows: list[dict[str, object]]) -> None:
    prev = genesis_hash(RUN_ID, 0)
    for start in range(0, len(rows), 20_000):
        batch = rows[start : start + 20_000]
        for row in batch:
            prev = row["hash"] = link_hash(prev, canonical_row(row))
        store.append(batch, RUN_ID, heartbeat=False)


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f} events/s ({seconds:.2f} s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    n = max(4, args.events)
    key = Ed25519PrivateKey.generate()
    ring = KeyRing([key.public_key()])
    with tempfile.TemporaryDirectory(prefix="auditlog-verify-bench-") as tmp:
        store = EventStore.open(str(Path(tmp) / "store"), create=True)
        store.create_run(RUN_ID, "bench", "bench", 1, None)
        rows = _rows(n)
        t0 = time.perf_counter()
        _fill(store, rows)
        print(f"wrote {n:,} events in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

        half = n // 2
        t0 = time.perf_counter()
        prev = genesis_hash(RUN_ID, 0)
        for row in rows:
            prev = link_hash(prev, canonical_row(row))
        chain_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        tree = Frontier()
        for row in rows:
            tree.append(leaf_hash(canonical_row(row)))
        tree.root()
        tree_s = time.perf_counter() - t0
        # A head exported mid-run (the first half), as `auditlog export-head` would have signed it.
        half_tree = Frontier()
        for row in rows[:half]:
            half_tree.append(leaf_hash(canonical_row(row)))
        mid = sign_heads(
            key,
            store_id(store),
            RUN_ID,
            [StreamHead(0, half, str(rows[half - 1]["hash"]), half_tree.root().hex(), False)],
            world_size=1,
        )
        del rows
        final = verify_run(store, RUN_ID, keys=ring, require_signed=False)
        checkpoint_head(store, key, RUN_ID, 0, final.tips[0], 1)

        t0 = time.perf_counter()
        report = verify_run(store, RUN_ID, keys=ring, statements=[("mid.json", mid)])
        verify_s = time.perf_counter() - t0
        assert report.ok, [p.describe() for p in report.problems[:3]]
        split_auto = parallel.split_point(n) is not None  # what the run above did (load permitting)
        # The same, in one process and in two (a forked child checks the second half)
        # whatever the load: side by side, so that a busy machine shows in the ratio.
        forced: dict[bool, float] = {}
        for two in (False, True):
            parallel.core_free = (lambda: True) if two else (lambda: False)  # type: ignore[assignment]
            t0 = time.perf_counter()
            assert verify_run(store, RUN_ID, keys=ring, statements=[("mid.json", mid)]).ok
            forced[two] = time.perf_counter() - t0

        t0 = time.perf_counter()
        inclusion = prove_inclusion(store, RUN_ID, half)
        prove_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        assert check_inclusion(inclusion, ring).ok
        check_s = time.perf_counter() - t0
        consistency = prove_consistency(store, RUN_ID, json.loads(mid.to_json()))
        assert check_consistency(consistency, ring).ok
        store.close()

    rate = n / verify_s
    print(f"verify (chain + tree + signed heads + consistency), {n:,} events: {_rate(n, verify_s)}")
    print(
        f"  target >= {TARGET_RATE:,} events/s: {rate / TARGET_RATE:.2f}x of target, "
        f"{'met' if rate >= TARGET_RATE else 'MISSED'}"
    )
    print(
        f"  (split into two processes: {'yes' if split_auto else 'no, no core free or too short'})"
    )
    print(f"  one process:   {_rate(n, forced[False])}")
    print(
        f"  two processes: {_rate(n, forced[True])}  ({forced[False] / forced[True]:.2f}x one process; "
        "a busy machine gives the child no core of its own)"
    )
    print(f"  chain alone (canonical row + link hash):            {_rate(n, chain_s)}")
    print(f"  tree alone (canonical row + leaf hash + frontier):  {_rate(n, tree_s)}")
    print(f"  ratio verify / chain alone: {verify_s / chain_s:.2f}x")
    print(
        f"inclusion proof of event {half:,}: {len(inclusion['audit_path'])} hashes, "
        f"{len(json.dumps(inclusion))} bytes of JSON; made in {prove_s:.2f} s, checked in {check_s * 1000:.1f} ms"
    )
    print(
        f"consistency proof {half:,} -> {n:,}: {len(consistency['proof'])} hashes, "
        f"{len(json.dumps(consistency))} bytes of JSON"
    )
    print("(figures from a loaded machine need a quiet rerun)")


if __name__ == "__main__":
    main()
