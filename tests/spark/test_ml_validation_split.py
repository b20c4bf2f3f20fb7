"""TorchEstimator's validationFraction: every row in exactly one half, however the source changes between reads.

The fit writes the training rows and the validation rows as two caches, by two Spark jobs that each read the
source again; here the source moves its rows to other partitions between the two reads.
"""
from pyspark.sql import functions as F

from spark_dist.ml import inputs

ROWS = 300


def _shifted(i, offset_path):
    """Row ``i``'s value as of now: ``(i + offset) % ROWS``, the offset read from a file the test rewrites."""
    with open(offset_path) as f:
        return (i + int(f.read())) % ROWS


def _moving_source(spark, offset_path):
    """The values 0..ROWS-1, every read; which partition (and place in it) holds each value depends on the offset
    file. A vector feature column, as the estimator's DataFrames often have, and a label."""
    from pyspark.ml.functions import array_to_vector

    value = F.udf(_shifted, "long")(F.col("id"), F.lit(str(offset_path)))
    return (spark.range(0, ROWS, numPartitions=3).select(value.alias("v"))
            .select(array_to_vector(F.array(F.col("v").cast("double"))).alias("features"),
                    (F.col("v") % 3).alias("label")))


def _values(df):
    return sorted(int(row.features[0]) for row in df.collect())


def test_every_row_lands_in_one_half_when_the_source_changes_between_the_two_writes(spark_local, tmp_path):
    offset = tmp_path / "offset"
    offset.write_text("0")
    halves = inputs.split_by_content(_moving_source(spark_local, offset), 0.3, seed=7)
    train = _values(halves["train"])   # the first cache write's read
    offset.write_text(str(ROWS // 2))  # every value now comes from another partition
    val = _values(halves["val"])       # the second write's read
    assert not set(train) & set(val)
    assert sorted(train + val) == list(range(ROWS))
    assert 0.2 * ROWS < len(val) < 0.4 * ROWS


def test_the_same_seed_holds_out_the_same_rows(spark_local, tmp_path):
    offset = tmp_path / "offset"
    offset.write_text("0")
    df = _moving_source(spark_local, offset)
    first = _values(inputs.split_by_content(df, 0.3, seed=7)["val"])
    offset.write_text("1")
    assert _values(inputs.split_by_content(df, 0.3, seed=7)["val"]) == first
    assert _values(inputs.split_by_content(df, 0.3, seed=8)["val"]) != first
