"""The fault campaign, long (``make soak SEED=<n> FAULTS=<n>``): faults drawn from the seed against the DDP
workload on ``local[2]`` (tests/chaos: the kinds, the workload and the invariants, as the suite's fixed-seed run
uses them), then the figures BENCHMARKS.md shows: runs, faults by kind, runs that ended as documented, the
invariants broken (each with the seed and the fault that reproduce it), the seconds from a fault to the next
training step (p50, p95) beside a fault-free run's time, and the campaign's goodput: a fault-free run's time for
each run that succeeded, over the wall time of all runs. Exits 1 when an invariant was broken.

``--cluster two_hosts`` (root): the two-host cluster of tests/two_hosts.py (a worker in each of two network
namespaces), a rank or its Python worker killed and the host kinds (a link down for seconds, a host frozen for
seconds, and against the elastic workload a link down for good); otherwise as ``--cluster standalone``.

``--cluster connect`` (Spark 4 line): the DDP workload through a Spark Connect client, its server in front of
``local[2]`` started here; a rank or its Python worker killed, the client interrupted (the store in the first
task, the reports at the job's end). On the 3.5 line, whose wheel has no Connect server, it says so and exits 0.

``--cluster standalone``: the standalone kinds instead (an executor JVM killed, a worker decommissioned, and the
elastic workload with its executor killed; tests/chaos/faults.py), on a standalone cluster of two workers of one
core that this script starts itself, as tests/clusters.py starts the suite's (``StandaloneCluster``: loopback
only, decommission on in the workers' and the app's conf), and stops at the end with every process it started,
which it then checks (processes carrying this run's marker, as the suite's leak check finds them). Its figures
add, per kind, the seconds until the cluster was whole again after a run (p50, p95), and its runs use the suite's
standalone workload length (``--epochs``, ``--step-s``).
"""
import argparse
import os
import statistics
import sys
import tempfile
import uuid

from _cluster import save  # sets the loopback address and puts tests/ on the path

from chaos import faults, workload  # noqa: E402 -- from tests/
from chaos.campaign import Campaign, schedule  # noqa: E402

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")


