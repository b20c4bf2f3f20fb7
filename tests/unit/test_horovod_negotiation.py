"""Ranks that disagree on a collective (:mod:`spark_dist.horovod.torch.negotiation`): spark_dist's ``horovod.torch``
raises what Horovod 0.28.1 raises, on every rank, in Horovod's words; and the ranks stay in step afterwards.

On the Spark 3.5 line only, as tests/unit/test_horovod_torch_api.py.
"""
import re

import pyspark
import pytest
import torch

from tests.unit.horovod_ranks import error_of, real_horovod_available, run_horovod_ranks

pytestmark = pytest.mark.skipif(not pyspark.__version__.startswith("3.5"),
                                reason="the same torch and Horovod on both lines: run on the 3.5 line's suite")


def mismatches(hvd):
    """Rank r's half of collectives whose ranks disagree; then one they agree on."""
    hvd.init()
    r = hvd.rank()
    seen = {
        "allreduce_shape": error_of(lambda: hvd.allreduce(torch.ones(2 + r))),
        "allreduce_type": error_of(lambda: hvd.allreduce(torch.ones(3, dtype=torch.float32 if r else torch.int32))),
        "allreduce_op": error_of(lambda: hvd.allreduce(torch.ones(3), op=hvd.Sum if r else hvd.Min)),
        "allreduce_factors": error_of(lambda: hvd.allreduce(torch.ones(3), prescale_factor=1.0 + r)),
        "grouped_allreduce_shape": error_of(lambda: hvd.grouped_allreduce([torch.ones(2), torch.ones(2 + r)])),
        "allgather_dim": error_of(lambda: hvd.allgather(torch.ones(2, 1 + r))),
        "allgather_rank": error_of(lambda: hvd.allgather(torch.ones(2, 2) if r else torch.ones(2, 2, 1))),
        "broadcast_root": error_of(lambda: hvd.broadcast(torch.ones(3), r)),
        "broadcast_shape": error_of(lambda: hvd.broadcast(torch.ones(3 + r), 0)),
        "alltoall_dim": error_of(lambda: hvd.alltoall(torch.ones(2, 1 + r))),
        "reducescatter_shape": error_of(lambda: hvd.reducescatter(torch.ones(4 + 2 * r))),
    }
    handle = hvd.allreduce_async(torch.ones(2 + r))
    seen["async_poll"] = hvd.poll(handle)
    seen["async_synchronize"] = error_of(lambda: hvd.synchronize(handle))
    seen["after"] = hvd.allreduce(torch.tensor([1.0 + r]), op=hvd.Sum)
    return seen


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    return run_horovod_ranks("spark_dist", ["127.0.0.1"] * 2, mismatches, tmp_path_factory.mktemp("hvd"))


def test_every_rank_gets_horovods_error_and_the_ranks_stay_in_step(ours):
    for seen in ours:
        assert seen["allreduce_type"] == ("HorovodInternalError", "Mismatched data types: One rank had type int32, "
                                                                  "but another rank had type float32.")
        assert seen["broadcast_root"] == ("HorovodInternalError", "Mismatched BROADCAST root ranks: One rank "
                                                                  "specified root rank 0, but another rank specified "
                                                                  "root rank 1.")
        assert seen["grouped_allreduce_shape"][0] == "HorovodInternalError"
        # an async op's error comes from synchronize, as Horovod's does; poll says it is done
        assert seen["async_poll"] is True and seen["async_synchronize"][0] == "HorovodInternalError"
        assert seen["after"].tolist() == [3.0]
    assert {k: v for k, v in ours[0].items() if k != "after"} == {k: v for k, v in ours[1].items() if k != "after"}


def _either_way(error):
    """Horovod names first the rank whose request reached its coordinator first, spark_dist the lowest rank: the
    message with its two sides in a fixed order."""
    if error is None:
        return None
    kind, message = error
    sides = re.fullmatch(r"(.*)One rank (.*), but another rank (.*)\.", message)
    return (kind, message) if sides is None else (kind, sides[1], tuple(sorted(sides.groups()[1:])))


@pytest.mark.skipif(not real_horovod_available(), reason="no Horovod build installed (make env)")
def test_the_same_errors_as_horovod(ours, tmp_path):
    theirs = run_horovod_ranks("horovod", ["127.0.0.1"] * 2, mismatches, tmp_path)
    for r in range(2):
        assert sorted(ours[r]) == sorted(theirs[r])
        for key in theirs[r]:
            if key == "after":
                assert torch.equal(ours[r][key], theirs[r][key])
            elif key != "async_poll":  # Horovod's may not have answered yet
                assert _either_way(ours[r][key]) == _either_way(theirs[r][key]), key
