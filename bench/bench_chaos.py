"""The fault campaign, long (``make soak SEED=<n> FAULTS=<n>``): faults drawn from the seed against the DDP
workload on ``local[2]`` (tests/chaos: the kinds, the workload and the invariants, as the suite's fixed-seed run
uses them), then the figures BENCHMARKS.md shows: runs, faults by kind, runs that ended as documented, the
invariants broken (each with the seed and the fault that reproduce it), the seconds from a fault to the next
training step (p50, p95) beside a fault-free run's time, and the campaign's goodput: a fault-free run's time for
each run that succeeded, over the wall time of all runs. Exits 1 when an invariant was broken.
"""
import argparse
import os
import statistics
import sys
import tempfile

from _cluster import save  # sets the loopback address and puts tests/ on the path

from chaos import faults  # noqa: E402 -- from tests/
from chaos.campaign import Campaign, schedule  # noqa: E402


def percentile(values, q):
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def figures(campaign, final):
    by_kind = {}
    for r in campaign.records:
        k = by_kind.setdefault(r.fault.kind, {"drawn": 0, "fired": 0, "documented": 0, "recovery": []})
        k["drawn"] += 1
        k["fired"] += r.fault.fired_at is not None
        k["documented"] += not r.violations
        if r.recovery is not None:
            k["recovery"].append(r.recovery)
    for k in by_kind.values():
        recovery = k.pop("recovery")
        k["recovery_p50"], k["recovery_p95"] = percentile(recovery, 0.5), percentile(recovery, 0.95)
    runs = len(campaign.records)
    succeeded = [r for r in campaign.records if r.ending.startswith("success")]
    wall = sum(r.wall for r in campaign.records)
    return {
        "seed": campaign.seed, "runs": runs, "fault_free_seconds": round(campaign.base, 2),
        "fired": sum(k["fired"] for k in by_kind.values()),
        "documented_percent": round(100.0 * sum(not r.violations for r in campaign.records) / max(runs, 1), 1),
        "violations": campaign.violations() + final, "by_kind": dict(sorted(by_kind.items())),
        "goodput": round(len(succeeded) * campaign.base / wall, 3) if wall else None,
        "median_wall_seconds": round(statistics.median(r.wall for r in campaign.records), 2) if runs else None,
        # The driver's memory after the two warm-up runs, then after each tenth of the campaign.
        "rss_start_mib": round(campaign.rss_start / 2**20, 1),
        "rss_mib": [r.rss_mib for r in campaign.records[max(runs // 10, 1) - 1::max(runs // 10, 1)]],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=int, default=200)
    parser.add_argument("--out")
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    kinds = [k for k in faults.KINDS if os.geteuid() == 0 or k not in faults.ROOT_ONLY]
    spark = (SparkSession.builder.master("local[2]").appName("spark_dist soak")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with tempfile.TemporaryDirectory(prefix="spark_dist-soak-") as root:
            campaign = Campaign(spark, root, args.seed)
            for index, fault in enumerate(schedule(args.seed, args.faults, kinds)):
                record = campaign.run(index, fault)
                print(f"[soak] {index + 1}/{args.faults} {fault.describe()}: {record.ending} in {record.wall}s"
                      + "".join(f"\n[soak]   VIOLATION: {v}" for v in record.violations), flush=True)
            final = campaign.finish()
    finally:
        spark.stop()
    result = figures(campaign, final)
    save(args.out, result)
    for line in result["violations"]:
        print(f"[soak] {line}\n[soak]   reproduce: make soak SEED={args.seed} FAULTS={args.faults}", flush=True)
    print(f"[soak] {result['runs']} runs, {result['fired']} faults fired, {result['documented_percent']}% ended as "
          f"documented, {len(result['violations'])} violations, goodput {result['goodput']}", flush=True)
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
