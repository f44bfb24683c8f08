#!/usr/bin/env python3
"""Loads a fusiontrain ResNet export into plain PyTorch modules (nn.Conv2d with bias, no
BatchNorm) and runs it, to show that the file is all a reader needs. Reads fp32 and bf16 exports
(`export --dtype`); bf16 tensors are widened to float32 exactly, as fusiontrain infer does.

  python3 scripts/load_export.py --export runs/resnet8.safetensors [--count 256]
      [--expect logits.f32]

Prints the accuracy on the first --count Fashion-MNIST test images. With --expect (float32
logits [count, classes] as raw bytes, e.g. from tests/export_test.cpp) it also prints the largest
logit difference relative to the largest logit and exits 1 above 1e-4.
"""
import argparse
import gzip
import json
import struct
import sys

import numpy as np
import torch
from torch import nn

MNIST = "/usr/share/datasets/fashion-mnist"


def read_safetensors(path):
    """The tensors (float32 numpy arrays) and metadata of a safetensors file, F32 or BF16."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        data = f.read()
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        raw = data[begin:end]
        if entry["dtype"] == "F32":
            values = np.frombuffer(raw, dtype="<f4")
        elif entry["dtype"] == "BF16":
            # numpy has no bfloat16: a bf16 is the top half of a float32's bits.
            values = (np.frombuffer(raw, dtype="<u2").astype("<u4") << 16).view("<f4")
        else:
            raise ValueError(f"{path}: tensor {name} has dtype {entry['dtype']}, not F32 or BF16")
        tensors[name] = values.reshape(entry["shape"])
    return tensors, metadata


def conv(tensors, prefix, stride, padding):
    weight = tensors[prefix + ".weight"]
    out_channels, in_channels, kernel, _ = weight.shape
    module = nn.Conv2d(in_channels, out_channels, kernel, stride, padding, bias=True)
    module.weight.data = torch.from_numpy(weight.copy())
    module.bias.data = torch.from_numpy(tensors[prefix + ".bias"].copy())
    return module


class FoldedResNet(nn.Module):
    """CIFAR-style ResNet-(6n+2) with every BatchNorm folded into the convolution before it."""

    def __init__(self, tensors, blocks):
        super().__init__()
        self.stem = conv(tensors, "conv1", 1, 1)
        self.blocks = nn.ModuleList()
        for stage in range(3):
            for block in range(blocks):
                prefix = f"layer{stage + 1}.{block}"
                stride = 2 if stage > 0 and block == 0 else 1
                parts = nn.ModuleDict({"conv1": conv(tensors, prefix + ".conv1", stride, 1),
                                       "conv2": conv(tensors, prefix + ".conv2", 1, 1)})
                if prefix + ".downsample.0.weight" in tensors:
                    parts["downsample"] = conv(tensors, prefix + ".downsample.0", stride, 0)
                self.blocks.append(parts)
        weight = tensors["fc.weight"]
        self.fc = nn.Linear(weight.shape[1], weight.shape[0])
        self.fc.weight.data = torch.from_numpy(weight.copy())
        self.fc.bias.data = torch.from_numpy(tensors["fc.bias"].copy())

    def forward(self, x):
        x = torch.relu(self.stem(x))
        for parts in self.blocks:
            shortcut = parts["downsample"](x) if "downsample" in parts else x
            x = torch.relu(parts["conv2"](torch.relu(parts["conv1"](x))) + shortcut)
        return self.fc(x.mean(dim=(2, 3)))


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data[4 + 4 * dims:], dtype=np.uint8).reshape(shape)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", required=True)
    parser.add_argument("--count", type=int, default=256)
    parser.add_argument("--expect", help="raw float32 logits to compare against")
    args = parser.parse_args()

    tensors, metadata = read_safetensors(args.export)
    model = FoldedResNet(tensors, json.loads(metadata["model"])["resnet_blocks"]).eval()
    mean, std = float(metadata["image_mean"]), float(metadata["image_std"])
    images = read_idx(f"{MNIST}/t10k-images-idx3-ubyte.gz")[: args.count]
    labels = read_idx(f"{MNIST}/t10k-labels-idx1-ubyte.gz")[: args.count]
    x = torch.from_numpy((images.astype(np.float32) / 255.0 - mean) / std).unsqueeze(1)
    torch.set_num_threads(1)
    with torch.no_grad():
        logits = model(x).numpy()
    accuracy = float((logits.argmax(1) == labels).mean())
    print(f"pytorch: {len(labels)} images, accuracy {100 * accuracy:.2f}%")
    if args.expect:
        expected = np.fromfile(args.expect, dtype="<f4").reshape(logits.shape)
        relative = float(np.abs(logits - expected).max() / np.abs(expected).max())
        agree = int((logits.argmax(1) == expected.argmax(1)).sum())
        print(f"pytorch vs fusiontrain: max relative logit difference {relative:.3g}, "
              f"predictions agree {agree}/{len(labels)}")
        if relative > 1e-4 or agree != len(labels):
            sys.exit(1)


if __name__ == "__main__":
    main()
