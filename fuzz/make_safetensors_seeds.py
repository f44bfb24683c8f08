#!/usr/bin/env python3
"""Writes fuzz/corpus/safetensors/: small safetensors files shaped like fusiontrain's checkpoints
and exports (their real metadata keys and values, a few of their tensor names, shrunk shapes),
plus edge cases of the format. Real files are tens of KB; a fuzzer mutates small inputs faster.

Usage: python3 fuzz/make_safetensors_seeds.py [CHECKPOINT_OR_EXPORT ...]
Each file given (e.g. a gpt_tiny checkpoint, a ResNet and a GPT export) adds a seed that keeps its
metadata and its first tensors' names with shapes cut to at most 4 elements. Without files, only
the built-in seeds are written (their metadata was taken from such files).
"""
import json
import math
import os
import struct
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors")


def bf16_bits(value):
    """The bf16 bit pattern of a float, rounded to nearest, ties to even (core/math/bf16_math.h)."""
    (bits,) = struct.unpack("<I", struct.pack("<f", value))
    if bits & 0x7F800000 == 0x7F800000 and bits & 0x007FFFFF:
        return (bits >> 16) | 0x0040
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def encode(metadata, tensors, pad=True):
    """tensors: [(name, shape, [floats])] or [(name, shape, values, dtype)] -> bytes, as
    core/safetensors.cpp writes them. dtype "BF16" rounds float values; "BF16_BITS" stores int
    values as bf16 bit patterns (a signalling NaN, which a Python float would quiet)."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    data = b""
    for name, shape, values, *dtype in sorted(tensors):
        dtype = dtype[0] if dtype else "F32"
        if dtype == "BF16_BITS":
            raw = struct.pack("<%dH" % len(values), *values)
            dtype = "BF16"
        elif dtype == "BF16":
            raw = struct.pack("<%dH" % len(values), *[bf16_bits(v) for v in values])
        else:
            raw = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def shrink(path, keep=6):
    blob = open(path, "rb").read()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length])
    metadata = header.pop("__metadata__", {})
    tensors = []
    for name in sorted(header)[:keep]:
        shape = header[name]["shape"]
        small = [min(dim, 2) for dim in shape][:2]
        count = math.prod(small)
        tensors.append((name, small, [0.25 * (i + 1) for i in range(count)]))
    return metadata, tensors


def write(name, blob):
    with open(os.path.join(OUT, name), "wb") as out:
        out.write(blob)


def main():
    os.makedirs(OUT, exist_ok=True)
    write("empty_header", encode({}, []))
    write("metadata_only", encode({"format": "fusiontrain-checkpoint-1", "step": "0"}, []))
    write("scalar_and_empty", encode({}, [("s", [], [1.5]), ("z", [0, 3], [])]))
    write("special_floats", encode({}, [("x", [4], [math.nan, math.inf, -0.0, 1e-45])]))
    write("unpadded_header", encode({}, [("a", [1], [2.0])], pad=False))
    write("utf8_names", encode({"k\u00e9y": "v\u2713"}, [("t\u00e9", [1], [1.0])]))
    # export --dtype bf16: BF16 tensors (specials, a tie that rounds to even, signalling NaNs
    # whose payload must survive a re-encode, an empty one) beside an F32 one, and a GPT export's
    # metadata with its dtype.
    write("bf16_tensors", encode({"dtype": "bf16"}, [
        ("b", [2, 3], [math.nan, math.inf, -0.0, 1.00390625, 3e-41, -65504.0], "BF16"),
        ("e", [0], [], "BF16"), ("f", [1], [0.1]), ("n", [2], [0x7F81, 0xFFA5], "BF16_BITS")]))
    write("bf16_gpt_export", encode({
        "format": "fusiontrain-export-1", "arch": "gpt", "dtype": "bf16", "plan": "[]",
        "model": '{"d_model":8,"n_head":2,"n_layer":1,"qk_norm":false,"seq_len":8,'
                 '"tied_lm_head":"wte.weight","vocab_size":256}',
        "config": "model:\n  arch: gpt\n  n_layer: 1\n  d_model: 8\n",
        "source_checkpoint": "ckpt.safetensors", "source_sha256": "00" * 32},
        [("ln_f.bias", [2], [0.0, 0.5], "BF16"), ("wte.weight", [2, 2], [0.1, 0.2, 0.3, 0.4], "BF16")]))
    write("resnet_export_model", encode({
        "format": "fusiontrain-export-1", "arch": "resnet", "bn_eps": "0.000010",
        "image_mean": "0.28604060411453247", "image_std": "0.3530242443084717",
        "model": '{"bn_eps":9.999999747378752e-06,"classes":10,"conv_algorithm":"auto",'
                 '"image_size":28,"in_channels":1,"resnet_blocks":1,"resnet_width":4}',
        "plan": '[{"conv":"conv1","eps":9.999999747378752e-06,"relu":true,"residual":false}]',
        "source_checkpoint": "ckpt.safetensors", "source_sha256": "00" * 32},
        [("conv1.bias", [2], [0.5, -0.5]), ("conv1.weight", [2, 1], [1.0, 2.0])]))
    write("checkpoint_counters", encode({
        "format": "fusiontrain-checkpoint-1", "arch": "gpt", "step": "2",
        "optimizer_steps": "2", "skipped_steps": "0",
        "config": "model:\n  arch: gpt\n  n_layer: 1\n  d_model: 8\ntrain:\n  steps: 2\n"},
        [("wte.weight", [2, 2], [0.1, 0.2, 0.3, 0.4]),
         ("optim.exp_avg.wte.weight", [2, 2], [0.0] * 4)]))
    for path in sys.argv[1:]:
        metadata, tensors = shrink(path)
        write("from_" + os.path.splitext(os.path.basename(path))[0], encode(metadata, tensors))


if __name__ == "__main__":
    main()
