#!/usr/bin/env python3
"""Turns fusiontrain's JSON into PNG figures (matplotlib, Agg backend, no display).

Usage: scripts/plot.py [KIND] INPUT.json [-o OUT.png]

KIND (detected from the JSON when omitted):
  bench      `fusiontrain bench --json`: iteration time per variant, stacked into compute,
             exposed communication and the rest of the step, p10-p90 whiskers on the median.
  sweep      `fusiontrain bench --sweep key=v1,v2,... --json`: iteration time against the swept
             value (comm.bucket_mb on a log axis, fusion.max_ops linear), p10-p90 band.
  bandwidth  `fusiontrain bandwidth --json`: allreduce bus-bandwidth utilisation against message
             size, and 4 separate allreduces of s bytes against one fused allreduce of 4*s.
  train      `fusiontrain train --json` (JSON Lines): training and validation loss against step.
  simulate   `fusiontrain simulate --json`: predicted scaling efficiency and iteration time
             against ranks for bucketing off/on x overlap off/on. Reads "predictions", a list of
             {ranks, bucketing, overlap, iteration_ms, exposed_ms, efficiency}, and "link".
  tune       `fusiontrain tune --json`: every point measured, median with p10-p90, kept points
             and the winner marked. Reads "points" (or "measurements"), a list of {name | label |
             variant | key+value, median_ms, p10_ms, p90_ms, stage?, kept?, overrides?}, and
             "winner" (a label, or {overrides, median_ms} matched against the points).

Exit status: 0 on success, 2 on a usage error, a missing file or JSON this script cannot plot.
"""

import argparse
import json
import math
import os
import sys

KINDS = ("bench", "sweep", "bandwidth", "train", "simulate", "tune")
DPI = 80  # keeps each committed PNG well under 100 KB


class PlotError(Exception):
    pass


