"""Rank 0's result: tensors come back on the CPU; one over spark.driver.maxResultSize is refused by name."""
import pickle

import pytest
import torch

from spark_dist import ConfigError, Distributor, TrainingFailedError
from spark_dist.config import RunConfig
from spark_dist.task.result import ResultTooLargeError, encode_result, parse_size

from fake_cuda import cuda_state_dict


def return_cuda_state_dict():
    from spark_dist import get_context

    return cuda_state_dict() if get_context().rank == 0 else None


def test_rank_0s_cuda_state_dict_reaches_a_cpu_driver(spark_local):
    out = Distributor(num_processes=2, verbose=False).run(return_cuda_state_dict)
    assert out["bias"].equal(torch.ones(2)) and out["weight"].device.type == "cpu"


def return_80_mib():
    import torch

    from spark_dist import get_context

    return torch.zeros(20 << 20) if get_context().rank == 0 else None


def test_a_result_over_max_result_size_fails_once_by_name(spark_local):
    # The test session's spark.driver.maxResultSize is 64m (tests/clusters.py).
    with pytest.raises(TrainingFailedError) as info:
        Distributor(num_processes=2, max_retries=2, verbose=False).run(return_80_mib)
    assert info.value.attempts == 1 and info.value.rank == 0  # not retried: it would fail again
    assert info.value.exc_type == "spark_dist.task.result.ResultTooLargeError"
    assert "spark.driver.maxResultSize" in str(info.value)
