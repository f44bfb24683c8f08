#!/usr/bin/env python3
"""PyTorch eval latency of the same CIFAR-style ResNet fusiontrain trains, for the README's
inference table: eager Conv -> BN -> ReLU against torch.nn.utils.fusion.fuse_conv_bn_eval, one
thread, torch.no_grad, both timed in alternation in one process (median and p90 per batch).

  /usr/bin/python3 scripts/torch_resnet_latency.py --blocks 1 --batch 1 --rounds 400
"""
import argparse
import copy
import time

import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    def __init__(self, blocks, width=16, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        layers, cin = [], width
        for stage in range(3):
            cout = width << stage
            for block in range(blocks):
                layers.append(Block(cin, cout, 2 if stage > 0 and block == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(torch.relu(self.bn1(self.conv1(x))))
        return self.fc(x.mean(dim=(2, 3)))


def folded(model):
    model = copy.deepcopy(model)
    model.conv1, model.bn1 = fuse_conv_bn_eval(model.conv1, model.bn1), nn.Identity()
    for block in model.layers:
        block.conv1, block.bn1 = fuse_conv_bn_eval(block.conv1, block.bn1), nn.Identity()
        block.conv2, block.bn2 = fuse_conv_bn_eval(block.conv2, block.bn2), nn.Identity()
        if block.downsample is not None:
            block.downsample = fuse_conv_bn_eval(block.downsample[0], block.downsample[1])
    return model


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * (len(values) - 1) + 0.5))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1, help="n of ResNet-(6n+2)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    eager = ResNet(args.blocks)
    for module in eager.modules():  # statistics away from identity, as after training
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.normal_(0, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    eager.eval()
    fused = folded(eager).eval()
    x = torch.randn(args.batch, 1, 28, 28)
    times = {"eager": [], "fuse_conv_bn_eval": []}
    with torch.no_grad():
        diff = (fused(x) - eager(x)).abs().max().item()
        for _ in range(5):
            eager(x), fused(x)
        for round_index in range(args.rounds):
            order = [("eager", eager), ("fuse_conv_bn_eval", fused)]
            for name, model in order if round_index % 2 == 0 else reversed(order):
                start = time.perf_counter()
                model(x)
                times[name].append(1000 * (time.perf_counter() - start))
    ratios = sorted(e / f for e, f in zip(times["eager"], times["fuse_conv_bn_eval"]))
    print(f"pytorch {torch.__version__} resnet{6 * args.blocks + 2} batch {args.batch}, 1 thread, "
          f"{args.rounds} interleaved rounds (max |logit diff| {diff:.2g})")
    for name, values in times.items():
        print(f"  {name:18s} median {percentile(values, 0.5):8.3f} ms  p90 "
              f"{percentile(values, 0.9):8.3f} ms")
    print(f"  fuse_conv_bn_eval speedup {percentile(ratios, 0.5):.3f}x "
          f"(p10-p90 {percentile(ratios, 0.1):.3f}-{percentile(ratios, 0.9):.3f})")


if __name__ == "__main__":
    main()
