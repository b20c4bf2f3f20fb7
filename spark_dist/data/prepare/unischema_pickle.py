"""Unpickling the Unischema a Petastorm dataset keeps in its ``_common_metadata``, by an allowlist of exact names.

A pickle can call any function it names, and a dataset's metadata is written by whoever can write the
dataset (a shared HDFS, NFS or ``/dbfs`` path). Petastorm's own ``RestrictedUnpickler`` allows every name of
whole packages, ``builtins`` among them, so ``builtins.eval`` passes it. :class:`UnischemaUnpickler` loads only
the exact ``(module, name)`` pairs of :data:`ALLOWED`: what ``materialize_dataset`` writes in any pickle
protocol (the Unischema and its fields, Petastorm's codecs, the numpy scalar types and dtypes, the PySpark
types a ``ScalarCodec`` holds, ``OrderedDict``, ``Decimal``), and the names older writers used for them
(Python 2's ``copy_reg`` and ``__builtin__``, numpy 1's ``numpy.core``, Petastorm's former package names).
Every other name raises :class:`ForbiddenGlobal` before anything is imported or called.

:class:`ForeignStandIns` is the same allowlist for a second look, made only to name the field whose codec is
not Petastorm's: each name outside the allowlist becomes an inert :class:`Foreign` class, never imported.
"""
from __future__ import annotations

import _compat_pickle
import importlib
import io
import logging
import pickle
from typing import Any, FrozenSet, Tuple

log = logging.getLogger("spark_dist")

_NUMPY_TYPES = ("bool", "bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "intc",
                "uintc", "int_", "uint", "intp", "uintp", "longlong", "ulonglong", "float16", "float32", "float64",
                "longdouble", "complex64", "complex128", "clongdouble", "str_", "bytes_", "object_", "void",
                "datetime64", "timedelta64")
_SPARK_TYPES = ("NullType", "StringType", "CharType", "VarcharType", "BinaryType", "BooleanType", "DateType",
                "TimestampType", "TimestampNTZType", "DecimalType", "DoubleType", "FloatType", "ByteType",
                "IntegerType", "LongType", "ShortType", "ArrayType")
_CODECS = ("CompressedImageCodec", "NdarrayCodec", "CompressedNdarrayCodec", "ScalarCodec")
_BUILTIN_TYPES = ("object", "tuple", "list", "dict", "set", "frozenset", "str", "bytes", "int", "float", "bool",
                  "complex")

# Petastorm's former package names (as its depickle_legacy_package_name_compatible maps them).
_LEGACY_PACKAGES = ("av.experimental.deepdrive.dataset_toolkit", "av.ml.dataset_toolkit")
_LEGACY_MODULES = ("codecs", "unischema", "sequence")
# numpy names an older numpy pickled and this one may lack.
_NUMPY_RENAMED = {"unicode_": "str_", "string_": "bytes_", "bool8": "bool_", "float_": "float64",
                  "complex_": "complex128", "object0": "object_"}

# Exact (module, name) pairs, as Python 3 names them. Types only, and functions that only build a value of
# an allowed type from data: none of them imports, evaluates or opens anything.
ALLOWED: FrozenSet[Tuple[str, str]] = frozenset(
    [("petastorm.unischema", "Unischema"), ("petastorm.unischema", "UnischemaField")]
    + [("petastorm.codecs", name) for name in _CODECS]
    + [("numpy", name) for name in _NUMPY_TYPES + tuple(_NUMPY_RENAMED) + ("dtype", "ndarray")]
    + [(module, name) for module in ("numpy.core.multiarray", "numpy._core.multiarray")
       for name in ("scalar", "_reconstruct")]
    + [("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer")]
    + [("pyspark.sql.types", name) for name in _SPARK_TYPES]
    + [("collections", "OrderedDict"), ("decimal", "Decimal")]
    # Protocols 0 and 1 rebuild an object with copyreg._reconstructor; protocols 0 to 2 write bytes as
    # _codecs.encode(text, "latin1").
    + [("copyreg", "_reconstructor"), ("_codecs", "encode")]
    + [("builtins", name) for name in _BUILTIN_TYPES])


