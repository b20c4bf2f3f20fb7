"""What :func:`spark_dist.data.make_loader`'s per-column options mean for each column kind, checked before any
read: ``dtypes``, ``pad``, ``pad_side``, ``ragged`` and ``shapes``. No Spark, no file: the handle says it all."""
from dataclasses import dataclass, field
from numbers import Number
from typing import Dict, FrozenSet, Optional, Sequence, Tuple

from ..handle import (ARRAY, BINARY, NESTED, NUMBER_KINDS, SEQUENCE, STRING, VECTOR, ColumnInfo, DatasetError,
                     DatasetHandle)
from .arrays import default_dtype, torch_dtype

PAD_SIDES = ("right", "left")


@dataclass(frozen=True)
class ColumnOptions:
    """The options, resolved per loaded column.

    ``dtypes``: the torch dtype of each number and sequence column's values. ``shapes``: the number columns a
    batch holds as ``[batch, *shape]`` other than their stored shape (nested columns, and those given in
    ``shapes=``). ``pad``: the padded sequence columns and their pad values; ``ragged``: the sequence columns
    handed out as lists of 1-D tensors; ``left``: pad at the start of each row.
    """

    dtypes: Dict[str, object]
    shapes: Dict[str, Tuple[int, ...]] = field(default_factory=dict)
    pad: Dict[str, Number] = field(default_factory=dict)
    ragged: FrozenSet[str] = frozenset()
    left: bool = False


def check_sizes(rank: int, world_size: int, batch_size: int) -> None:
    """Raises ValueError: ``rank``, ``world_size`` or ``batch_size`` out of range."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} and world_size={world_size}: need 0 <= rank < world_size")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: need batch_size >= 1")


def resolve(handle: DatasetHandle, infos: Sequence[ColumnInfo], dtypes: Optional[Dict], pad, pad_side: str,
            ragged, shapes: Optional[Dict]) -> ColumnOptions:
    """Check ``make_loader``'s options against the loaded columns ``infos`` and resolve them.

    Raises:
        ValueError: ``pad_side`` is neither ``"right"`` nor ``"left"``.
        DatasetError: an option names a column that is not loaded or of a kind it does not apply to (``dtypes``
            a binary or string column; ``pad`` or ``ragged`` a column that is not a sequence; ``shapes`` one that
            is not an array, vector or nested array), a pad value that is not a number, a shape whose size is
            not the column's length, or a padded column ``c`` loaded beside a column named ``c_lengths``.
    """
    if pad_side not in PAD_SIDES:
        raise ValueError(f"pad_side={pad_side!r}: need 'right' (pad after each row's values) or 'left' (before)")
    by_name = {c.name: c for c in infos}
    where = f"dataset {handle.name!r}"

    def loaded(option: str, names, kinds: Tuple[str, ...], what: str):
        for c in names:
            if c not in by_name:
                raise DatasetError(f"{where}: {option} names column {c!r}, which is not loaded; loaded columns: "
                                   f"{', '.join(by_name)}", handle.name, c)
            if by_name[c].kind not in kinds:
                raise DatasetError(f"{where}: {option} names column {c!r}, a {by_name[c].kind} column; {option} "
                                   f"applies to {what}", handle.name, c)

    dtypes = dict(dtypes or {})
    loaded("dtypes", dtypes, NUMBER_KINDS + (SEQUENCE,), "number columns (scalars, arrays, vectors, nested arrays, "
                                                         "sequences), not to binary or string ones")
    resolved = {c.name: (torch_dtype(dtypes[c.name], c.name, handle.name) if c.name in dtypes
                         else default_dtype(c.dtype)) for c in infos if c.kind not in (BINARY, STRING)}
    sequences = [c.name for c in infos if c.kind == SEQUENCE]
    if isinstance(pad, Number) or pad is None:
        pads = {c: 0 if pad is None else pad for c in sequences}
    else:
        pads = dict(pad)
        loaded("pad", pads, (SEQUENCE,), "sequence columns (arrays of numbers whose rows differ in length)")
        for c, value in pads.items():
            if not isinstance(value, Number):
                raise DatasetError(f"{where}: pad[{c!r}] = {value!r} is not a number", handle.name, c)
        pads = {c: pads.get(c, 0) for c in sequences}
    ragged = {ragged} if isinstance(ragged, str) else set(ragged or ())
    loaded("ragged", ragged, (SEQUENCE,), "sequence columns (arrays of numbers whose rows differ in length)")
    both = ragged & set(dict(pad) if isinstance(pad, dict) else ())
    if both:
        raise DatasetError(f"{where}: pad and ragged both name {', '.join(sorted(both))}: a ragged column is not "
                           "padded; name it in one of them", handle.name)
    for c in sequences:
        if c not in ragged and f"{c}_lengths" in by_name:
            raise DatasetError(f"{where}: a batch holds the lengths of the padded column {c!r} as "
                               f"{c + '_lengths'!r}, which is also a loaded column; leave one out (columns=) or "
                               f"ask for {c!r} as a list of tensors (ragged=[{c!r}])", handle.name, c)
    return ColumnOptions(resolved, _shapes(handle, by_name, dict(shapes or {}), loaded),
                         {c: v for c, v in pads.items() if c not in ragged}, frozenset(ragged), pad_side == "left")


def _shapes(handle: DatasetHandle, by_name: Dict[str, ColumnInfo], shapes: Dict, loaded) -> Dict[str, Tuple[int, ...]]:
    """Each number column's shape in a batch (after the batch dimension) where it is not its stored one."""
    loaded("shapes", shapes, (ARRAY, VECTOR, NESTED), "array, vector and nested array columns (a scalar column "
                                                      "holds one number a row)")
    out = {c.name: tuple(c.shape) for c in by_name.values() if c.kind == NESTED}
    for c, shape in shapes.items():
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        size = 1
        for n in shape:
            size *= n if isinstance(n, int) and n > 0 else 0
        if size != by_name[c].length:
            raise DatasetError(f"dataset {handle.name!r}: shapes[{c!r}] = {shape} holds {size} values a row, but the "
                               f"column holds {by_name[c].length} (shape {by_name[c].shape}); give positive sizes "
                               f"whose product is {by_name[c].length}", handle.name, c)
        out[c] = shape
    return {c: s for c, s in out.items() if s != (by_name[c].length,)}

