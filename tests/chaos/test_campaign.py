"""The fault campaign in the suite: every fault kind once, in an order and at times drawn from a fixed seed, against
the DDP workload (a transform worker's kill against the same workload with a transform worker a rank; an
interrupted driver also against FSDP2 with sharded keep-best checkpoints, a lane's Python worker killed under a
tuning study's trial); every run's invariants hold (tests/chaos/campaign.py says which). The kinds of
:data:`faults.KINDS` run on the shared local[2] session; the standalone kinds (:data:`faults.STANDALONE_KINDS`: an
executor JVM killed, a worker decommissioned) and the elastic workload (``min_processes=1``, its executor killed
while its worker is held for seconds: the retry runs on the slot left, then grows back) on the standalone cluster
of two workers, which each run leaves whole (Spark 4 line); the host faults on the two-host cluster (3.5 line); the
DDP workload's Connect faults through a Connect client (Spark 4 line). Each cluster's part runs on one line here,
for the suite's time (at most 4 minutes a line), and on both in a soak; the workload is shorter here than there.
``make soak`` runs them long, with any seed (bench/bench_chaos.py; ``CLUSTER=standalone``, ``two_hosts`` or
``connect`` for the other parts)."""
import os

import pyspark
import pytest

pytest.importorskip("torch")
from chaos import faults, workload  # noqa: E402
from chaos.campaign import Campaign, schedule  # noqa: E402
from chaos.faults import Fault  # noqa: E402

SEED = 20261129
# Faults a soak found an invariant broken by, kept in place of the fixed seed's draw of their kind:
# seed 1, run 45: a frozen rank 1 timed the run out, and the error named rank 0, which only waited for it;
# the sharded workload's driver interrupted, the run_id run again: best_checkpoint named the best of the second
# run's saves, not the better one the first had kept (invariants.kept_the_best).
# seed 1 (soak), run 24: a tuning trial's lane lost in its epoch 1; the retry's reports of the epochs it went over
# again were moved to later steps, and the pruner judged trial 2 on another epoch's value (same_study). (The soak's
# runs are 3 epochs, the suite's 2: 0.6 of these is in epoch 1 as 0.33 of those was.)
REGRESSIONS = {"freeze_rank": Fault("freeze_rank", rank=1, at=0.46),
               "sharded/interrupt_driver": Fault("interrupt_driver", rank=1, at=0.5, workload="sharded"),
               "tune/kill_worker": Fault("kill_worker", rank=1, at=0.6, workload="tune", trial=2)}
# The suite's runs are 2 epochs (the soak's 3), for the suite's time: every fault still lands mid-training.
SUITE_EPOCHS = 2
# The suite's runs of the sharded and tune workloads; the soak draws all of faults.SHARDED_KINDS and TUNE_KINDS.
SHARDED_KINDS, TUNE_KINDS = ("interrupt_driver",), ("kill_worker",)


def _fired_every_kind(campaign, kinds):
    fired = {r.fault.label for r in campaign.records if r.fault.fired_at is not None}
    runs = "\n".join(f"{r.fault.describe()}: {r.ending}, fired {r.fault.fired_at is not None}, {r.wall}s"
                     for r in campaign.records)
    assert fired == set(kinds), f"never fired: {sorted(set(kinds) - fired)}; span {campaign.span:.2f}s\n{runs}"


def test_every_fault_kind_ends_as_documented_and_leaves_the_cluster_whole(spark_local, tmp_path):
    kinds = [k for k in faults.KINDS if os.geteuid() == 0 or k not in faults.ROOT_ONLY]
    # The shared session's workers are warm: no warm-up run.
    campaign = Campaign(spark_local, str(tmp_path), SEED, epochs=SUITE_EPOCHS, warm_up=False)
    drawn = schedule(SEED, 0, kinds, each_once=True, transform_kinds=faults.TRANSFORM_KINDS,
                     sharded_kinds=SHARDED_KINDS, tune_kinds=TUNE_KINDS)
    for index, fault in enumerate(drawn):
        campaign.run(index, REGRESSIONS.get(fault.label, fault))
    found = campaign.violations() + campaign.finish()
    assert not found, "\n".join(found)
    _fired_every_kind(campaign, [*kinds, *(f"transform/{k}" for k in faults.TRANSFORM_KINDS),
                                 *(f"sharded/{k}" for k in SHARDED_KINDS), *(f"tune/{k}" for k in TUNE_KINDS)])


