#!/usr/bin/env python3
"""Paired per-seed differences between two methods of a `fedfuse sweep` results.csv.

For each setting (partition, clients, hidden, round) it pairs method A's and method B's test
accuracy on the same seed (same partition, same local models) and prints the mean difference
A - B with a two-sided 95 % Student-t confidence interval, and how many seeds A won.

    python3 scripts/paired_diff.py DIR/results.csv gpi-fnm pfnm [--round N]

Standard library only (the t quantiles for up to 30 seeds are tabulated below).
"""

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict

# Two-sided 95 % quantiles of Student's t, by degrees of freedom.
T975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
    10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
    18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060,
    26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--round", type=int, default=None, help="only this round (default: every round)")
    args = ap.parse_args()

    acc = defaultdict(dict)  # (partition, clients, hidden, round) -> {(method, seed): accuracy}
    with open(args.results, newline="") as f:
        for row in csv.DictReader(f):
            if args.round is not None and int(row["round"]) != args.round:
                continue
            key = (row["partition"], int(row["clients"]), row["hidden"], int(row["round"]))
            acc[key][(row["method"], int(row["seed"]))] = float(row["accuracy"])

    print(f"{args.a} - {args.b}: mean paired difference [95 % CI], seeds {args.a} ahead / seeds")
    for key in sorted(acc):
        cell = acc[key]
        seeds = sorted({s for (m, s) in cell if m == args.a} & {s for (m, s) in cell if m == args.b})
        if not seeds:
            continue
        d = [cell[(args.a, s)] - cell[(args.b, s)] for s in seeds]
        mean = statistics.fmean(d)
        if len(d) > 1:
            half = T975[min(len(d) - 1, 29)] * statistics.stdev(d) / math.sqrt(len(d))
            ci = f"[{mean - half:+.4f}, {mean + half:+.4f}]"
        else:
            ci = "[one seed]"
        wins = sum(x > 0 for x in d)
        part, clients, hidden, rnd = key
        print(f"{part:>16} J={clients:<3} hidden {hidden:<16} round {rnd:<3} {mean:+.4f} {ci}  {wins}/{len(d)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