def percentile(values, q):
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def figures(campaign, final, cluster="local"):
    by_kind = {}
    for r in campaign.records:
        k = by_kind.setdefault(r.fault.label, {"drawn": 0, "fired": 0, "documented": 0, "recovery": [],
                                               "whole": []})
        k["drawn"] += 1
        k["fired"] += r.fault.fired_at is not None
        k["documented"] += not r.violations
        if r.recovery is not None:
            k["recovery"].append(r.recovery)
        if r.whole_after is not None:
            k["whole"].append(r.whole_after)
    for k in by_kind.values():
        recovery, whole = k.pop("recovery"), k.pop("whole")
        k["recovery_p50"], k["recovery_p95"] = percentile(recovery, 0.5), percentile(recovery, 0.95)
        if cluster != "local":
            k["whole_again_p50"], k["whole_again_p95"] = percentile(whole, 0.5), percentile(whole, 0.95)
    runs = len(campaign.records)
    succeeded = [r for r in campaign.records if r.ending.startswith("success")]
    wall = sum(r.wall for r in campaign.records)
    result = {
        "seed": campaign.seed, "runs": runs, "fault_free_seconds": round(campaign.base, 2),
        "fault_free_sharded_seconds": round(campaign.baselines["sharded"][1], 2) if "sharded" in campaign.baselines
        else None,
        "fault_free_study_seconds": round(campaign.baselines["tune"][1], 2) if "tune" in campaign.baselines else None,
        "fault_free_fit_seconds": round(campaign.baselines["estimator"][1], 2) if "estimator" in campaign.baselines
        else None,
        "fired": sum(k["fired"] for k in by_kind.values()),
        "documented_percent": round(100.0 * sum(not r.violations for r in campaign.records) / max(runs, 1), 1),
        "violations": campaign.violations() + final, "by_kind": dict(sorted(by_kind.items())),
        # The fault-free time of each success's workload (the sharded one's is its own), over every run's wall time.
        "goodput": round(sum(campaign.baseline(r.fault)[1] for r in succeeded) / wall, 3) if wall else None,
        "median_wall_seconds": round(statistics.median(r.wall for r in campaign.records), 2) if runs else None,
        # The driver's memory after the two warm-up runs, then after each tenth of the campaign.
        "rss_start_mib": round(campaign.rss_start / 2**20, 1),
        "rss_mib": [r.rss_mib for r in campaign.records[max(runs // 10, 1) - 1::max(runs // 10, 1)]],
    }
    if cluster != "local":
        result.update(cluster=cluster, epochs=campaign.epochs, step_seconds=campaign.step_s,
                      endings={e: sum(r.ending == e for r in campaign.records)
                               for e in sorted({r.ending for r in campaign.records})})
    return result


# On two hosts: a rank or its Python worker lost, as on one host, and the faults of a host.
TWO_HOST_KINDS = ("kill_rank", "kill_worker", *faults.HOST_KINDS)


def session_conf(master, two_hosts=False):
    """The soak's session: loopback only, no UI; on the standalone cluster as the suite's (tests/clusters.py's
    TEST_CONF and its standalone conf: decommission on, so that a decommissioned executor exits)."""
    conf = {"spark.master": master, "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
    if master != "local[2]":
        from clusters import TEST_CONF

        conf.update(TEST_CONF)
        conf.update({"spark.master": master, "spark.decommission.enabled": "true"})
    if two_hosts:  # the driver on the bridge, where both hosts reach it
        from two_hosts import DRIVER_IP

        conf.update({"spark.driver.host": DRIVER_IP, "spark.driver.bindAddress": DRIVER_IP})
    return conf


def start_session(master, app_name, two_hosts=False):
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for key, value in session_conf(master, two_hosts).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def soak(spark, args, kinds, elastic_kinds=(), cluster=None, transform_kinds=(), sharded_kinds=(), tune_kinds=(),
         estimator_kinds=(), horovod_kinds=(), workload_name=None):
    """The campaign's runs, printed as they end; ``(campaign, final violations)``. ``workload_name``: every fault
    against that workload (``connect``) instead of the one it was drawn for."""
    extra = {} if cluster is None else {"cluster": cluster, "epochs": args.epochs, "step_s": args.step_s}
    if args.kinds:  # only these kinds, against whichever workloads run them
        only = set(args.kinds.split(","))
        kinds, elastic_kinds, transform_kinds, sharded_kinds, tune_kinds, estimator_kinds, horovod_kinds = (
            tuple(k for k in group if k in only) for group in (kinds, elastic_kinds, transform_kinds,
                                                               sharded_kinds, tune_kinds, estimator_kinds,
                                                               horovod_kinds))
    with tempfile.TemporaryDirectory(prefix="spark_dist-soak-") as root:
        campaign = Campaign(spark, root, args.seed, **extra)
        drawn = schedule(args.seed, args.faults, kinds, elastic_kinds=elastic_kinds, transform_kinds=transform_kinds,
                         sharded_kinds=sharded_kinds, tune_kinds=tune_kinds, estimator_kinds=estimator_kinds,
                         horovod_kinds=horovod_kinds)
        for index, fault in enumerate(drawn):
            fault.workload = workload_name or fault.workload
            record = campaign.run(index, fault)
            whole = "" if record.whole_after is None else f", whole again after {record.whole_after}s"
            print(f"[soak] {index + 1}/{args.faults} {fault.describe()}: {record.ending} in {record.wall}s{whole}"
                  + (f"\n[soak]   fault: {fault.note}" if fault.note and cluster is not None else "")
                  + "".join(f"\n[soak]   {e}" for e in record.events)
                  + "".join(f"\n[soak]   VIOLATION: {v}" for v in record.violations), flush=True)
        return campaign, campaign.finish()


def run_local(args):
    """Every workload's kinds on ``local[2]``; ``args.workloads``: only those workloads' (``ddp`` the plain one's)."""
    kinds = [k for k in faults.KINDS if os.geteuid() == 0 or k not in faults.ROOT_ONLY]
    by_workload = {"ddp": kinds, "transform": faults.TRANSFORM_KINDS, "sharded": faults.SHARDED_KINDS,
                   "tune": faults.TUNE_KINDS, "estimator": faults.ESTIMATOR_KINDS,
                   "horovodrunner": faults.HOROVOD_KINDS}
    chosen = args.workloads.split(",") if args.workloads else list(by_workload)
    unknown = sorted(set(chosen) - set(by_workload))
    if unknown:
        raise SystemExit(f"--workloads: no workload {', '.join(unknown)} (there are {', '.join(by_workload)})")
    drawn = {name: (by_workload[name] if name in chosen else ()) for name in by_workload}
    spark = start_session("local[2]", "spark_dist soak")
    try:
        return soak(spark, args, drawn["ddp"], transform_kinds=drawn["transform"], sharded_kinds=drawn["sharded"],
                    tune_kinds=drawn["tune"], estimator_kinds=drawn["estimator"],
                    horovod_kinds=drawn["horovodrunner"])
    finally:
        spark.stop()


def run_connect(args):
    """The DDP workload through a Spark Connect client (:data:`faults.CONNECT_KINDS`), its server (in front of
    ``local[2]``) started by this script and stopped at the end; ``None`` on a Spark line without a Connect
    server."""
    from clusters import connect_available

    reason = connect_available()
    if reason:
        print(f"[soak] no Connect soak on this Spark line: {reason}", flush=True)
        return None

    def body(tmp):
        from connect_server import ConnectServer

        server = ConnectServer(tmp, "local[2]")
        try:
            server.start()
            spark = server.session()
            # As after SparkSession.builder.remote(...) in a user's process: functions build Connect columns.
            os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
            return soak(spark, args, faults.CONNECT_KINDS, workload_name="connect")
        finally:
            server.stop()
    return own_processes("spark_dist-soak-connect-", body)


def run_standalone(args, two_hosts=False):
    """The standalone kinds on a cluster of this script's own, stopped at the end. ``two_hosts``: the two-host
    cluster of tests/two_hosts.py instead (root: network namespaces), with the host kinds, the dataset cache on a
    disk both hosts see."""

    def body(tmp):
        from clusters import StandaloneCluster, install_gpu_script, stop_gateway

        if two_hosts:
            from two_hosts import TwoHostCluster

            cluster = TwoHostCluster(tmp, install_gpu_script(tmp))
        else:
            cluster = StandaloneCluster(tmp, install_gpu_script(tmp))
        try:
            cluster.start()
            if two_hosts:
                from spark_dist.data import CACHE_DIR_CONF

                spark = start_session(cluster.master_url, "spark_dist soak (two hosts)", two_hosts=True)
                spark.conf.set(CACHE_DIR_CONF, f"file://{tmp}")
                return soak(spark, args, TWO_HOST_KINDS, faults.ELASTIC_HOST_KINDS, cluster)
            spark = start_session(cluster.master_url, "spark_dist soak (standalone)")
            return soak(spark, args, faults.STANDALONE_KINDS, faults.ELASTIC_KINDS, cluster)
        finally:
            try:
                stop_gateway()
            finally:
                cluster.stop()
    return own_processes("spark_dist-soak-cluster-", body)


def own_processes(prefix, body):
    """``body(tmp)`` (a scratch directory; it stops what it started before it returns), with this script's own
    marker on every process started meanwhile, which the leak check then finds: its ``(campaign, final
    violations)``, a violation more for the processes left (killed now)."""
    from clusters import SESSION_MARKER, describe, wait_for_no_leaks

    # Before any JVM starts: executors' Python workers import tests/chaos (the workload's function is pickled by
    # reference), and every process started from here carries the marker.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [TESTS, os.environ.get("PYTHONPATH", "")] if p)
    marker = os.environ[SESSION_MARKER] = f"soak-{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        try:
            campaign, final = body(tmp)
        finally:
            leaks = wait_for_no_leaks(marker)
            for p in leaks:
                p.kill()
    if leaks:
        final = final + ["processes left after the cluster stopped (killed now):\n" + describe(leaks)]
    return campaign, final


def merged(path, result, args):
    """The soak results at ``path`` with their rows of ``result``'s kinds replaced by ``result``'s, and a note of
    it under ``remeasured`` (the kinds, seed, faults, date and the run's violations, which count as the soak's)."""
    import datetime
    import json

    with open(path) as f:
        kept = json.load(f)
    kept["by_kind"].update(result["by_kind"])
    kept["by_kind"] = dict(sorted(kept["by_kind"].items()))
    kept["violations"] = kept["violations"] + result["violations"]
    kept.setdefault("remeasured", []).append({
        "kinds": sorted(result["by_kind"]), "seed": args.seed, "faults": args.faults,
        "date": datetime.date.today().isoformat(), "documented_percent": result["documented_percent"]})
    return kept


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=int, default=200)
    parser.add_argument("--cluster", choices=("local", "standalone", "two_hosts", "connect"), default="local",
                        help="local[2] and the kinds any session runs (default), a standalone cluster of two "
                             "workers this script starts and stops, and the standalone kinds, (root) the "
                             "two-host cluster of tests/two_hosts.py and the host kinds, or a Spark Connect "
                             "server in front of local[2] (Spark 4 line) and the DDP workload through it")
    parser.add_argument("--epochs", type=int, default=workload.STANDALONE_EPOCHS,
                        help="the workload's epochs (--cluster standalone; the suite's by default)")
    parser.add_argument("--step-s", type=float, default=workload.STANDALONE_STEP_S,
                        help="a training step's extra seconds (--cluster standalone; the suite's by default)")
    parser.add_argument("--workloads", help="local only: a comma-separated list of the workloads to draw faults "
                        "for (ddp, transform, sharded, tune, estimator, horovodrunner; default all)")
    parser.add_argument("--kinds", help="a comma-separated list of the fault kinds to draw (default all)")
    parser.add_argument("--out")
    parser.add_argument("--merge-into", help="a soak's results file: its rows of the kinds this run drew are "
                        "replaced by this run's (the rest stays), and the file says so (re-measured kinds)")
    args = parser.parse_args()
    if args.cluster in ("standalone", "two_hosts"):
        campaign, final = run_standalone(args, two_hosts=args.cluster == "two_hosts")
    elif args.cluster == "connect":
        args.epochs, args.step_s = workload.EPOCHS, workload.STEP_S
        ran = run_connect(args)
        if ran is None:
            return 0
        campaign, final = ran
    else:
        args.epochs, args.step_s = workload.EPOCHS, workload.STEP_S
        campaign, final = run_local(args)
    result = figures(campaign, final, args.cluster)
    save(args.out, result)
    if args.merge_into:
        save(args.merge_into, merged(args.merge_into, result, args))
    rerun = (f"bench/bench_chaos.py --cluster {args.cluster} --seed {args.seed} --faults {args.faults} --epochs "
             f"{args.epochs} --step-s {args.step_s}" if args.cluster != "local"
             else f"bench/bench_chaos.py --seed {args.seed} --faults {args.faults} --workloads {args.workloads}"
             if args.workloads else f"make soak SEED={args.seed} FAULTS={args.faults}")
    for line in result["violations"]:
        print(f"[soak] {line}\n[soak]   reproduce: {rerun}", flush=True)
    print(f"[soak] {result['runs']} runs, {result['fired']} faults fired, {result['documented_percent']}% ended as "
          f"documented, {len(result['violations'])} violations, goodput {result['goodput']}", flush=True)
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