def load_json(path):
    """Returns one JSON value, or a list of objects for JSON Lines (train --json)."""
    if not os.path.isfile(path):
        raise PlotError(f"{path}: no such file")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if not text.strip():
        raise PlotError(f"{path}: file is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as whole_error:
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                # One bad line in a one-line file is the whole file being bad: report that.
                where = whole_error if number == 1 else error
                raise PlotError(f"{path}:{number}: not JSON or JSON Lines: {where.msg}") from None
        return rows


def sweep_key(variants):
    """The key every variant sets as `key=value`, or None when these are not one sweep."""
    keys = set()
    for variant in variants:
        name = str(variant.get("variant", ""))
        if "=" not in name:
            return None
        key, value = name.split("=", 1)
        try:
            float(value)
        except ValueError:
            return None
        keys.add(key)
    return keys.pop() if len(keys) == 1 else None


def detect_kind(data, path):
    if isinstance(data, list):
        if data and all(isinstance(row, dict) and "type" in row for row in data):
            return "train"
        raise PlotError(f"{path}: a JSON list that is not train --json JSON Lines")
    if not isinstance(data, dict):
        raise PlotError(f"{path}: top level is not a JSON object")
    if data.get("job") == "bandwidth" or ("sweep" in data and "fused" in data):
        return "bandwidth"
    if data.get("job") == "tune" or "points" in data or "measurements" in data:
        return "tune"
    if "predictions" in data:
        return "simulate"
    if "type" in data:  # a one-line train --json file
        return "train"
    if isinstance(data.get("variants"), list):
        return "sweep" if sweep_key(data["variants"]) else "bench"
    raise PlotError(f"{path}: cannot tell which fusiontrain job wrote this JSON; "
                    f"give the kind ({', '.join(KINDS)})")


def need(obj, key, where):
    if not isinstance(obj, dict) or key not in obj:
        raise PlotError(f"{where}: missing key '{key}'")
    return obj[key]


def need_list(obj, key, where):
    value = need(obj, key, where)
    if not isinstance(value, list) or not value:
        raise PlotError(f"{where}: '{key}' must be a non-empty list")
    return value


def number(obj, key, where):
    value = need(obj, key, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlotError(f"{where}: '{key}' must be a number, got {value!r}")
    return float(value)


def whiskers(rows, where):
    """Error-bar lengths below and above each median from p10 and p90."""
    medians = [number(r, "median_ms", where) for r in rows]
    low = [m - number(r, "p10_ms", where) for m, r in zip(medians, rows)]
    high = [number(r, "p90_ms", where) - m for m, r in zip(medians, rows)]
    return medians, [[max(0.0, v) for v in low], [max(0.0, v) for v in high]]


def run_title(data):
    parts = [os.path.basename(str(data.get("config", "")))]
    if "world_size" in data:
        parts.append(f"{data['world_size']} rank(s)")
    if "rounds" in data:
        parts.append(f"{data['rounds']} rounds")
    return ", ".join(p for p in parts if p)


def plot_bench(plt, data, where):
    variants = need_list(data, "variants", where)
    names = [str(need(v, "variant", where)) for v in variants]
    compute = [number(v, "compute_ms", where) for v in variants]
    exposed = [number(v, "exposed_comm_ms", where) for v in variants]
    medians, errors = whiskers(variants, where)
    # The step's median is not the sum of the parts' medians; what is left is optimizer and host.
    rest = [max(0.0, m - c - e) for m, c, e in zip(medians, compute, exposed)]
    figure, axes = plt.subplots(figsize=(max(6.0, 1.1 * len(names)), 4.2))
    positions = range(len(names))
    axes.bar(positions, compute, label="compute", color="#4C72B0")
    axes.bar(positions, exposed, bottom=compute, label="exposed communication", color="#DD8452")
    bottom = [c + e for c, e in zip(compute, exposed)]
    axes.bar(positions, rest, bottom=bottom, label="rest of step", color="#CCCCCC")
    axes.errorbar(positions, medians, yerr=errors, fmt="o", color="black", capsize=4,
                  label="median step, p10-p90")
    for position, variant in zip(positions, variants):
        speedup = variant.get("speedup")
        if isinstance(speedup, (int, float)):
            mark = "~" if variant.get("within_noise") else ""
            axes.annotate(f"{mark}{speedup:.2f}x", (position, 0), xytext=(0, 3),
                          textcoords="offset points", ha="center", fontsize=8, color="white")
    axes.set_xticks(list(positions))
    axes.set_xticklabels(names, rotation=20, ha="right")
    axes.set_ylabel("iteration time (ms)")
    axes.set_title(f"bench: {run_title(data)} (speedup over {data.get('baseline', names[0])}; "
                   f"~ within noise)", fontsize=9)
    axes.legend(fontsize=8)
    return figure


def plot_sweep(plt, data, where):
    variants = need_list(data, "variants", where)
    key = sweep_key(variants)
    if key is None:
        raise PlotError(f"{where}: variants are not one `--sweep key=v1,v2,...`")
    values = [float(str(v["variant"]).split("=", 1)[1]) for v in variants]
    medians, errors = whiskers(variants, where)
    compute = [number(v, "compute_ms", where) for v in variants]
    exposed = [number(v, "exposed_comm_ms", where) for v in variants]
    figure, axes = plt.subplots(figsize=(6.0, 4.2))
    axes.errorbar(values, medians, yerr=errors, fmt="o-", capsize=4, color="black",
                  label="median step, p10-p90")
    if any(abs(c - m) > 1e-9 for c, m in zip(compute, medians)):  # on one rank compute = step
        axes.plot(values, compute, "s--", color="#4C72B0", label="compute")
    if any(e > 0 for e in exposed):
        axes.plot(values, exposed, "^--", color="#DD8452", label="exposed communication")
    ops = [v.get("ops_per_step") for v in variants]
    if all(isinstance(o, (int, float)) for o in ops) and len(set(ops)) > 1:
        ops_axes = axes.twinx()
        ops_axes.plot(values, ops, "d:", color="#55A868")
        ops_axes.set_ylabel("ops executed per step", color="#55A868")
        ops_axes.set_ylim(bottom=0)
    if min(values) > 0 and max(values) / min(values) >= 16:
        axes.set_xscale("log", base=2)
    axes.set_xticks(values)
    axes.set_xticklabels([f"{v:g}" for v in values])
    axes.set_xlabel(key + (" (MB)" if key.endswith("_mb") else ""))
    axes.set_ylabel("iteration time (ms)")
    axes.set_ylim(bottom=0)
    axes.set_title(f"sweep of {key}: {run_title(data)}", fontsize=9)
    axes.legend(fontsize=8)
    return figure


def plot_bandwidth(plt, data, where):
    sweep = need_list(data, "sweep", where)
    fused = data.get("fused") or []
    sizes = [number(row, "bytes", where) for row in sweep]
    utilisation = [100.0 * number(row, "utilization", where) for row in sweep]
    panels = 2 if fused else 1
    figure, all_axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.2), squeeze=False)
    axes = all_axes[0][0]
    axes.plot(sizes, utilisation, "o-", color="#4C72B0")
    axes.set_xscale("log", base=2)
    ticks = [s for s in sizes if math.log2(s) % 4 == 0] or sizes[::4]
    axes.set_xticks(ticks)
    axes.set_xticklabels([human_bytes(s) for s in ticks])
    axes.set_xlabel("message size")
    axes.set_ylabel("bus bandwidth / peak (%)")
    axes.set_ylim(bottom=0)
    axes.set_title(f"allreduce, {data.get('ranks', '?')} ranks, {data.get('backend', '?')}, "
                   f"peak {data.get('peak_gbps', float('nan')):.2f} GB/s", fontsize=9)
    axes.grid(True, alpha=0.3)
    if fused:
        axes = all_axes[0][1]
        messages = int(number(fused[0], "messages", where))
        labels = [human_bytes(number(row, "message_bytes", where)) for row in fused]
        separate = [100.0 * number(row, "separate_utilization", where) for row in fused]
        joined = [100.0 * number(row, "fused_utilization", where) for row in fused]
        positions = range(len(labels))
        width = 0.38
        axes.bar([p - width / 2 for p in positions], separate, width, color="#DD8452",
                 label=f"{messages} separate allreduces of s")
        axes.bar([p + width / 2 for p in positions], joined, width, color="#4C72B0",
                 label=f"one fused allreduce of {messages}*s")
        axes.set_xticks(list(positions))
        axes.set_xticklabels(labels)
        axes.set_xlabel("s (bytes per message)")
        axes.set_ylabel("bus bandwidth / peak (%)")
        axes.set_title("separate against fused", fontsize=9)
        axes.legend(fontsize=8)
    figure.tight_layout()
    return figure


