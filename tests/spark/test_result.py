"""Rank 0's result: tensors come back on the CPU; one over spark.driver.maxResultSize is refused by name."""
import pickle

import pytest
import torch

from spark_dist import ConfigError, Distributor, TrainingFailedError
from spark_dist.config import RunConfig
from spark_dist.task.result import ResultTooLargeError, encode_result, parse_size


class FakeCudaTensor(torch.Tensor):
    """Stands in for a CUDA tensor (no GPU here): says it is on cuda:0 and, pickled as it is, fails to load
    the way a CUDA storage does on a machine without a GPU. Its data really is on the CPU."""

    __torch_function__ = torch._C._disabled_torch_function_impl
    device = property(lambda self: torch.device("cuda", 0))

    def __reduce_ex__(self, protocol):
        return (_load_on_a_machine_without_cuda, ())


def _load_on_a_machine_without_cuda():
    raise RuntimeError("Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False")


def cuda_state_dict():
    weights = torch.arange(6.0).reshape(2, 3)
    return {"weight": FakeCudaTensor(weights), "bias": FakeCudaTensor(torch.ones(2)), "step": 7}


def test_cuda_tensors_come_back_on_the_cpu():
    with pytest.raises(RuntimeError, match="CUDA device"):
        pickle.loads(pickle.dumps(cuda_state_dict()))  # what the driver got before: training lost at the end
    back = pickle.loads(encode_result(cuda_state_dict()))
    assert type(back["weight"]) is torch.Tensor and back["weight"].device.type == "cpu"
    assert back["weight"].equal(torch.arange(6.0).reshape(2, 3)) and back["step"] == 7


def test_a_state_dict_round_trips():
    state = torch.nn.Linear(3, 2).state_dict()
    back = pickle.loads(encode_result({"model": state, "epoch": 4}))
    assert back["epoch"] == 4 and all(back["model"][k].equal(v) for k, v in state.items())


def test_a_result_over_the_bound_names_the_conf_key():
    with pytest.raises(ResultTooLargeError, match=r"spark\.driver\.maxResultSize \(2 MiB\)"):
        encode_result(torch.zeros(1 << 20), max_bytes=2 << 20)  # 4 MiB of floats
    assert encode_result(torch.zeros(1 << 20), max_bytes=0)  # 0: no bound, as in Spark


@pytest.mark.parametrize("text, size", [("1g", 1 << 30), ("512m", 512 << 20), ("64MB", 64 << 20),
                                        ("1024", 1024), ("0", 0), ("1.5k", 1536)])
def test_spark_size_strings(text, size):
    assert parse_size(text) == size


def test_the_bound_comes_from_spark_conf_but_not_in_local_mode():
    assert RunConfig.build(num_processes=1).max_result_bytes == 1 << 30  # Spark's default, 1g
    conf = {"spark.driver.maxResultSize": "2m"}
    assert RunConfig.build(num_processes=1, spark_conf=conf).max_result_bytes == 2 << 20
    assert RunConfig.build(num_processes=1, local_mode=True, spark_conf=conf).max_result_bytes == 0
    with pytest.raises(ConfigError, match="spark.driver.maxResultSize"):
        RunConfig.build(num_processes=1, spark_conf={"spark.driver.maxResultSize": "lots"})


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
