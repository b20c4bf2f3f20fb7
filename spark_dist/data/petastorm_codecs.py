"""The rank side of a Petastorm dataset's codecs: the binary columns a Unischema codec wrote, decoded per batch.

No Spark and no Petastorm here: a rank unpickles the handle's :class:`CodecColumn` and decodes with numpy, and
OpenCV or Pillow for images. The loader's variable-size path (:mod:`.variable_size`) gathers such a column's
bytes like any binary column's, into the same rows and order as the batch's numbers, and hands each batch's
bytes to :meth:`CodecColumn.decoded_batch`: decoding runs in the loader's background thread, a batch at a time.

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
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from .handle import ColumnInfo, DatasetError

IMAGE, NDARRAY, COMPRESSED_NDARRAY = "image", "ndarray", "compressed_ndarray"
CODECS = (IMAGE, NDARRAY, COMPRESSED_NDARRAY)

_cv2 = None  # OpenCV's module once looked for (False: not installed)


@dataclass(frozen=True)
class CodecColumn(ColumnInfo):
    """A ``binary`` column of a Petastorm dataset that a Unischema codec wrote, decoded per batch.

    ``codec``: :data:`IMAGE`, :data:`NDARRAY` or :data:`COMPRESSED_NDARRAY`; ``value_dtype`` and
    ``value_shape``: the Unischema field's numpy dtype and shape (``None`` for a dimension of any size);
    ``codec_name``: the codec as Petastorm writes it (``CompressedImageCodec('png', 80)``), for messages.
    """

    codec: str = NDARRAY
    value_dtype: str = "float64"
    value_shape: Optional[Tuple[Optional[int], ...]] = None
    codec_name: str = ""

    @property
    def shape(self) -> Optional[Tuple[int, ...]]:
        """Each row's shape where the Unischema gives one (no ``None`` in it), else ``None``."""
        return fixed_shape(self.value_shape)

    def decoded_batch(self, part, pin: bool) -> Dict:
        """``{name: values}`` for a batch's rows of this column (a pyarrow binary array): one tensor
        ``[rows, *shape]`` where the field has one shape, else a list with one tensor a row.

        Raises:
            DatasetError: a row that does not decode (the message names the column and codec), or one of
                another shape than the Unischema's.
        """
        arrays = [self._decoded(value) for value in part.to_pylist()]
        shape = self.shape
        if shape is not None:
            for a in arrays:
                if a.shape != shape:
                    raise DatasetError(f"column {self.name!r} ({self.codec_name}): a row decodes to shape {a.shape}, "
                                       f"not the Unischema's {shape}", None, self.name)
            stacked = np.stack(arrays) if arrays else np.empty((0,) + shape, dtype=self.value_dtype)
            return {self.name: _tensor(stacked, pin)}
        return {self.name: [_tensor(a, pin) for a in arrays]}

    def _decoded(self, value: bytes) -> np.ndarray:
        try:
            return decode(self.codec, value)
        except Exception as exc:  # noqa: BLE001 -- any decoder's error, named with the column and codec
            raise DatasetError(f"column {self.name!r} ({self.codec_name}): a row could not be decoded: "
                               f"{type(exc).__name__}: {exc}", None, self.name) from exc


def fixed_shape(shape) -> Optional[Tuple[int, ...]]:
    """``shape`` as a tuple of ints where every dimension is known, else ``None``."""
    if shape is None or any(not isinstance(n, (int, np.integer)) for n in shape):
        return None
    return tuple(int(n) for n in shape)


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


def opencv():
    """OpenCV's ``cv2`` module where it is installed, else ``None`` (looked for once)."""
    global _cv2
    if _cv2 is None:
        try:
            import cv2
            _cv2 = cv2
        except ImportError:
            _cv2 = False
    return _cv2 or None


def image_decoder() -> Optional[str]:
    """``"opencv"`` or ``"pillow"``: what decodes images in this process; ``None`` where neither is installed."""
    if opencv() is not None:
        return "opencv"
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        return None
    return "pillow"


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


__all__: List[str] = ["CodecColumn", "IMAGE", "NDARRAY", "COMPRESSED_NDARRAY", "decode", "decode_image",
                      "image_decoder"]
