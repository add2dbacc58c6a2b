#!/usr/bin/env python3
"""Draws the peer rounds as a chart: fraction of the same-run roofline per case, kvattn and peers.

Reads the round directories that run_all.sh writes (the same ones summarize.py reads) and saves
a PNG with two panels: decode cases against the DRAM read bandwidth, prefill cases against the
fp32 FMA peak, both measured by the kvattn run itself. kvattn's bar is the median over all its
runs of its `roofline_fraction`; a peer's bar is the median over rounds of kvattn's bytes (decode)
or flops (prefill) for the case / the peer's median time / the roofline of the kvattn run made
just before the peer. Whiskers span the lowest and highest round.
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from summarize import add_roofline_options, collect, is_decode, rooflines_of  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# One colour map per project, shades per variant, so that the bars of one peer read as a family.
FAMILY_MAPS = {"ggml": "Greens", "torch": "Oranges", "vllm": "Purples"}
KVATTN_COLOR = "#1f4e9c"


def family(label):
    for name in FAMILY_MAPS:
        if label.startswith(name):
            return name
    return "kvattn"


def series_colors(labels):
    colors = {"kvattn": KVATTN_COLOR}
    for fam, cmap_name in FAMILY_MAPS.items():
        members = [label for label in labels if family(label) == fam]
        cmap = matplotlib.colormaps[cmap_name]
        for i, label in enumerate(members):
            # From dark to light, never so light that a bar vanishes on white.
            colors[label] = cmap(0.9 - 0.55 * i / max(1, len(members) - 1))
    return colors


def gather(round_dirs, rooflines):
    """case -> label -> list of fractions (kvattn: every run; a peer: one per round)."""
    cases, pairs, kvattn_fractions, errors = collect(round_dirs, rooflines)
    table = {case: {"kvattn": kvattn_fractions.get(case, [])} for case in cases}
    for (case, peer), samples in pairs.items():
        values = [s["p_frac"] for s in samples if s["p_frac"] is not None]
        if values:
            table.setdefault(case, {"kvattn": []})[peer] = values
    return cases, table, errors


def draw_panel(ax, cases, table, labels, colors, title):
    """One group per case, holding only the bars measured for it (packed, kvattn first)."""
    group_width = 0.86
    slots = max(len([label for label in labels if table[c].get(label)]) for c in cases)
    width = group_width / max(1, slots)
    drawn = set()
    for x, case in enumerate(cases):
        present = [label for label in labels if table[case].get(label)]
        left = x - width * len(present) / 2
        for i, label in enumerate(present):
            values = table[case][label]
            mid = statistics.median(values)
            bars = ax.bar(left + width * (i + 0.5), mid, width, color=colors[label],
                          label=None if label in drawn else label,
                          yerr=[[mid - min(values)], [max(values) - mid]], capsize=1.5,
                          error_kw={"elinewidth": 0.6, "ecolor": "#333333"})
            drawn.add(label)
            ax.bar_label(bars, labels=[f"{mid:.2f}"], fontsize=5.5, rotation=90, padding=2)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases, rotation=15, ha="right", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel("fraction of same-run roofline", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(axis="y", linewidth=0.3, alpha=0.6)
    ax.set_axisbelow(True)
    top = max((max(v) for c in cases for v in table[c].values() if v), default=1.0)
    ax.set_ylim(0, top * 1.18)
    ax.axhline(1.0, color="#999999", linewidth=0.6, linestyle="--")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", nargs="+", help="round directories (run_all.sh's OUT/rN)")
    parser.add_argument("-o", "--output", default="peers.png", help="PNG to write")
    parser.add_argument("--title", default="kvattn cpu and its peers, same machine, interleaved",
                        help="chart title")
    parser.add_argument("--dpi", type=int, default=150)
    add_roofline_options(parser)
    args = parser.parse_args()
    rooflines = rooflines_of(args)

    cases, table, errors = gather(args.rounds, rooflines)
    if not cases:
        print("no kvattn runs found in the rounds given", file=sys.stderr)
        return 1
    labels = ["kvattn"] + sorted({label for case in cases for label in table[case]} - {"kvattn"},
                                 key=lambda s: (["ggml", "torch", "vllm"].index(family(s))
                                                if family(s) != "kvattn" else 0, s))
    colors = series_colors(labels)
    decode = [c for c in cases if is_decode(c)]
    prefill = [c for c in cases if not is_decode(c)]
    panels = [(decode, f"decode: bytes moved / time / {rooflines['decode']}"),
              (prefill, f"prefill: flops / time / {rooflines['prefill']}")]
    panels = [(cs, title) for cs, title in panels if cs]

    fig, axes = plt.subplots(1, len(panels), figsize=(15, 5.6), squeeze=False,
                             gridspec_kw={"width_ratios": [max(1, len(cs)) for cs, _ in panels]})
    for ax, (cs, title) in zip(axes[0], panels):
        draw_panel(ax, cs, table, labels, colors, title)
    found = {}
    for ax in axes[0]:
        for h, n in zip(*ax.get_legend_handles_labels()):
            found.setdefault(n, h)
    names = [label for label in labels if label in found]
    handles = [found[n] for n in names]
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 6), fontsize=7,
               frameon=False)
    n_rounds = len(args.rounds)
    fig.suptitle(
        f"{args.title} ({n_rounds} round{'s' if n_rounds != 1 else ''})\n"
        "Rooflines measured by each kvattn run; a peer is scored with kvattn's bytes/flops for "
        "the case against the roofline of the kvattn run made just before it, whatever the "
        "peer's own K/V type\n(bars: median over rounds, kvattn over all its runs; whiskers: "
        "min-max).", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.09, 1, 0.91))
    fig.savefig(args.output, dpi=args.dpi)
    print(f"wrote {args.output}")
    for e in errors:
        print(f"not measured: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
