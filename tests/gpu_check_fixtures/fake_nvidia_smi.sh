#!/usr/bin/env bash
# A fake nvidia-smi for tests/gpu_check_dry_run.sh: one H200.
echo "NVIDIA H200, 570.86.15, 143771 MiB"
