"""The contract's Petastorm codecs: which codecs a handle's column can name, and what decodes images here.

The driver reads a Petastorm dataset's Unischema and names each codec column's codec in the handle
(:class:`~.handle.CodecColumn`); the ranks decode that column per batch (:mod:`.read.petastorm_codecs`). Both
ask :func:`image_decoder`: the driver to refuse images nothing could decode before any job, the ranks to
decode them. No Spark and no Petastorm here.
"""
from typing import List, Optional, Tuple

import numpy as np

IMAGE, NDARRAY, COMPRESSED_NDARRAY = "image", "ndarray", "compressed_ndarray"
CODECS = (IMAGE, NDARRAY, COMPRESSED_NDARRAY)

_cv2 = None  # OpenCV's module once looked for (False: not installed)


def fixed_shape(shape) -> Optional[Tuple[int, ...]]:
    """``shape`` as a tuple of ints where every dimension is known, else ``None``."""
    if shape is None or any(not isinstance(n, (int, np.integer)) for n in shape):
        return None
    return tuple(int(n) for n in shape)


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


__all__: List[str] = ["IMAGE", "NDARRAY", "COMPRESSED_NDARRAY", "CODECS", "fixed_shape", "opencv", "image_decoder"]
