"""Gradient compression for ``allreduce``, ``reducescatter`` and ``DistributedOptimizer``
(``hvd.Compression.none`` and ``hvd.Compression.fp16``, Horovod's two).

A compressor's ``compress`` returns the tensor to send and a context; ``decompress`` takes the reduced tensor
and that context back. Custom compressors with the same two static methods work too.
"""
import torch


class Compressor:
    """Interface for compressing and decompressing a given tensor."""

    @staticmethod
    def compress(tensor):
        """Compresses a tensor and returns it with the context needed to decompress it."""

    @staticmethod
    def decompress(tensor, ctx):
        """Decompress the tensor with the given context."""


class NoneCompressor(Compressor):
    """Sends the tensor as it is (the default)."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (halving the bytes) and casts the result back to the original
    type; other types go as they are. Values beyond float16's range (about 65504) become inf, as in Horovod."""

    @staticmethod
    def compress(tensor):
        compressed = tensor.type(torch.float16) if tensor.dtype.is_floating_point else tensor
        return compressed, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.type(ctx) if ctx.is_floating_point else tensor


class Compression:
    """Optional gradient compression algorithm used during allreduce."""

    none = NoneCompressor  # Do not compress the gradients. This is the default.
    fp16 = FP16Compressor  # Compress all floating point gradients to 16-bit.
