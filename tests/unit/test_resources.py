"""GPU addresses without Spark (spark_dist.spark.resources, spark_dist.wire.ranks): CUDA indices, the driver's GPUs."""
import pytest

from spark_dist import ConfigError
from spark_dist.wire.ranks import visible_devices


def test_visible_devices_lists_gpus_in_local_rank_order():
    assert visible_devices([["3"], ["1"]]) == "3,1"
    assert visible_devices([["0", "1"], ["2", "3"]]) == "0,1,2,3"


def test_a_spark_gpu_address_maps_to_its_cuda_index_under_cuda_visible_devices(monkeypatch):
    from spark_dist.spark.resources import cuda_ordinal

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cuda_ordinal("3") == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # e.g. YARN gave this container GPUs 2 and 3
    assert (cuda_ordinal("3"), cuda_ordinal("2")) == (1, 0)


def test_driver_gpu_addresses_that_cuda_cannot_name_are_refused(monkeypatch):
    from spark_dist.spark.resources import driver_spark_gpus

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert driver_spark_gpus(["3", "1", "2"], 2) == ["3", "1"]
    with pytest.raises(ConfigError, match=r"\['01'\] are not CUDA device indices.*spark\.driver\.resource\.gpu\."
                                          r"discoveryScript"):
        driver_spark_gpus(["01"], 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4")
    with pytest.raises(ConfigError, match=r"positions in its CUDA_VISIBLE_DEVICES='4', which lists fewer GPUs"):
        driver_spark_gpus(["0", "1"], 2)
