"""How well trained weights compress, per codec, in the snapshot file layout.

Trains a GPT-2 (``transformers.GPT2Config``, built from code: no hub) for
``--steps`` AdamW steps on CPU over real text (the Python standard library's
source, byte-level tokens), then writes every parameter and buffer as the
snapshot writer lays it out (a ``value`` column for dtypes Arrow has, raw bytes
for bfloat16 and float8) with each codec, and prints the on-disk size over the
raw size and the write throughput, per dtype: the trained float32 weights, the
same cast to bfloat16 / float16 / float8_e4m3fn, and integer / bool buffers.
This is the measurement the snapshot writer's codec choice
(``auditlog.store.blobformat.codec_for``) rests on.

    python benchmarks/compression.py                    # 6 layers x 384, 300 steps
    python benchmarks/compression.py --layers 2 --steps 20   # quick look
"""

from __future__ import annotations

import argparse
import sysconfig
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

CODECS = (("none", None), ("snappy", None), ("lz4", None), ("zstd", 1), ("zstd", 3))


def corpus(limit: int = 8 << 20) -> torch.Tensor:
    """Bytes of the standard library's Python source: real text, no download."""
    root = Path(sysconfig.get_paths()["stdlib"])
    data = bytearray()
    for path in sorted(root.glob("*.py")):
        data += path.read_bytes()
        if len(data) >= limit:
            break
    return torch.frombuffer(data, dtype=torch.uint8).long()


def train(layers: int, width: int, steps: int, seq: int, batch: int) -> dict[str, torch.Tensor]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=256,
        n_positions=seq,
        n_embd=width,
        n_layer=layers,
        n_head=max(1, width // 64),
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)
    text = corpus()
    start = time.perf_counter()
    for step in range(steps):
        rows = torch.randint(0, text.numel() - seq - 1, (batch,))
        ids = torch.stack([text[r : r + seq] for r in rows.tolist()])
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"  step {step:4d} loss {loss.item():.3f} ({time.perf_counter() - start:.0f} s)")
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def write(
    tensors: list[torch.Tensor], codec: str, level: int | None, out: Path
) -> tuple[int, int, float]:
    """(raw bytes, file bytes, seconds) of writing ``tensors`` as snapshot files with one codec."""
    raw = disk = 0
    seconds = 0.0
    for index, tensor in enumerate(tensors):
        flat = tensor.contiguous().reshape(-1)
        native = {
            torch.float32: pa.float32(),
            torch.float16: pa.float16(),
            torch.int64: pa.int64(),
            torch.bool: pa.bool_(),
        }.get(flat.dtype)
        if native is not None:
            column = pa.array(flat.numpy(), type=native)
            field = pa.field("value", native, nullable=False)
        else:
            data = flat.view(torch.uint8).numpy().tobytes()
            column = pa.array([data], type=pa.large_binary())
            field = pa.field("raw", pa.large_binary(), nullable=False)
        path = out / f"{index}.parquet"
        began = time.perf_counter()
        pq.write_table(
            pa.Table.from_arrays([column], schema=pa.schema([field])),
            path,
            compression=codec,
            compression_level=level,
            use_dictionary=False,
            write_statistics=False,
        )
        seconds += time.perf_counter() - began
        raw += flat.numel() * flat.element_size()
        disk += path.stat().st_size
        path.unlink()
    return raw, disk, seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(
        f"GPT-2 {args.layers} layers x {args.width}, {args.steps} AdamW steps on stdlib source bytes"
    )
    state = train(args.layers, args.width, args.steps, args.seq, args.batch)
    floats = [t for t in state.values() if t.is_floating_point()]
    others = [t for t in state.values() if not t.is_floating_point()]
    # Integer and bool buffers as models carry them (GPT-2 in this transformers has none).
    others += [
        torch.arange(args.seq).expand(args.batch, -1).contiguous(),
        torch.ones(args.seq, args.seq).tril().bool(),
        (torch.rand(1 << 20) > 0.1),
    ]
    groups = {
        "float32 (trained)": floats,
        "bfloat16 (cast)": [t.bfloat16() for t in floats],
        "float16 (cast)": [t.half() for t in floats],
        "float8_e4m3fn (cast)": [t.to(torch.float8_e4m3fn) for t in floats],
        "int64 / bool buffers": others,
    }
    print(f"{sum(t.numel() for t in floats) / 1e6:.1f}M float parameters")
    print("| tensors | codec | size on disk / raw | write MB/s |")
    print("|---|---|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="auditlog-compression-") as tmp:
        for label, tensors in groups.items():
            for codec, level in CODECS:
                raw, disk, seconds = write(tensors, codec, level, Path(tmp))
                name = codec if level is None else f"{codec}-{level}"
                print(
                    f"| {label} | {name} | {disk / raw:.3f} | {raw / max(seconds, 1e-9) / 1e6:.0f} |"
                )


if __name__ == "__main__":
    main()