def human_bytes(value):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:g} {unit}"
        value /= 1024.0
    return f"{value:g}"


# Rows with a "type" that jobs other than train write with --json, by that type.
ROW_WRITERS = {"infer": "infer", "sample": "sample", "plan": "plan"}


def describe_rows(rows):
    """What rows are, for an error: '1 row: {"type": "infer"} (`fusiontrain infer --json`)'."""
    kinds = []
    for row in rows:
        if isinstance(row, dict) and "type" in row:
            kind = f'{{"type": {json.dumps(row["type"])}}}'
            if row["type"] in ROW_WRITERS:
                kind += f" (`fusiontrain {ROW_WRITERS[row['type']]} --json`)"
        elif isinstance(row, dict):
            kind = 'an object without "type"'
        else:
            kind = f"a JSON {type(row).__name__}"
        if kind not in kinds:
            kinds.append(kind)
    return f"{len(rows)} row{'' if len(rows) == 1 else 's'}: {', '.join(kinds)}"


def plot_train(plt, data, where):
    rows = data if isinstance(data, list) else [data]
    steps = [r for r in rows if isinstance(r, dict) and r.get("type") == "step"]
    evals = [r for r in rows if isinstance(r, dict) and r.get("type") == "eval"]
    if not steps and not evals:
        raise PlotError(f"{where}: got {describe_rows(rows)}; a train plot needs the "
                        f"{{\"type\": \"step\"}} or {{\"type\": \"eval\"}} rows of "
                        f"`fusiontrain train --json` (plot.py plots {', '.join(KINDS)})")
    figure, axes = plt.subplots(figsize=(6.0, 4.2))
    if steps:
        axes.plot([number(r, "step", where) for r in steps],
                  [number(r, "loss", where) for r in steps], color="#4C72B0", linewidth=1,
                  label="training loss")
    if evals:
        axes.plot([number(r, "step", where) for r in evals],
                  [number(r, "loss", where) for r in evals], "o-", color="#DD8452",
                  label="validation loss")
    summary = next((r for r in rows if isinstance(r, dict) and r.get("type") == "summary"), {})
    title = "training"
    if "ms_per_step" in summary:
        title += f": {summary.get('world_size', 1)} rank(s), {summary['ms_per_step']:.1f} ms/step"
    axes.set_title(title, fontsize=9)
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy loss")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    return figure


def plot_simulate(plt, data, where):
    predictions = need_list(data, "predictions", where)
    series = {}
    for p in predictions:
        name = (f"bucketing {'on' if need(p, 'bucketing', where) else 'off'}, "
                f"overlap {'on' if need(p, 'overlap', where) else 'off'}")
        series.setdefault(name, []).append(p)
    figure, (left, right) = plt.subplots(1, 2, figsize=(10.4, 4.2))
    for name, points in series.items():
        points.sort(key=lambda p: number(p, "ranks", where))
        ranks = [number(p, "ranks", where) for p in points]
        left.plot(ranks, [100.0 * number(p, "efficiency", where) for p in points], "o-",
                  label=name)
        right.plot(ranks, [number(p, "iteration_ms", where) for p in points], "o-", label=name)
    all_ranks = sorted({number(p, "ranks", where) for p in predictions})
    for axes in (left, right):
        axes.set_xscale("log", base=2)
        axes.set_xticks(all_ranks)
        axes.set_xticklabels([f"{r:g}" for r in all_ranks])
        axes.set_xlabel("ranks")
        axes.grid(True, alpha=0.3)
    left.set_ylabel("predicted scaling efficiency (%)")
    left.set_ylim(0, 105)
    right.set_ylabel("predicted iteration time (ms)")
    times = [number(p, "iteration_ms", where) for p in predictions]
    if min(times) > 0 and max(times) / min(times) > 20:  # thousands of ranks dwarf the rest
        right.set_yscale("log")
    else:
        right.set_ylim(bottom=0)
    link = data.get("link") or {}
    figure.suptitle(f"simulate: link {link.get('name', '?')} (alpha {link.get('alpha_us', '?')} us, "
                    f"beta {link.get('beta_gbytes_per_s', '?')} GB/s), compute scale "
                    f"{data.get('compute_scale', 1)}", fontsize=9)
    left.legend(fontsize=8)
    figure.tight_layout()
    return figure


