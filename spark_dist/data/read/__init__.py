"""The rank's room: a :class:`~spark_dist.data.handle.DatasetHandle` in, this rank's equal share out as torch batches.

Takes: a handle (the contract, :mod:`spark_dist.data.handle`) and the loader's options. Gives:
:func:`make_loader` (:mod:`.factory`), a :class:`~.loader.ShardLoader` or, with a ``transform``, a
:class:`~.transformed_loader.TransformedLoader` (its worker processes: :mod:`.transform_workers`): the epoch
order (:mod:`.epoch_order`), its place in an epoch (:mod:`.loader_state`, :mod:`.dealt_epoch`), the column kinds
as tensors (:mod:`.arrays`, :mod:`.variable_size`, :mod:`.column_options`, Petastorm codecs:
:mod:`.petastorm_codecs`). Reads the files a handle names with pyarrow, nothing else.
Never imports: the driver's room (:mod:`spark_dist.data.prepare`), PySpark or :mod:`spark_dist.spark`: a rank has
no Spark (``tests/unit/test_layout.py`` checks it, imports inside functions included).
"""
from .factory import make_loader
from .loader import ShardLoader

__all__ = ["make_loader", "ShardLoader"]
