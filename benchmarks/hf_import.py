"""Peak host memory of loading a Hugging Face checkpoint: streamed slice by slice
(`HFCheckpoint`) against the loader before it, which read every tensor to float32 first.

A Qwen3 of about 166M parameters (hidden 1024, 8 layers, intermediate 3072, vocabulary 32768,
untied head) is written as a Hugging Face checkpoint in bfloat16 (332 MB, in 1 GB shards), in
a temporary directory deleted at the end. Each case runs in a fresh process, which builds the
model (float32 parameters) before it starts measuring:

- whole (the loader before): `load_hf_weights` reads every tensor to float32 into one dict,
  then `load_hf_state` fills the model from it;
- streamed: `load_hf_state` reads each parameter's tensors from the open checkpoint, one
  parameter at a time (`checkpoint.load_worker_number: 1`);
- streamed, 4 workers: up to 4 parameters read ahead (`load_worker_number: 4`);
- tensor rank 0 of 2, whole / streamed: what one rank of `tensor_parallel: 2` reads, without
  a model (building a tensor-parallel model needs the ranks' communication): the whole
  checkpoint in float32 then sliced, against this rank's slices read alone.

Per case, over the loading alone: the rise of the process's peak resident memory (VmHWM, reset
by `/proc/self/clear_refs` just before; it counts the checkpoint file's pages the process
touched through its memory map, which are clean page cache the kernel can drop) and of its
anonymous memory (RssAnon, sampled every millisecond from outside: what the process itself
allocated), both over the process before loading; the bytes of tensor data read; the time.

Usage: python benchmarks/hf_import.py [--layers 8] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MIB = 2**20
SIZES = {"hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
         "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 32768,
         "max_position_embeddings": 2048, "tie_word_embeddings": False}
CASES = ["whole (before)", "streamed", "streamed, 4 workers",
         "tensor rank 0 of 2, whole", "tensor rank 0 of 2, streamed"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint directory")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, Path(args.checkpoint), args.layers)))
        return
    tmp = Path(tempfile.mkdtemp(prefix="mf-hf-import-"))
    try:
        checkpoint, nbytes, params = write_checkpoint(tmp / "hf", args.layers)
        print(f"Qwen3, {params / 1e6:.0f}M parameters, {args.layers} layers; checkpoint "
              f"{nbytes / MIB:,.0f} MiB in bfloat16 (float32: {2 * nbytes / MIB:,.0f} MiB)")
        print(f"{'case':<30}{'peak RSS rise MiB':>18}{'peak anon rise MiB':>19}"
              f"{'read MiB':>10}{'seconds':>9}")
        for case in CASES:
            row = measured(case, checkpoint, args.layers)
            print(f"{case:<30}{row['rss_rise'] / MIB:>18,.0f}{row['anon_rise'] / MIB:>19,.0f}"
                  f"{row['read'] / MIB:>10,.0f}{row['seconds']:>9.2f}")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp)


def model_config(layers: int):
    from mf_config import ModelConfig

    return ModelConfig(model_type="qwen3", extras={**SIZES, "num_hidden_layers": layers})


def write_checkpoint(directory: Path, layers: int, sizes: dict | None = None,
                     ) -> tuple[Path, int, int]:
    """A random Qwen3 checkpoint in bfloat16 (this benchmark's model at `layers`, or the
    Qwen3 `sizes`), in a fresh process (its float32 arrays are not left in the measuring
    one); returns (directory, bytes, parameters)."""
    extras = sizes or {**SIZES, "num_hidden_layers": layers}
    code = ("import sys, json, numpy as np; sys.path.insert(0, sys.argv[1]);"
            "from hf_import import write_random; print(json.dumps(write_random(sys.argv[2], "
            "json.loads(sys.argv[3]))))")
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent),
                          str(directory), json.dumps(extras)], check=True, capture_output=True,
                         text=True).stdout
    nbytes, params = json.loads(out.splitlines()[-1])
    return directory, nbytes, params


def write_random(directory: str, extras: dict) -> tuple[int, int]:
    import numpy as np

    from mf_train.checkpoint.hf_write import write_hf_directory
    from mf_train.models.qwen3 import qwen3_settings, weight_maps

    settings = qwen3_settings(extras)
    rng = np.random.default_rng(0)
    weights = {name: (rng.standard_normal(shape, np.float32) * 0.02)
               for entry in weight_maps(settings) for name, shape in
               zip(entry.hf, entry.shapes, strict=True)}
    write_hf_directory(directory, weights, {"architectures": ["Qwen3ForCausalLM"]},
                       dtype="bfloat16", max_shard_size="1GB")
    params = sum(value.size for value in weights.values())
    return 2 * params, params


def measured(case: str, checkpoint: Path, layers: int) -> dict[str, float]:
    """Run `case` in a fresh process; between its "loading" and "loaded" lines, sample its
    anonymous memory from outside every millisecond."""
    child = subprocess.Popen([sys.executable, __file__, "--case", case, "--checkpoint",
                              str(checkpoint), "--layers", str(layers)],
                             stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(child.stdout), daemon=True)
    reader.start()
    status, peak = Path(f"/proc/{child.pid}/status"), 0
    while child.poll() is None:
        if "loading\n" in lines and "loaded\n" not in lines:
            with contextlib.suppress(OSError, ValueError):  # the process may just have ended
                peak = max(peak, _field(status.read_text(), "RssAnon"))
        time.sleep(0.001)
    reader.join()
    if child.returncode:
        raise SystemExit(f"case {case!r} failed ({child.returncode})")
    row = json.loads(lines[-1])
    row["anon_rise"] = max(peak, row["anon_after"]) - row["anon_before"]
    return row


def _field(status: str, name: str) -> int:
    """A `/proc/<pid>/status` field in bytes."""
    for line in status.splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no {name}")


def run_case(case: str, checkpoint: Path, layers: int) -> dict[str, float]:
    """Load as `case` says; peak RSS rise and the bytes read, as JSON for the parent."""
    import mindspore  # noqa: F401  (imported before the baseline is taken)

    from mf_train.checkpoint import HFCheckpoint, load_hf_weights
    from mf_train.checkpoint.reading import read_ahead
    from mf_train.models import build_model, load_hf_state

    tensor_rank = case.startswith("tensor rank")
    model = None if tensor_rank else build_model(model_config(layers), seed=0)
    status = Path("/proc/self/status")
    anon_before, rss_before = _field(status.read_text(), "RssAnon"), _field(
        status.read_text(), "VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) from here on
    print("loading", flush=True)
    start = time.perf_counter()
    read = 0
    if case == "whole (before)":
        weights = load_hf_weights(checkpoint)
        read = sum(value.nbytes // 2 for value in weights.values())
        load_hf_state(model, weights)
    elif case.startswith("streamed"):
        workers = 4 if "4 workers" in case else 1
        with HFCheckpoint(checkpoint) as source:
            load_hf_state(model, source,
                          read_ahead=lambda read, items: read_ahead(read, items, workers))
            read = source.bytes_read
    elif tensor_rank:
        read = _tensor_rank_reads(checkpoint, layers, whole=case.endswith("whole"))
    seconds = time.perf_counter() - start
    rss_peak, anon_after = _field(status.read_text(), "VmHWM"), _field(status.read_text(),
                                                                        "RssAnon")
    print("loaded", flush=True)
    return {"rss_rise": rss_peak - rss_before, "anon_before": anon_before,
            "anon_after": anon_after, "read": read, "seconds": seconds}


def _tensor_rank_reads(checkpoint: Path, layers: int, whole: bool) -> int:
    """Rank 0 of 2's values of every parameter, each dropped once made; bytes read."""
    from mf_train.checkpoint import HFCheckpoint, load_hf_weights
    from mf_train.models.hf_weights import ArraysSource, local_value
    from mf_train.models.qwen3 import qwen3_settings, weight_maps

    class TensorRank:
        size, rank = 2, 0

    entries = weight_maps(qwen3_settings(dict(model_config(layers).extras), tensor_parallel=2))
    if whole:
        arrays = load_hf_weights(checkpoint)
        for entry in entries:
            local_value(entry, ArraysSource(arrays), TensorRank())
        return sum(value.nbytes // 2 for value in arrays.values())
    with HFCheckpoint(checkpoint) as source:
        for entry in entries:
            local_value(entry, source, TensorRank())
        return source.bytes_read


if __name__ == "__main__":
    main()
