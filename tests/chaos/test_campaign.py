"""The fault campaign in the suite: every fault kind once, in an order and at times drawn from a fixed seed,
against the DDP workload on the shared local[2] session; every run's invariants hold (tests/chaos/campaign.py
says which). ``make soak`` runs it long, with any seed."""
import os

import pytest

pytest.importorskip("torch")
from chaos import faults  # noqa: E402
from chaos.campaign import Campaign, schedule  # noqa: E402
from chaos.faults import Fault  # noqa: E402

SEED = 20261129
# Faults a soak found an invariant broken by, kept in place of the fixed seed's draw of their kind:
# seed 1, run 45: a frozen rank 1 timed the run out, and the error named rank 0, which only waited for it.
REGRESSIONS = {"freeze_rank": Fault("freeze_rank", rank=1, at=0.46)}


def test_every_fault_kind_ends_as_documented_and_leaves_the_cluster_whole(spark_local, tmp_path):
    kinds = [k for k in faults.KINDS if os.geteuid() == 0 or k not in faults.ROOT_ONLY]
    campaign = Campaign(spark_local, str(tmp_path), SEED)
    for index, fault in enumerate(schedule(SEED, 0, kinds, each_once=True)):
        campaign.run(index, REGRESSIONS.get(fault.kind, fault))
    found = campaign.violations() + campaign.finish()
    fired = {r.fault.kind for r in campaign.records if r.fault.fired_at is not None}
    assert not found, "\n".join(found)
    runs = "\n".join(f"{r.fault.describe()}: {r.ending}, fired {r.fault.fired_at is not None}, {r.wall}s"
                     for r in campaign.records)
    assert fired == set(kinds), f"never fired: {sorted(set(kinds) - fired)}; span {campaign.span:.2f}s\n{runs}"