def point_label(point):
    for key in ("label", "variant", "name"):
        if key in point:
            return str(point[key])
    if "key" in point and "value" in point:
        return f"{point['key']}={point['value']}"
    return "?"


def plot_tune(plt, data, where):
    points = data.get("points") or data.get("measurements")
    if not isinstance(points, list) or not points:
        raise PlotError(f"{where}: 'points' must be a non-empty list")
    labels = [point_label(p) for p in points]
    medians, errors = whiskers(points, where)
    winner = data.get("winner")
    if isinstance(winner, dict):  # tune --json: {overrides, median_ms}; the point that has both
        same = [i for i, p in enumerate(points) if p.get("overrides") == winner.get("overrides")
                and p.get("median_ms") == winner.get("median_ms")]
        winner = labels[same[-1]] if same else None
    # Green: the winner; light green: a point that was kept as the best so far.
    colours = ["#55A868" if label == winner else "#B6DCB6" if p.get("kept") else "#4C72B0"
               for label, p in zip(labels, points)]
    figure, axes = plt.subplots(figsize=(max(6.0, 0.45 * len(labels)), 4.6))
    positions = range(len(labels))
    axes.bar(positions, medians, color=colours)
    axes.errorbar(positions, medians, yerr=errors, fmt="none", color="black", capsize=3)
    stages = [str(p.get("stage", "")) for p in points]
    top = max(m + e for m, e in zip(medians, errors[1]))
    start = 0
    for position in range(1, len(points) + 1):
        if position == len(points) or stages[position] != stages[start]:
            if position < len(points):
                axes.axvline(position - 0.5, color="grey", linestyle=":")
            axes.text((start + position - 1) / 2, top * 1.02, stages[start], ha="center",
                      fontsize=8, color="grey")
            start = position
    axes.set_ylim(0, top * 1.12)
    axes.set_xticks(list(positions))
    axes.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    axes.set_ylabel("iteration time (ms), p10-p90")
    axes.set_title("tune: every point measured" + (f", winner {winner} (green)" if winner else "")
                   + ("; light green: kept" if any(p.get("kept") for p in points) else ""),
                   fontsize=9)
    figure.tight_layout()
    return figure


PLOTTERS = {"bench": plot_bench, "sweep": plot_sweep, "bandwidth": plot_bandwidth,
            "train": plot_train, "simulate": plot_simulate, "tune": plot_tune}


def parse_args(argv):
    parser = argparse.ArgumentParser(
        usage="plot.py [KIND] INPUT [-o OUT.png]",
        description="Plot the JSON of fusiontrain bench, bandwidth, train, simulate and tune.",
        epilog="KIND is detected from the JSON when omitted.")
    parser.add_argument("args", nargs="+", metavar="[KIND] INPUT",
                        help=f"optional kind ({', '.join(KINDS)}) then the JSON file")
    parser.add_argument("-o", "--output", help="PNG to write (default: INPUT with .png)")
    parsed = parser.parse_args(argv)
    if len(parsed.args) == 1:
        parsed.kind, parsed.input = None, parsed.args[0]
    elif len(parsed.args) == 2 and parsed.args[0] in KINDS:
        parsed.kind, parsed.input = parsed.args
    else:
        parser.error(f"expected [KIND] INPUT with KIND one of {', '.join(KINDS)}, "
                     f"got {' '.join(parsed.args)}")
    return parsed


def main(argv):
    args = parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"plot.py: matplotlib is not installed for {sys.executable}; scripts/bootstrap.sh "
              "installs python3-matplotlib for /usr/bin/python3", file=sys.stderr)
        return 2
    output = args.output or os.path.splitext(args.input)[0] + ".png"
    try:
        data = load_json(args.input)
        kind = args.kind or detect_kind(data, args.input)
        figure = PLOTTERS[kind](plt, data, args.input)
        figure.savefig(output, dpi=DPI, bbox_inches="tight")
        plt.close(figure)
    except PlotError as error:
        print(f"plot.py: {error}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        print(f"plot.py: {args.input}: not the JSON of `fusiontrain {args.kind or '?'}`: "
              f"{type(error).__name__}: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"plot.py: cannot write {output}: {error}", file=sys.stderr)
        return 2
    print(f"plot.py: {kind} -> {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
