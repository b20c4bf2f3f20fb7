"""The README's Python snippets, run as written, in order, in one namespace (as a reader pastes them into one
notebook), on the shared local[2] session. What a snippet leaves to its reader is made here first: the data at
the paths it names (under a temporary directory: only the leading "/data/" and "/models/" of its paths are
moved there), and the names it takes as the reader's own (``spark``, ``train_df``, ``cnn``, ...). The Spark
Connect snippet needs a server at the address it names, and is left to tests/spark/test_connect.py.

On the 3.5 line only, as each notebook runs on one line (tests/e2e/test_notebooks.py): the snippets call the
API every other test calls on both lines, and both lines' suites share two cores within a 35-minute budget."""
import os
import re

import numpy as np
import pyspark
import pytest

torch = pytest.importorskip("torch")
from PIL import Image  # noqa: E402

pytestmark = pytest.mark.skipif(not pyspark.__version__.startswith("3.5"),
                                reason="the README's snippets run on the 3.5 line's suite (see the docstring)")
README = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "README.md")
CONNECT = 'remote("sc://'


def python_snippets():
    with open(README) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def readers_data(spark, root):
    """What the snippets read, at the paths they name (under ``root``), and the names they take as given."""
    from sklearn.datasets import load_digits

    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 32)).astype(np.float32)
    rows = [(v.tolist(), int(v[:10].argmax())) for v in x]
    spark.createDataFrame(rows, "features array<float>, label long").write.parquet(f"{root}/data/train")

    digits = load_digits()
    pixel_columns = [f"p{i}" for i in range(64)]
    frame = spark.createDataFrame([(*map(float, p), int(t)) for p, t in zip(digits.data[:400], digits.target)],
                                  pixel_columns + ["label"])
    train_df, test_df = frame.randomSplit([0.8, 0.2], seed=0)

    for i in range(24):  # JPEGs, a folder per class
        label = i % 2
        os.makedirs(f"{root}/data/jpegs/{label}", exist_ok=True)
        Image.new("RGB", (40, 40), (250 * label, 40, 100)).save(f"{root}/data/jpegs/{label}/{i}.jpg")
    incoming = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(f"{root}/data/jpegs")
    incoming.withColumn("label", incoming.length * 0).limit(6).write.parquet(f"{root}/data/incoming")

    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=2), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(4 * 15 * 15, 2))
    os.makedirs(f"{root}/models")
    torch.jit.script(torch.nn.Linear(32, 4)).save(f"{root}/models/mlp.pt")
    df = spark.read.parquet(f"{root}/data/train")
    ds_config = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 0}}
    return dict(spark=spark, pixel_columns=pixel_columns, train_df=train_df, test_df=test_df, cnn=cnn, df=df,
                ds_config=ds_config)


def test_every_python_snippet_of_the_readme_runs_as_written(spark_local, tmp_path):
    snippets = python_snippets()
    assert len(snippets) == 6 and sum(CONNECT in s for s in snippets) == 1
    names = readers_data(spark_local, tmp_path)
    for number, snippet in enumerate(snippets):
        if CONNECT in snippet:
            continue
        code = snippet.replace('"/data/', f'"{tmp_path}/data/').replace('"/models/', f'"{tmp_path}/models/')
        try:
            exec(compile(code, f"README.md python snippet {number + 1}", "exec"), names)
        finally:
            for query in spark_local.streams.active:
                query.processAllAvailable()
                query.stop()
    assert set(names["weights"]) == {"weight", "bias"}  # the function's run: rank 0's state dict
    assert len(names["d"].history_frame()) == 2 * 3  # both ranks' reports, three epochs
    assert sorted(os.listdir(f"{tmp_path}/models/digits")) == ["metadata", "stages"]  # the Pipeline's model
    assert len(names["model"].history) == 5  # the image TorchModel's epochs
    assert spark_local.read.parquet(f"{tmp_path}/data/predictions").count() == 6  # the stream's predictions
    assert [len(r.scores) for r in names["scored"].collect()] == [4] * 1024  # predict_batch_udf's
