#!/usr/bin/env python3
"""PyTorch's training step for the same byte-level GPT fusiontrain trains (gpt_tiny by default),
for the README's comparison: pre-LayerNorm blocks, tanh GELU, causal attention, the LM head tied
to the token embedding, AdamW with gradient clipping at 1.0, one thread, eager mode. Prints the
median and p10-p90 step time over the timed steps (after warm-up).

  /usr/bin/python3 scripts/torch_gpt_step.py --layers 4 --width 128 --heads 4 --seq 64 --batch 4

--autocast bf16 runs forward and loss under torch.autocast('cpu', dtype=torch.bfloat16), as
fusiontrain's train.precision: bf16 (fp32 masters, AdamW and clipping outside autocast).
"""
import argparse
import contextlib
import math
import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def attention(self, x):
        batch, seq, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        shape = (batch, seq, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(width // self.heads)
        mask = torch.ones(seq, seq, dtype=torch.bool).tril()
        probs = F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return self.c_proj((probs @ v).transpose(1, 2).reshape(batch, seq, width))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, layers, width, heads, seq, vocab=256):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, tokens, targets):
        positions = torch.arange(tokens.shape[1])
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--autocast", choices=["off", "bf16"], default="off",
                        help="off: fp32 throughout; bf16: forward under CPU bf16 autocast")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Gpt(args.layers, args.width, args.heads, args.seq)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    # fusiontrain flushes denormals too (core/denormals.h); without it a converging run slows down.
    torch.set_flush_denormal(True)
    times = []
    for step in range(args.warmup + args.steps):
        # A fresh batch per step, as from the data loader (one fixed batch would be memorised).
        tokens = torch.randint(0, 256, (args.batch, args.seq))
        targets = torch.randint(0, 256, (args.batch, args.seq))
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)
        precision = (torch.autocast("cpu", dtype=torch.bfloat16) if args.autocast == "bf16"
                     else contextlib.nullcontext())
        with precision:
            loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step >= args.warmup:
            times.append((time.perf_counter() - start) * 1e3)
    deciles = statistics.quantiles(times, n=10)
    params = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__} gpt {args.layers}x{args.width}, {args.heads} heads, "
          f"B={args.batch} T={args.seq}, {params / 1e6:.2f}M parameters, autocast {args.autocast}, "
          f"1 thread: "
          f"median {statistics.median(times):.2f} ms/step (p10-p90 {deciles[0]:.2f}-"
          f"{deciles[-1]:.2f}) over {args.steps} steps, final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
