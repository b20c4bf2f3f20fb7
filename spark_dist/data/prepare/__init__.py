"""The driver's room: a run's ``datasets=`` values in, picklable handles out, each DataFrame written once, checked.

Takes: the user's values (DataFrames, Petastorm converters and dataset URLs, handles) and a SparkSession. Gives:
one :class:`~spark_dist.data.handle.DatasetHandle` a dataset (the contract), by one straight path,
:func:`~.pipeline.prepare_datasets`, whose docstring lists its steps: the inputs (:mod:`.petastorm_inputs`, with
:mod:`.unischema_pickle`), the call's hold on its caches (:mod:`.registry`), where they go (:mod:`.location`), the
write (:mod:`.write`), its checks (:mod:`.checks`), the handle. Also here: :func:`clear_cache` and the caches'
lifetime (:mod:`.registry`), whole files for saved models (:mod:`.files`), Petastorm on new pyarrow and numpy
(:mod:`.petastorm_compat`, :mod:`.petastorm_legacy_dataset`). PySpark is imported inside functions only.
Never imports: the rank's room (:mod:`spark_dist.data.read`); what both rooms need is the contract, in
:mod:`spark_dist.data` (``tests/unit/test_layout.py`` checks it, imports inside functions included).
"""
from .location import CACHE_DIR_CONF, remote_hosts
from .pipeline import pass_through, prepare_datasets
from .registry import clear_cache, in_use, not_evicted

__all__ = ["prepare_datasets", "clear_cache", "CACHE_DIR_CONF", "not_evicted", "in_use", "remote_hosts",
           "pass_through"]
