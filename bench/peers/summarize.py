#!/usr/bin/env python3
"""Turns measurement rounds into the side-by-side table of results-<date>.md.

A round directory holds JSON-lines files written in this order (load.txt records the order):
kvattn-a.json, a peer file, kvattn-b.json, a peer file, ... Each kvattn file is one
`kvattn bench --json` run; each peer file has objects with name, peer, median_ms, median_cpu_ms.
A peer is compared with the kvattn run made just before it, so that both saw the machine in
the same state. Over rounds, both times are the median of the per-round medians; the ratio is
peer / kvattn (above 1: kvattn is faster), for wall time and for process CPU time.
"""

import argparse
import json
import os
import statistics


def read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def round_order(round_dir):
    """Step names in the order they ran, from load.txt ('HH:MM:SS step load1 load5 load15')."""
    with open(os.path.join(round_dir, "load.txt")) as f:
        return [line.split()[1] for line in f if line.strip()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", nargs="+", help="round directories")
    args = parser.parse_args()

    # (case, peer) -> list of (kvattn ms, kvattn cpu ms, peer ms, peer cpu ms), one per round
    pairs = {}
    cases = []
    errors = []
    for round_dir in args.rounds:
        baseline = None
        for step in round_order(round_dir):
            path = os.path.join(round_dir, f"{step}.json")
            if not os.path.exists(path):
                continue
            rows = read_lines(path)
            if step.startswith("kvattn-"):
                baseline = {r["name"]: r for r in rows}
                for r in rows:
                    if r["name"] not in cases:
                        cases.append(r["name"])
                continue
            for r in rows:
                if "error" in r:
                    errors.append(f"{r['name']} {r['peer']}: {r['error']}")
                elif baseline and r["name"] in baseline:
                    k = baseline[r["name"]]
                    pairs.setdefault((r["name"], r["peer"]), []).append(
                        (k["median_ms"], k.get("median_cpu_ms"), r["median_ms"],
                         r.get("median_cpu_ms")))

    def med(samples, i):
        values = [s[i] for s in samples if s[i] is not None]
        return statistics.median(values) if values else None

    print("| case | peer | kvattn ms | peer ms | peer / kvattn | kvattn CPU ms | peer CPU ms "
          "| CPU peer / kvattn |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for case in cases:
        first = True
        for (c, peer), samples in sorted(pairs.items()):
            if c != case:
                continue
            k_ms, k_cpu, p_ms, p_cpu = (med(samples, i) for i in range(4))
            cpu_ratio = f"{p_cpu / k_cpu:.2f}" if p_cpu and k_cpu else "-"
            print(f"| {case if first else ''} | {peer} | {k_ms:.1f} | {p_ms:.1f} "
                  f"| **{p_ms / k_ms:.2f}** | {k_cpu:.1f} | {p_cpu:.1f} | {cpu_ratio} |")
            first = False
    for e in sorted(set(errors)):
        print(f"\nnot measured: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
