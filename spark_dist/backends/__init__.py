"""Training backends: how ranks talk. Each is a small class behind :class:`~.base.Backend`, imported only
when chosen."""
from .base import Backend, get_backend

__all__ = ["Backend", "get_backend"]
