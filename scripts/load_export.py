#!/usr/bin/env python3
"""Loads a fusiontrain export into plain PyTorch modules and runs it, to show that the file is all
a reader needs. Reads fp32 and bf16 exports (`export --dtype`); bf16 tensors are widened to
float32 exactly, as fusiontrain infer does.

A ResNet export becomes nn.Conv2d layers with bias and no BatchNorm (it is folded in):

  python3 scripts/load_export.py --export runs/resnet8.safetensors [--count 256]
      [--expect logits.f32]

prints the accuracy on the first --count Fashion-MNIST test images. With --expect (float32
logits [count, classes] as raw bytes, e.g. from tests/export_test.cpp) it also prints the largest
logit difference relative to the largest logit and exits 1 above 1e-4.

A GPT export becomes a nanoGPT-style module with the export's parameter names (pre-LayerNorm
blocks, tanh GELU, causal attention, optional qk_norm, the LM head tied to wte.weight):

  python3 scripts/load_export.py --export runs/gpt.safetensors --text data.txt
      [--expect-loss LOSS]

prints the mean next-byte cross-entropy over the windows `fusiontrain eval --data data.txt`
uses: consecutive, non-overlapping windows of model.seq_len + 1 bytes from the start of the
file, a short last window dropped. With --expect-loss (e.g. the loss of `eval --json`) it also
prints the difference relative to it and exits 1 above 1e-4.
"""
import argparse
import gzip
import json
import math
import struct
import sys

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

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


class GptBlock(nn.Module):
    """One pre-LayerNorm block; its submodules carry the export's names (h.{i}.attn.c_attn...)."""

    def __init__(self, width, heads, qk_norm):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(width, 3 * width)
        if qk_norm:  # one LayerNorm over head_dim, shared by the heads, on q and on k
            self.attn.q_norm = nn.LayerNorm(width // heads)
            self.attn.k_norm = nn.LayerNorm(width // heads)
        self.attn.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(width, 4 * width)
        self.mlp.c_proj = nn.Linear(4 * width, width)

    def attention(self, x):
        batch, seq, width = x.shape
        q, k, v = self.attn.c_attn(x).split(width, dim=2)
        shape = (batch, seq, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))  # [B, NH, T, hd]
        if hasattr(self.attn, "q_norm"):
            q, k = self.attn.q_norm(q), self.attn.k_norm(k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(width // self.heads)
        mask = torch.ones(seq, seq, dtype=torch.bool).tril()
        probs = F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return self.attn.c_proj((probs @ v).transpose(1, 2).reshape(batch, seq, width))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    """Byte-level GPT-2 as fusiontrain builds it (model/gpt.h); state_dict names = export names."""

    def __init__(self, shape):
        super().__init__()
        width = shape["d_model"]
        self.wte = nn.Embedding(shape["vocab_size"], width)
        self.wpe = nn.Embedding(shape["seq_len"], width)
        self.h = nn.ModuleList(GptBlock(width, shape["n_head"], bool(shape.get("qk_norm")))
                               for _ in range(shape["n_layer"]))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()  # the tied LM head


def load_gpt(tensors, metadata):
    shape = json.loads(metadata["model"])
    if shape.get("tied_lm_head", "wte.weight") != "wte.weight":
        raise ValueError(f"export's LM head is {shape['tied_lm_head']}, not wte.weight")
    model = Gpt(shape)
    # strict: every tensor of the file is a parameter of the module and the other way round.
    model.load_state_dict({name: torch.from_numpy(t.copy()) for name, t in tensors.items()})
    return model.eval(), shape["seq_len"]


def gpt_text_loss(model, seq_len, path, batch=32):
    """Mean next-byte cross-entropy (nats) over eval's windows of path, and the window count."""
    with open(path, "rb") as f:
        data = np.frombuffer(f.read(), dtype=np.uint8)
    windows = len(data) // (seq_len + 1)
    if windows == 0:
        raise ValueError(f"{path}: {len(data)} bytes, shorter than one window of "
                         f"seq_len + 1 = {seq_len + 1}")
    rows = torch.from_numpy(data[: windows * (seq_len + 1)].astype(np.int64)).view(windows, -1)
    total = 0.0
    with torch.no_grad():
        for first in range(0, windows, batch):
            chunk = rows[first:first + batch]
            logits = model(chunk[:, :-1])
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                     chunk[:, 1:].reshape(-1), reduction="sum").item()
    return total / (windows * seq_len), windows


def run_gpt(args, tensors, metadata):
    if not args.text:
        sys.exit(f"{args.export} is a GPT export: pass --text FILE to compute its loss")
    model, seq_len = load_gpt(tensors, metadata)
    loss, windows = gpt_text_loss(model, seq_len, args.text)
    print(f"pytorch: {args.text}: loss {loss:.6f} | {loss / math.log(2):.6f} bits/byte "
          f"({windows} windows of {seq_len + 1} bytes)")
    if args.expect_loss is not None:
        relative = abs(loss - args.expect_loss) / abs(args.expect_loss)
        print(f"pytorch vs fusiontrain: loss {loss:.9g} vs {args.expect_loss:.9g}, "
              f"relative difference {relative:.3g}")
        if not relative <= 1e-4:
            sys.exit(1)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data[4 + 4 * dims:], dtype=np.uint8).reshape(shape)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--export", required=True, help="a file `fusiontrain export` wrote")
    parser.add_argument("--count", type=int, default=256, help="ResNet: test images to run")
    parser.add_argument("--expect", help="ResNet: raw float32 logits to compare against")
    parser.add_argument("--text", help="GPT: the text file to compute the loss on")
    parser.add_argument("--expect-loss", type=float, help="GPT: the loss to compare against")
    args = parser.parse_args()

    tensors, metadata = read_safetensors(args.export)
    torch.set_num_threads(1)
    if metadata.get("arch") == "gpt":
        run_gpt(args, tensors, metadata)
        return
    model = FoldedResNet(tensors, json.loads(metadata["model"])["resnet_blocks"]).eval()
    mean, std = float(metadata["image_mean"]), float(metadata["image_std"])
    images = read_idx(f"{MNIST}/t10k-images-idx3-ubyte.gz")[: args.count]
    labels = read_idx(f"{MNIST}/t10k-labels-idx1-ubyte.gz")[: args.count]
    x = torch.from_numpy((images.astype(np.float32) / 255.0 - mean) / std).unsqueeze(1)
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
