"""The UDF's body in the Python worker: the cached predict function over each Arrow batch, ``batch_size`` rows
at a time, PySpark's dispatch (one input per column, or one input for all) and its error messages."""
from __future__ import annotations

import inspect
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from . import batches, cache, results

TENSORS_HINT = (" (spark_dist: give None as a column's shape, in a list or by leaving it out of a dict, to pass "
                "its rows as they are: one numpy array per row, of any length)")


@dataclass
class UdfSpec:
    """What the UDF carries to the workers (pickled with it)."""
    make_predict_fn: Callable[[], Callable]
    return_type: Any  # a DataType once the UDF is made
    batch_size: int
    input_tensor_shapes: Any
    key: str  # one per predict_batch_udf call: the model cache's key
    key_suffix: Optional[Callable[[], str]] = None  # called in the worker: what else the cached model depends on


def expected_inputs(predict_fn: Callable) -> int:
    """How many arrays the predict function takes: its parameters, as PySpark counts them."""
    return len(inspect.signature(predict_fn).parameters)


def predict_batches(spec: UdfSpec, data: Iterator[Any], arrow_type=None) -> Iterator[Any]:
    """The UDF's output for each Arrow batch of its input, one pandas object (or, given the ``arrow_type`` of
    ``return_type``, one Arrow array) per ``batch_size`` rows. The input: pandas objects (a Series, a DataFrame
    for a struct argument, or a tuple of them for several arguments), or, with ``arrow_type``, the Arrow arrays.
    The next input batch is read and converted in a thread while the predict function runs.

    Raises:
        ValueError: the inputs do not fit the predict function or ``input_tensor_shapes``, or its output does
            not fit ``return_type`` (PySpark's messages).
    """
    key = spec.key + task_gpu() + (spec.key_suffix() if spec.key_suffix is not None else "")
    predict_fn = cache.get_or_load(key, spec.make_predict_fn)
    expected = expected_inputs(predict_fn)
    shapes = batches.dense_shapes(spec.input_tensor_shapes, expected)
    size = spec.batch_size
    if arrow_type is None:
        convert, output = batches.ArrowBatch.from_pandas, results.to_pandas
    else:
        convert = batches.ArrowBatch.from_arrow

        def output(preds, rows, return_type):
            return results.to_arrow(preds, rows, return_type, arrow_type)
    for batch in prefetched(data, convert):
        if batch.rows == 0:  # nothing to predict (PySpark fails on an empty batch)
            continue
        if batch.has_tensors and not shapes:
            raise ValueError(batches.TENSORS_NEED_SHAPES + TENSORS_HINT)
        columns = batch.width
        for start in range(0, batch.rows, size):
            stop = min(start + size, batch.rows)
            if columns == expected and expected > 1:
                preds = predict_fn(*batch.multiple(start, stop, shapes))
            elif expected == 1:
                preds = predict_fn(batch.single(start, stop, shapes))
            else:
                raise ValueError(f"Model expected {expected} inputs, but received {columns} columns")
            yield output(preds, stop - start, spec.return_type)


def task_gpu() -> str:
    """Make this task's own GPU (``spark.task.resource.gpu.amount``) CUDA's current device, so that a
    ``make_predict_fn`` moving its model to ``"cuda"`` puts it there, and name it for the model cache's key (a
    reused worker may serve tasks holding other GPUs of the executor: each gets the model on its own GPU).
    ``""`` for a task without GPUs (torch is not even imported then) or where CUDA sees none."""
    from pyspark import TaskContext

    from ..spark.resources import cuda_ordinal, task_gpu_addresses

    task = TaskContext.get()
    gpus = task_gpu_addresses(task) if task is not None else []
    if not gpus:
        return ""
    import torch

    if not torch.cuda.is_available():
        return ""
    ordinal = cuda_ordinal(gpus[0])
    torch.cuda.set_device(ordinal)
    return f"@cuda:{ordinal}"


def prefetched(data: Iterator[Any], convert: Callable[[Any], Any]) -> Iterator[Any]:
    """``convert`` of each item of ``data``, the next one read and converted in a thread while the caller works
    on the current one (one ahead at most: memory stays bounded); the thread's error is raised here, in order.
    Reading Spark's input and converting it take the GIL only in part, and a model's forward pass releases it."""
    ahead: "queue.Queue" = queue.Queue(maxsize=1)
    stop = threading.Event()
    done = object()

    def offer(entry) -> bool:
        """Hand ``entry`` to the consumer; False once it stopped (it will take nothing more)."""
        while not stop.is_set():
            try:
                ahead.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    # Every put goes through offer(): the thread ends once the consumer stops, whichever entry it holds.
    def read() -> None:
        try:
            for item in data:
                if not offer((convert(item), None)):
                    return
            offer((done, None))
        except BaseException as exc:  # noqa: BLE001 -- handed to the consumer, raised there
            offer((None, exc))

    reader = threading.Thread(target=read, name="spark_dist-predict-input", daemon=True)
    reader.start()
    try:
        while True:
            item, error = ahead.get()
            if error is not None:
                raise error
            if item is done:
                return
            yield item
    finally:
        stop.set()
