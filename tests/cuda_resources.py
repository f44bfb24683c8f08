#!/usr/bin/env python3
"""ctest cuda.kernel_resources: reads ptxas's report of every kernel of ours, kept beside each
CUDA object by cmake/keep_resource_usage.sh, and fails on
  - a register spill (spill stores or loads) or any stack frame in a kernel of ours: both are
    local memory, which the kernels are written to avoid;
  - static shared memory above the 48 KiB a launch gets without asking;
  - static plus the largest dynamic shared memory of a kernel launched with dynamic shared
    memory (FLASH_DYNAMIC below) above what the launch can be granted, or above 48 KiB without
    the grant_shared_bytes call (cudaFuncSetAttribute) that asks for it.
Usage: cuda_resources.py BUILD_DIR SOURCE_DIR. Exits 77 (skipped) for a build without CUDA.
"""
import glob
import os
import re
import sys

DEFAULT_SHARED = 48 * 1024
MAX_SHARED = 227 * 1024  # per block on sm_90 with the opt-in attribute

# Kernels launched with dynamic shared memory: their largest request, from the formulas in
# fusion/ops/flash_attention.cu at kTile = 32, kMaxHeadDim = 128 (the source text is checked
# below, so a change to a formula fails this test until the table follows).
TILE, MAX_HEAD_DIM = 32, 128
FLASH_DYNAMIC = {
    "flash_attention_forward_kernel": (
        "sizeof(float) * 3 * kTile * (head_dim + 1)", 4 * 3 * TILE * (MAX_HEAD_DIM + 1)),
    "flash_attention_backward_dkv_kernel": (
        "sizeof(float) * (4 * kTile * (head_dim + 1) + 2 * kTile * kTile + 2 * kTile)",
        4 * (4 * TILE * (MAX_HEAD_DIM + 1) + 2 * TILE * TILE + 2 * TILE)),
}
FLASH_DYNAMIC["flash_attention_backward_dq_kernel"] = FLASH_DYNAMIC[
    "flash_attention_backward_dkv_kernel"]


def parse(path):
    """{mangled kernel: {"stack", "spill_stores", "spill_loads", "smem"}} of one report."""
    kernels, current = {}, None
    for line in open(path):
        entry = re.search(r"Compiling entry function '([^']+)'", line)
        if entry:
            current = kernels.setdefault(entry.group(1), {"smem": 0})
            continue
        frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                          line)
        if frame and current is not None:
            current["stack"], current["spill_stores"], current["spill_loads"] = map(
                int, frame.groups())
        smem = re.search(r"Used \d+ registers.*?(\d+) bytes smem", line)
        if smem and current is not None:
            current["smem"] = int(smem.group(1))
    return kernels


def short_name(mangled):
    """The kernel's own name: the last <length><identifier> of its nested name."""
    i = 3 if mangled.startswith("_ZN") else 2
    pieces = []
    while i < len(mangled) and mangled[i].isdigit():
        j = i
        while mangled[j].isdigit():
            j += 1
        length = int(mangled[i:j])
        pieces.append(mangled[j:j + length])
        i = j + length
    return pieces[-1] if pieces else mangled


def top_level_arguments(text):
    """`a(b, c), d, 0` -> ["a(b, c)", "d", "0"]: commas inside brackets do not split."""
    arguments, depth, current = [], 0, ""
    for char in text:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            arguments.append(current.strip())
            current = ""
        else:
            current += char
    arguments.append(current.strip())
    return arguments


def main():
    build_dir, source_dir = sys.argv[1], sys.argv[2]
    reports = glob.glob(os.path.join(build_dir, "CMakeFiles", "**", "*.cu.o.resource-usage"),
                        recursive=True)
    if not glob.glob(os.path.join(build_dir, "CMakeFiles", "**", "*.cu.o"), recursive=True):
        print("skipped: this build has no CUDA path (no .cu objects)")
        return 77
    # Our folders only: build trees and bundles under the source folder hold no sources.
    cu_sources = [path for folder in ("core", "kernels", "model", "fusion", "comm", "app")
                  for path in glob.glob(os.path.join(source_dir, folder, "**", "*.cu"),
                                        recursive=True)]
    if len(reports) < len(cu_sources):
        print(f"only {len(reports)} resource reports for {len(cu_sources)} .cu files: rebuild "
              "(cmake --build) so every object is compiled through cmake/keep_resource_usage.sh")
        return 1
    flash_source = open(os.path.join(source_dir, "fusion", "ops", "flash_attention.cu")).read()
    for kernel, (formula, _) in FLASH_DYNAMIC.items():
        if formula not in flash_source:
            print(f"{kernel}: its dynamic shared memory is no longer `{formula}`; update "
                  "FLASH_DYNAMIC in tests/cuda_resources.py")
            return 1
    dynamic_users = set()
    for source in cu_sources:
        text = open(source).read()
        for launch in re.finditer(r"(\w+)\s*<<<(.*?)>>>", text, re.S):
            arguments = top_level_arguments(launch.group(2))
            if len(arguments) >= 3 and arguments[2] != "0":
                dynamic_users.add(launch.group(1))
    unknown = dynamic_users - set(FLASH_DYNAMIC)
    if unknown:
        print("kernels launched with dynamic shared memory that this test has no bound for: " +
              ", ".join(sorted(unknown)))
        return 1

    failures, checked = [], 0
    for report in sorted(reports):
        for mangled, usage in parse(report).items():
            if "2ft" not in mangled[:8]:
                continue  # not in namespace ft (a library's kernel)
            checked += 1
            name = short_name(mangled)
            where = f"{name} ({os.path.basename(report).replace('.o.resource-usage', '')})"
            if usage.get("spill_stores", 0) or usage.get("spill_loads", 0):
                failures.append(f"{where}: spills {usage['spill_stores']} bytes stored, "
                                f"{usage['spill_loads']} loaded")
            if usage.get("stack", 0):
                failures.append(f"{where}: {usage['stack']} bytes of stack frame")
            static = usage["smem"]
            if static > DEFAULT_SHARED:
                failures.append(f"{where}: {static} bytes of static shared memory, above 48 KiB")
            if name in FLASH_DYNAMIC:
                total = static + FLASH_DYNAMIC[name][1]
                if total > MAX_SHARED:
                    failures.append(f"{where}: {total} bytes of shared memory at head_dim "
                                    f"{MAX_HEAD_DIM}, above the {MAX_SHARED} a block can have")
                if total > DEFAULT_SHARED and f"grant_shared_bytes({name}" not in flash_source:
                    failures.append(f"{where}: needs {total} bytes of shared memory but its "
                                    "launch asks for no more than 48 KiB (grant_shared_bytes)")
    print(f"{checked} kernels of ours in {len(reports)} objects checked")
    for failure in failures:
        print("FAIL " + failure)
    if checked == 0:
        print("FAIL no kernel of ours found in the reports")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
