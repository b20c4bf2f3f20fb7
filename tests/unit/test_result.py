"""Rank 0's return value on its way to the driver (spark_dist.task.result): tensors to the CPU, the size bound named."""
import pickle

import pytest
import torch

from spark_dist import ConfigError
from spark_dist.config import RunConfig
from spark_dist.task.result import ResultTooLargeError, encode_result, parse_size

from fake_cuda import cuda_state_dict


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
