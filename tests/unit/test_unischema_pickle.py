"""spark_dist.data.prepare.unischema_pickle: a Unischema pickled in any protocol, by any writer Petastorm still
reads, loads; any name outside the allowlist is refused before it is imported or called. No JVM."""
import pickle
import sys
from decimal import Decimal

import numpy as np
import pytest

import spark_dist  # noqa: F401 -- before Petastorm, as a user's script
from spark_dist.data.prepare import unischema_pickle
from spark_dist.data.prepare.unischema_pickle import ForbiddenGlobal, Foreign, loads, loads_with_stand_ins


@pytest.fixture
def schema(monkeypatch):
    import petastorm.codecs as codecs
    from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField
    from pyspark.sql.types import ArrayType, DecimalType, IntegerType, LongType, StringType

    monkeypatch.setattr(codecs, "OPENCV_AVAILABLE", True)  # CompressedImageCodec asserts it; not needed here
    return Unischema("Example", [
        UnischemaField("id", np.int64, (), ScalarCodec(LongType()), False),
        UnischemaField("image", np.uint8, (8, 6, 3), CompressedImageCodec("png"), False),
        UnischemaField("m", np.float32, (2, 3), NdarrayCodec(), False),
        UnischemaField("v", np.int16, (None,), CompressedNdarrayCodec(), False),
        UnischemaField("price", Decimal, (), ScalarCodec(DecimalType(10, 2)), True),
        UnischemaField("name", np.str_, (), ScalarCodec(StringType()), False),
        UnischemaField("ids", np.int32, (None,), ScalarCodec(ArrayType(IntegerType())), False),
        UnischemaField("flag", np.bool_, (), None, False)])


def described(unischema):
    return [(f.name, f.numpy_dtype, f.shape, str(f.codec), f.nullable) for f in unischema.fields.values()]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_unischema_loads_in_every_protocol(schema, protocol):
    loaded = loads(pickle.dumps(schema, protocol=protocol))
    assert type(loaded) is type(schema) and described(loaded) == described(schema)


def test_older_writers_names_load(schema):
    # numpy 1 named its internals numpy.core and had np.unicode_; Python 2 wrote copy_reg and __builtin__.
    scalar = pickle.dumps(np.float32(1.5), protocol=2).replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert loads(scalar) == np.float32(1.5)
    assert loads(b"cnumpy\nunicode_\n.") is np.str_ and loads(b"cnumpy\nstring_\n.") is np.bytes_
    assert loads(pickle.dumps(np.arange(3), protocol=2)).tolist() == [0, 1, 2]
    zero = pickle.dumps(schema, protocol=0)
    assert b"copy_reg\n_reconstructor" in zero and b"__builtin__\nobject" in zero
    legacy = zero.replace(b"cpetastorm.codecs\n", b"cav.experimental.deepdrive.dataset_toolkit.codecs\n")
    assert described(loads(legacy)) == described(schema)


@pytest.mark.parametrize("module, name", [
    ("builtins", "eval"), ("builtins", "exec"), ("builtins", "__import__"), ("builtins", "getattr"),
    ("builtins", "open"), ("__builtin__", "eval"), ("os", "system"), ("posix", "system"), ("subprocess", "Popen"),
    ("numpy", "load"), ("numpy.testing", "assert_"), ("petastorm.utils", "run_in_subprocess"),
    ("pyspark.sql.types", "_parse_datatype_json_string"), ("collections", "namedtuple"), ("copyreg", "__newobj__"),
    ("av.ml.dataset_toolkit.sequence", "Sequence")])
def test_any_other_name_is_refused_before_it_is_imported(module, name):
    modules = set(sys.modules)
    with pytest.raises(ForbiddenGlobal) as info:
        loads(f"c{module}\n{name}\n(S'x'\ntR.".encode())
    assert info.value.qualified.endswith(f".{name}")
    assert not {"subprocess", "numpy.testing"} & (set(sys.modules) - modules)


def test_the_stand_ins_keep_the_allowlist_and_never_import_the_rest(schema):
    from petastorm.unischema import UnischemaField

    blob = pickle.dumps(schema, protocol=0).replace(b"cpetastorm.codecs\nNdarrayCodec\n", b"cnowhere_codecs\nTheirs\n")
    shaped = loads_with_stand_ins(blob)
    codec = shaped.fields["m"].codec
    assert isinstance(codec, Foreign) and codec.qualified == "nowhere_codecs.Theirs"
    assert "nowhere_codecs" not in sys.modules
    assert isinstance(shaped.fields["id"], UnischemaField)  # allowed names are the real classes
    eval_call = b"cbuiltins\neval\n(S'1 + 1'\ntR."
    assert loads_with_stand_ins(eval_call) is None  # a stand-in called with arguments: no value, nothing run
    assert ("builtins", "eval") not in unischema_pickle.ALLOWED
