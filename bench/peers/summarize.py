#!/usr/bin/env python3
"""Turns measurement rounds into the side-by-side table of results-<date>.md.

Each round directory holds JSON-lines files: kvattn-*.json (`kvattn bench --json`, one file per
kvattn run, interleaved with the peers) and any number of peer files (torch.json, vllm.json,
ggml.json: objects with name, peer, median_ms, median_cpu_ms). For each case, kvattn's time is
the median of its per-run medians over all rounds; a peer's time is the median of its per-round
medians; the ratio is peer / kvattn (above 1: kvattn is faster).
"""

import argparse
import glob
import json
import os
import statistics


def read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", nargs="+", help="round directories")
    args = parser.parse_args()

    kvattn = {}  # case -> list of (median_ms, median_cpu_ms), one per kvattn run
    peers = {}  # (case, peer) -> list of (median_ms, median_cpu_ms), one per round
    errors = []
    for round_dir in args.rounds:
        for path in sorted(glob.glob(os.path.join(round_dir, "*.json"))):
            is_kvattn = os.path.basename(path).startswith("kvattn-")
            for row in read_lines(path):
                if "error" in row:
                    errors.append(f"{row['name']} {row['peer']}: {row['error']}")
                    continue
                if "name" not in row:
                    continue
                sample = (row["median_ms"], row.get("median_cpu_ms"))
                if is_kvattn:
                    kvattn.setdefault(row["name"], []).append(sample)
                else:
                    peers.setdefault((row["name"], row["peer"]), []).append(sample)

    def med(samples, i):
        values = [s[i] for s in samples if s[i] is not None]
        return statistics.median(values) if values else None

    print("| case | kvattn cpu ms (runs: min..max) | peer | peer ms | peer / kvattn "
          "| kvattn CPU-time ms | peer CPU-time ms |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for case, runs in kvattn.items():
        k_ms, k_cpu = med(runs, 0), med(runs, 1)
        spread = f"{min(r[0] for r in runs):.1f}..{max(r[0] for r in runs):.1f}"
        case_peers = sorted((p, s) for (c, p), s in peers.items() if c == case)
        first = True
        for peer, samples in case_peers:
            p_ms, p_cpu = med(samples, 0), med(samples, 1)
            lead = f"| {case} | {k_ms:.2f} ({len(runs)}: {spread}) " if first else "| | "
            k_cpu_cell = f"{k_cpu:.1f}" if first and k_cpu is not None else ""
            first = False
            cpu_cell = f"{p_cpu:.1f}" if p_cpu is not None else "-"
            print(f"{lead}| {peer} | {p_ms:.2f} | {p_ms / k_ms:.2f} | {k_cpu_cell} | {cpu_cell} |")
        if first:
            print(f"| {case} | {k_ms:.2f} ({len(runs)}: {spread}) | (no peer) | | | {k_cpu:.1f} | |")
    for e in errors:
        print(f"\nnot measured: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
