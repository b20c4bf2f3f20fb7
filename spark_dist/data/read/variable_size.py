"""The rank side of the columns whose rows differ in size: ``binary``, ``string`` and ``sequence`` (arrays of
numbers of varying length), next to the loader's numpy path for the fixed-size numbers (:mod:`.loader`).

A window of such a column is one pyarrow array: its rows are gathered in exactly the order the numpy path
places the window's numbers (the same runs, the same destination of each row), with one pyarrow ``take``,
so a batch's bytes, strings and sequences belong to the same rows as its numbers. A batch then becomes a list
of ``bytes`` or ``str``, a padded tensor and its lengths, or a list of 1-D tensors (:func:`batch_values`).
"""
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..handle import SEQUENCE, CodecColumn, ColumnInfo
from .arrays import list_values, numpy_dtype, to_numpy
from .column_options import ColumnOptions
from .petastorm_codecs import decoded_batch

_UNKNOWN_ROW_BYTES = 1024  # a variable-size column's row where the handle does not say (one made by hand)


def window_order(dest: Optional[np.ndarray], kept: int) -> Optional[np.ndarray]:
    """Where each row of a window (after the ``kept`` rows carried over) comes from among the rows gathered in
    run order, given ``dest``, where the numpy path puts the ``i``-th of them (``None``: in run order)."""
    if dest is None:
        return None
    return np.argsort(dest - kept)  # dest - kept is a permutation: its inverse, so window[j] = gathered[order[j]]


def gather_column(name: str, decoded: Dict, runs, order: Optional[np.ndarray], carry):
    """One variable-size column of a window, as one pyarrow array: ``carry`` (the previous window's rows not
    yet batched, or ``None``), then the rows of ``runs`` placed as :func:`window_order` says.

    ``runs`` are those the numpy path copies, in its order (``(row_group, first, end)``, file order where the
    window is shuffled); ``decoded[row_group]`` is ``(chunk_starts, {column: [chunk, ...]})``.
    """
    import pyarrow as pa

    pieces: List = [] if carry is None else [carry]
    gathered = []
    for group, first, end in runs:
        starts, chunks = decoded[group]
        k = int(np.searchsorted(starts, first, side="right")) - 1
        while first < end:
            stop, base = min(end, int(starts[k + 1])), int(starts[k])
            gathered.append(chunks[name][k].slice(first - base, stop - first))
            first, k = stop, k + 1
    if gathered:
        rows = pa.concat_arrays(gathered) if len(gathered) > 1 else gathered[0]
        pieces.append(rows if order is None else rows.take(pa.array(order)))
    return pa.concat_arrays(pieces) if len(pieces) > 1 else pieces[0]


def row_bytes(columns: Sequence[ColumnInfo]) -> int:
    """The bytes a shuffle window counts for a row of these columns: their average row in the cache."""
    return sum(int(c.row_bytes or _UNKNOWN_ROW_BYTES) for c in columns)


def batch_values(column: ColumnInfo, window, start: int, stop: int, options: ColumnOptions, pin: bool) -> Dict:
    """Rows ``[start, stop)`` of a variable-size column's window, as a batch holds them (``{name: value}``, and
    ``{name}_lengths`` for a padded sequence):

    - binary: a list of ``bytes`` (decoded where a Petastorm codec wrote it, a
      :class:`~spark_dist.data.handle.CodecColumn`: :mod:`.petastorm_codecs`);
      string: a list of ``str``;
    - sequence: a tensor ``[rows, longest]`` of ``options.dtypes[name]``, padded with ``options.pad[name]`` at
      the end of each row (at its start with ``options.left``), and the int64 tensor of the rows' lengths; a
      list of 1-D tensors instead where ``options.ragged`` names it.
    """
    import torch

    part = window.slice(start, stop - start)
    if isinstance(column, CodecColumn):  # a column a Petastorm codec wrote: decoded
        return decoded_batch(column, part, pin)
    if column.kind != SEQUENCE:
        return {column.name: part.to_pylist()}
    torch_dtype, pad, left = options.dtypes[column.name], options.pad.get(column.name, 0), options.left
    offsets = to_numpy(part.offsets)
    lengths = np.diff(offsets).astype(np.int64)
    np_dtype = numpy_dtype(torch_dtype)
    values = np.array(list_values(part), dtype=np_dtype or np.float32)  # a copy: tensors own their memory
    if column.name in options.ragged:
        flat = torch.from_numpy(values)
        flat = flat.to(torch_dtype) if np_dtype is None else flat
        return {column.name: list(torch.split(flat.pin_memory() if pin else flat, lengths.tolist()))}
    longest = int(lengths.max()) if len(lengths) else 0
    padded = np.full((len(lengths), longest), pad, dtype=values.dtype)
    at = np.arange(longest)
    # Row-major order of the mask is the order of the values: each row's values land in its own row.
    padded[at >= longest - lengths[:, None] if left else at < lengths[:, None]] = values
    tensor = torch.from_numpy(padded)
    tensor = tensor.to(torch_dtype) if np_dtype is None else tensor
    lengths_tensor = torch.from_numpy(lengths)
    if pin:
        tensor, lengths_tensor = tensor.pin_memory(), lengths_tensor.pin_memory()
    return {column.name: tensor, f"{column.name}_lengths": lengths_tensor}


def to_device(batch: Dict, device) -> Dict:
    """``batch`` on ``device``: tensors and lists of tensors moved, lists of bytes or strings as they are."""
    import torch

    moved = {}
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            moved[name] = value.to(device, non_blocking=True)
        elif value and isinstance(value[0], torch.Tensor):
            moved[name] = [t.to(device, non_blocking=True) for t in value]
        else:
            moved[name] = value
    return moved
