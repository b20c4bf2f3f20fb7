"""The rank side of a Petastorm dataset's codecs: the binary columns a Unischema codec wrote, decoded per batch.

No Spark and no Petastorm here: a rank unpickles the handle's :class:`~spark_dist.data.handle.CodecColumn` (the
contract) and decodes with numpy, and OpenCV or Pillow for images. The loader's variable-size path
(:mod:`.variable_size`) gathers such a column's bytes like any binary column's, into the same rows and order as the
batch's numbers, and hands each batch's bytes to :func:`decoded_batch`: decoding runs in the loader's background
thread, a batch at a time.

What a row decodes to is what Petastorm's own reader (``make_reader``) yields for it:

- ``CompressedImageCodec`` (``png``, ``jpeg``, ...): a uint8 array ``[H, W, 3]`` in RGB order (``[H, W]`` for a
  greyscale image). OpenCV decodes it where it is installed, as Petastorm does; else Pillow, which gives the
  same pixels for PNG (lossless) and for JPEG up to the two libraries' decoders.
- ``NdarrayCodec`` / ``CompressedNdarrayCodec``: the array ``np.save`` / ``np.savez_compressed`` wrote, its
  shape and dtype kept.

A batch holds one tensor ``[batch, *shape]`` where the Unischema gives the field one shape (no ``None`` in it),
else a list of tensors, one a row; a dtype torch lacks stays numpy.
"""
import io
from typing import Dict, List

import numpy as np

from ..codecs import CODECS, COMPRESSED_NDARRAY, IMAGE, NDARRAY, opencv
from ..handle import CodecColumn, DatasetError


def decoded_batch(column: CodecColumn, part, pin: bool) -> Dict:
    """``{name: values}`` for a batch's rows of ``column`` (a pyarrow binary array): one tensor
    ``[rows, *shape]`` where the field has one shape, else a list with one tensor a row.

    Raises:
        DatasetError: a row that does not decode (the message names the column and codec), or one of
            another shape than the Unischema's.
    """
    arrays = [_decoded(column, value) for value in part.to_pylist()]
    shape = column.shape
    if shape is not None:
        for a in arrays:
            if a.shape != shape:
                raise DatasetError(f"column {column.name!r} ({column.codec_name}): a row decodes to shape {a.shape}, "
                                   f"not the Unischema's {shape}", None, column.name)
        stacked = np.stack(arrays) if arrays else np.empty((0,) + shape, dtype=column.value_dtype)
        return {column.name: _tensor(stacked, pin)}
    return {column.name: [_tensor(a, pin) for a in arrays]}


def _decoded(column: CodecColumn, value: bytes) -> np.ndarray:
    try:
        return decode(column.codec, value)
    except Exception as exc:  # noqa: BLE001 -- any decoder's error, named with the column and codec
        raise DatasetError(f"column {column.name!r} ({column.codec_name}): a row could not be decoded: "
                           f"{type(exc).__name__}: {exc}", None, column.name) from exc


def decode(codec: str, value: bytes) -> np.ndarray:
    """One row's value, as Petastorm's codec of that name decodes it (see the module's docstring).

    Raises:
        ValueError: an image with other than 1 or 3 channels (as Petastorm's codec), or bytes that are no image;
            an unknown ``codec``.
        ImportError: an image, and neither OpenCV nor Pillow is installed.
        Whatever ``np.load`` raises for bytes that are no saved array.
    """
    if codec == IMAGE:
        return decode_image(value)
    if codec == NDARRAY:
        return np.load(io.BytesIO(value))
    if codec == COMPRESSED_NDARRAY:
        with np.load(io.BytesIO(value)) as saved:
            return saved["arr"]
    raise ValueError(f"unknown codec {codec!r}; known: {', '.join(CODECS)}")


def decode_image(value: bytes) -> np.ndarray:
    """An encoded image as Petastorm's ``CompressedImageCodec.decode`` returns it: ``[H, W, 3]`` RGB or ``[H, W]``.

    Raises:
        ValueError: bytes that are no image, or an image with other than 1 or 3 channels.
        ImportError: neither OpenCV nor Pillow is installed.
    """
    cv2 = opencv()
    if cv2 is not None:
        image = cv2.imdecode(np.frombuffer(value, dtype=np.uint8), cv2.IMREAD_UNCHANGED)
        if image is None:
            raise ValueError("OpenCV cannot decode these bytes as an image")
        image = image[:, :, (2, 1, 0)] if image.ndim == 3 and image.shape[2] == 3 else image  # BGR -> RGB
    else:
        image = _pillow_image(value)
    if image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 3):
        return image
    raise ValueError(f"unexpected image dimensions {image.shape}; supported: (H, W) or (H, W, 3), as Petastorm's "
                     "CompressedImageCodec")


def _pillow_image(value: bytes) -> np.ndarray:
    """The image as OpenCV's ``IMREAD_UNCHANGED`` gives it, in RGB order: palette images as RGB(A), 1-bit ones
    as 0/255 bytes, 16-bit ones as uint16."""
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("decoding a Petastorm CompressedImageCodec column needs OpenCV (opencv-python) or Pillow "
                          "in the ranks' environment") from None
    with Image.open(io.BytesIO(value)) as image:
        if image.mode == "1":
            image = image.convert("L")
        elif image.mode == "P":
            image = image.convert("RGBA" if "transparency" in image.info else "RGB")
        elif image.mode in ("CMYK", "YCbCr", "LAB", "HSV"):
            image = image.convert("RGB")
        array = np.array(image)  # a copy the array owns (np.asarray may give a read-only view of Pillow's bytes)
    if array.dtype == np.int32 and image.mode == "I" and array.size and array.min() >= 0 and array.max() <= 0xFFFF:
        array = array.astype(np.uint16)  # a 16-bit greyscale PNG, which older Pillows open as 32-bit "I"
    return array


def _tensor(array: np.ndarray, pin: bool):
    """``array`` as a tensor that owns writable memory (pinned where asked); left numpy where torch lacks its dtype."""
    import torch

    array = np.ascontiguousarray(array) if array.flags.writeable else np.array(array, order="C")
    try:
        tensor = torch.from_numpy(array)
    except TypeError:
        return array
    return tensor.pin_memory() if pin else tensor


__all__: List[str] = ["decoded_batch", "decode", "decode_image"]