@pytest.mark.skipif(pyspark.__version__.startswith("3.5"),
                    reason="the standalone faults run in the Spark 4 line's suite, the two-host ones in 3.5's; both "
                           "lines in make soak CLUSTER=standalone")
def test_standalone_faults_end_as_documented_and_leave_the_cluster_whole(spark_standalone, standalone_cluster,
                                                                         tmp_path):
    campaign = Campaign(spark_standalone, str(tmp_path), SEED, cluster=standalone_cluster,
                        epochs=workload.STANDALONE_EPOCHS, step_s=workload.STANDALONE_STEP_S, warm_up=False)
    drawn = schedule(SEED, 0, faults.STANDALONE_KINDS, each_once=True, elastic_kinds=faults.ELASTIC_KINDS)
    for index, fault in enumerate(drawn):
        campaign.run(index, fault)
    found = campaign.violations() + campaign.finish()
    assert not found, "\n".join(found)
    _fired_every_kind(campaign, [*faults.STANDALONE_KINDS, *(f"elastic/{k}" for k in faults.ELASTIC_KINDS)])
    # Each fault cost its run what the docs say: the killed executor an attempt (a retry), the decommission a
    # restart after the notice (no retry: checked with every run's invariants), the elastic run a retry, on the one
    # slot left (a resize: its rows were checked, not its weights) unless the worker's replacement came within
    # the elastic retry's wait (elastic.STILL_S), as it may on a loaded machine.
    runs = {r.fault.label: r for r in campaign.records}
    assert runs["kill_executor"].ending != "success (attempt 0)", runs["kill_executor"]
    assert any(e.startswith("preempted") for e in runs["decommission_worker"].events), runs["decommission_worker"]
    assert runs["elastic/kill_executor"].ending != "success (attempt 0)", runs["elastic/kill_executor"]


@pytest.mark.skipif(not pyspark.__version__.startswith("3.5"),
                    reason="the two-host faults run in the 3.5 line's suite (its two-host tests come first); both "
                           "lines in make soak CLUSTER=two_hosts")
def test_host_faults_on_two_hosts_end_as_documented_and_leave_the_cluster_whole(
        spark_two_hosts, spark_manager, tmp_path):
    # One rank on each of two hosts (network namespaces). A host off the network for seconds, or its processes
    # frozen for seconds, is not lost: the run ends with the fault-free weights. A host off the network for good
    # is named lost, and the elastic run goes on on the slots left; brought back, the cluster is whole again.
    from spark_dist.data import CACHE_DIR_CONF

    spark_two_hosts.conf.set(CACHE_DIR_CONF, f"file://{tmp_path}")  # a disk every host sees
    try:
        campaign = Campaign(spark_two_hosts, str(tmp_path), SEED, cluster=spark_manager.hosts_cluster,
                            epochs=workload.STANDALONE_EPOCHS, step_s=workload.STANDALONE_STEP_S, warm_up=False)
        drawn = schedule(SEED, 0, faults.HOST_KINDS, each_once=True, elastic_kinds=faults.ELASTIC_HOST_KINDS)
        for index, fault in enumerate(drawn):
            campaign.run(index, fault)
        found = campaign.violations() + campaign.finish()
    finally:
        spark_two_hosts.conf.unset(CACHE_DIR_CONF)
    assert not found, "\n".join(found)
    _fired_every_kind(campaign, [*faults.HOST_KINDS, *(f"elastic/{k}" for k in faults.ELASTIC_HOST_KINDS)])
    # The lost host cost the run one attempt, no more: Spark was asked to replace the host's executor at once, so
    # the retry's tasks went to the host left, none to the lost executor's free slot (a task that never starts).
    lost = campaign.records[[r.fault.kind for r in campaign.records].index("cut_link")]
    assert lost.ending == "success (attempt 1)", lost


def test_faults_under_spark_connect_end_as_documented(spark_connect, tmp_path):
    # The DDP workload through a Spark Connect client (Spark 4 line): the store in the first task, the reports
    # at the job's end. A killed rank and a killed Python worker are retried; an interrupted client, run again
    # under its run_id, resumes.
    campaign = Campaign(spark_connect, str(tmp_path), SEED, warm_up=False)
    for index, fault in enumerate(schedule(SEED, 0, faults.CONNECT_KINDS, each_once=True)):
        fault.workload = "connect"
        campaign.run(index, fault)
    found = campaign.violations() + campaign.finish()
    assert not found, "\n".join(found)
    _fired_every_kind(campaign, [f"connect/{k}" for k in faults.CONNECT_KINDS])