class ForbiddenGlobal(pickle.UnpicklingError):
    """The pickle names ``module.name``, which is not in :data:`ALLOWED`; nothing of it was imported."""

    def __init__(self, module: str, name: str):
        super().__init__(f"{module}.{name} is not among the names a Unischema is made of")
        self.module, self.name = module, name

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.name}"


def canonical(module: str, name: str) -> Tuple[str, str]:
    """``(module, name)`` as Python 3 and today's Petastorm name it: Python 2's names (``copy_reg``,
    ``__builtin__``) mapped as Python's own unpickler maps them, Petastorm's former package names to
    ``petastorm``."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    package, _, leaf = module.rpartition(".")
    if package in _LEGACY_PACKAGES and leaf in _LEGACY_MODULES:
        log.warning("spark_dist: a Unischema names %s, which has moved to petastorm.%s: regenerate the dataset's "
                    "metadata (petastorm-generate-metadata.py)", module, leaf)
        module = f"petastorm.{leaf}"
    return module, name


def _resolve(module: str, name: str) -> Any:
    """The object an allowed pair names: numpy's ``core`` and ``_core`` (numpy 1 and 2) are tried both ways,
    and a numpy type an older numpy named otherwise under its name now."""
    candidates = [(module, name)]
    if module.startswith("numpy.core."):
        candidates.append(("numpy._core." + module[len("numpy.core."):], name))
    elif module.startswith("numpy._core."):
        candidates.append(("numpy.core." + module[len("numpy._core."):], name))
    if module == "numpy" and name in _NUMPY_RENAMED:
        candidates.append((module, _NUMPY_RENAMED[name]))
    missing: Exception = AttributeError(f"{module}.{name}")
    for where, attribute in candidates:
        try:
            return getattr(importlib.import_module(where), attribute)
        except (ImportError, AttributeError) as exc:
            missing = exc
    raise pickle.UnpicklingError(f"{module}.{name} cannot be loaded here: {missing}")


class UnischemaUnpickler(pickle.Unpickler):
    """Loads only the names in :data:`ALLOWED` (after :func:`canonical`).

    Raises (from ``load``):
        ForbiddenGlobal: the pickle names anything else.
        pickle.UnpicklingError: an allowed name this process cannot import, or a broken pickle.
    """

    def find_class(self, module: str, name: str) -> Any:
        module, name = canonical(module, name)
        if (module, name) in ALLOWED:
            return _resolve(module, name)
        raise ForbiddenGlobal(module, name)


class Foreign:
    """Stands for a class a Unischema names outside :data:`ALLOWED`; never imported."""

    qualified = ""


class ForeignStandIns(UnischemaUnpickler):
    """:class:`UnischemaUnpickler` with an inert :class:`Foreign` subclass for each name outside the allowlist:
    the Unischema's shape, for an error message that names the field whose codec is not Petastorm's."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except ForbiddenGlobal as forbidden:
            return type(forbidden.name, (Foreign,), {"__module__": forbidden.module,
                                                     "qualified": forbidden.qualified})


def loads(blob: bytes) -> Any:
    """The object pickled in ``blob``, by :class:`UnischemaUnpickler`.

    Raises:
        ForbiddenGlobal: the pickle names a module or name outside :data:`ALLOWED`.
        pickle.UnpicklingError, EOFError, ValueError, ...: a broken pickle (whatever ``pickle`` raises).
    """
    return UnischemaUnpickler(io.BytesIO(blob)).load()


def loads_with_stand_ins(blob: bytes) -> Any:
    """The object pickled in ``blob``, with :class:`Foreign` stand-ins for the names outside the allowlist;
    ``None`` where it does not unpickle even so (a stand-in called with arguments, a broken pickle)."""
    try:
        return ForeignStandIns(io.BytesIO(blob)).load()
    except Exception:  # noqa: BLE001 -- the caller raises its own error
        return None


__all__ = ["ALLOWED", "ForbiddenGlobal", "Foreign", "UnischemaUnpickler", "ForeignStandIns", "canonical", "loads",
           "loads_with_stand_ins"]
