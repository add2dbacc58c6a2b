#!/usr/bin/env python3
"""Turns measurement rounds into the side-by-side table of results-<date>.md.

A round directory holds JSON-lines files written in this order (load.txt records the order):
kvattn-a.json, a peer file, kvattn-b.json, a peer file, ... Each kvattn file is one
`kvattn bench --json` run; each peer file has objects with name, peer, median_ms, median_cpu_ms.
A peer is compared with the kvattn run made just before it, so that both saw the machine in
the same state. Over rounds, both times are the median of the per-round medians; the ratio is
peer / kvattn (above 1: kvattn is faster), for wall time and for process CPU time.

With --roofline, two more columns give each side's fraction of the roofline that the kvattn run
just before the peer measured: for decode, kvattn's bytes for the case / time / that run's
dram_gbps; for prefill, kvattn's flops for the case / time / that run's fma_gflops. The peer's
fraction uses kvattn's bytes and flops, i.e. it says how close the peer came to the time the
roofline allows for the case (a peer reading f32 or repeated K/V moves more bytes than that).
"""

import argparse
import json
import os
import statistics
import sys


def read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def round_order(round_dir):
    """Step names in the order they ran, from load.txt ('HH:MM:SS step load1 load5 load15')."""
    with open(os.path.join(round_dir, "load.txt")) as f:
        return [line.split()[1] for line in f if line.strip()]


def is_decode(case):
    return "decode" in case


# The rooflines: fields of a `kvattn bench --json` line, in GB/s and GFLOP/s.
ROOFLINES = {"decode": "dram_gbps", "prefill": "fma_gflops"}


def roofline_fraction(kvattn_row, ms, rooflines=ROOFLINES):
    """Fraction of the roofline of kvattn_row's run that the case's work in `ms` reaches.

    Decode is bounded by memory (kvattn's bytes moved over the same run's DRAM read bandwidth),
    prefill by arithmetic (its flops over the same run's fp32 FMA peak), as `kvattn bench` does;
    `rooflines` names other fields of the run to divide by (say paged_read_gbps).
    """
    if not ms:
        return None
    seconds = ms * 1e-3
    if is_decode(kvattn_row["name"]):
        capacity, work = kvattn_row.get(rooflines["decode"]), kvattn_row.get("bytes")
    else:
        capacity, work = kvattn_row.get(rooflines["prefill"]), kvattn_row.get("flops")
    if not capacity or not work:
        return None
    return work / seconds / 1e9 / capacity


def collect(round_dirs, rooflines=ROOFLINES):
    """Reads rounds. Returns (cases, pairs, kvattn_fractions, errors).

    pairs: (case, peer) -> one dict per round: k_ms, k_cpu, p_ms, p_cpu, k_frac, p_frac (the
    fractions against the roofline of the kvattn run just before the peer).
    kvattn_fractions: case -> roofline fraction of every kvattn run, each against its own run,
    computed exactly as the peers' are (and checked against the run's roofline_fraction when
    the default rooflines are used).
    """
    pairs = {}
    cases = []
    kvattn_fractions = {}
    errors = []
    for round_dir in round_dirs:
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
                    frac = roofline_fraction(r, r.get("median_ms"), rooflines)
                    reported = r.get("roofline_fraction")
                    if (rooflines == ROOFLINES and frac and reported
                            and abs(frac / reported - 1) > 0.02):
                        print(f"warning: {round_dir}/{step} {r['name']}: roofline_fraction "
                              f"{reported} but bytes or flops / median_ms / "
                              f"{rooflines['decode' if is_decode(r['name']) else 'prefill']} "
                              f"gives {frac:.4f}: kvattn bench divides by another roofline; "
                              f"name it with --decode-roofline/--prefill-roofline",
                              file=sys.stderr)
                    if frac is not None:
                        kvattn_fractions.setdefault(r["name"], []).append(frac)
                continue
            for r in rows:
                if "error" in r:
                    errors.append(f"{r['name']} {r['peer']}: {r['error']}")
                elif baseline and r["name"] in baseline:
                    k = baseline[r["name"]]
                    pairs.setdefault((r["name"], r["peer"]), []).append({
                        "k_ms": k["median_ms"], "k_cpu": k.get("median_cpu_ms"),
                        "p_ms": r["median_ms"], "p_cpu": r.get("median_cpu_ms"),
                        "k_frac": roofline_fraction(k, k["median_ms"], rooflines),
                        "p_frac": roofline_fraction(k, r["median_ms"], rooflines),
                    })
    return cases, pairs, kvattn_fractions, sorted(set(errors))


def median_of(samples, key):
    values = [s[key] for s in samples if s[key] is not None]
    return statistics.median(values) if values else None


def add_roofline_options(parser):
    parser.add_argument("--decode-roofline", default=ROOFLINES["decode"],
                        help="field of the kvattn run (GB/s) that decode is measured against")
    parser.add_argument("--prefill-roofline", default=ROOFLINES["prefill"],
                        help="field of the kvattn run (GFLOP/s) that prefill is measured against")


def rooflines_of(args):
    return {"decode": args.decode_roofline, "prefill": args.prefill_roofline}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", nargs="+", help="round directories")
    parser.add_argument("--roofline", action="store_true",
                        help="add each side's fraction of the same-run roofline")
    add_roofline_options(parser)
    args = parser.parse_args()

    cases, pairs, _, errors = collect(args.rounds, rooflines_of(args))

    header = ("| case | peer | kvattn ms | peer ms | peer / kvattn | kvattn CPU ms | peer CPU ms "
              "| CPU peer / kvattn |")
    rule = "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    if args.roofline:
        header += " kvattn roofline | peer roofline |"
        rule += " ---: | ---: |"
    print(header)
    print(rule)
    for case in cases:
        first = True
        for (c, peer), samples in sorted(pairs.items()):
            if c != case:
                continue
            k_ms, k_cpu, p_ms, p_cpu = (median_of(samples, key)
                                        for key in ("k_ms", "k_cpu", "p_ms", "p_cpu"))
            cpu_ratio = f"{p_cpu / k_cpu:.2f}" if p_cpu and k_cpu else "-"
            k_cpu_text = f"{k_cpu:.1f}" if k_cpu is not None else "-"
            p_cpu_text = f"{p_cpu:.1f}" if p_cpu is not None else "-"
            line = (f"| {case if first else ''} | {peer} | {k_ms:.1f} | {p_ms:.1f} "
                    f"| **{p_ms / k_ms:.2f}** | {k_cpu_text} | {p_cpu_text} | {cpu_ratio} |")
            if args.roofline:
                k_frac, p_frac = median_of(samples, "k_frac"), median_of(samples, "p_frac")
                line += (f" {k_frac:.3f} |" if k_frac is not None else " - |")
                line += (f" {p_frac:.3f} |" if p_frac is not None else " - |")
            print(line)
            first = False
    for e in errors:
        print(f"\nnot measured: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
