"""How spark_dist reads a Spark conf value: a boolean, seconds, a count, one of some words, a port range, a
size. Each error names the key to change."""
from __future__ import annotations

from typing import Mapping, Optional, Sequence, Tuple

from .errors import ConfigError


def conf_bool(conf: Mapping[str, str], key: str, default: bool = False) -> bool:
    value = conf.get(key)
    if value is None:
        return default
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"Spark conf {key}={value!r} is not a boolean: use true or false")


def conf_seconds(conf: Mapping[str, str], key: str, default: float) -> float:
    value = conf.get(key)
    if value is None:
        return default
    text = str(value).strip().lower().rstrip("s")
    try:
        seconds = float(text)
    except ValueError:
        raise ConfigError(f"Spark conf {key}={value!r} is not a number of seconds (e.g. 30 or 30s)") from None
    if seconds <= 0:
        raise ConfigError(f"Spark conf {key}={value!r} must be positive")
    return seconds


def port_range(conf: Mapping[str, str], key: str) -> Optional[Tuple[int, int]]:
    """The ports ``key`` allows as ``(first, last)``, both included: a port (``29500``) or a range
    (``29500-29600``); ``None`` when unset (any free port).

    Raises:
        ConfigError: naming ``key``: not a port or a range of them (1-65535, first <= last).
    """
    value = conf.get(key)
    if value is None or not str(value).strip():
        return None
    first, sep, last = str(value).strip().partition("-")
    try:
        ports = (int(first), int(last) if sep else int(first))
    except ValueError:
        ports = (0, 0)
    if not (1 <= ports[0] <= ports[1] <= 65535):
        raise ConfigError(f"Spark conf {key}={value!r} is not a port or a range of ports: use one port (29500) "
                          "or first-last (29500-29600), within 1-65535")
    return ports


def conf_count(conf: Mapping[str, str], key: str, default: int) -> int:
    """A count >= 0 from conf ``key``.

    Raises:
        ConfigError: not a whole number >= 0, naming ``key``.
    """
    text = str(conf.get(key, default)).strip()
    if not text.isdigit():
        raise ConfigError(f"Spark conf {key}={conf.get(key)!r} is not a count (a whole number >= 0)")
    return int(text)


def parse_size(value: str) -> int:
    """Bytes in a Spark size string (``"1g"``, ``"512m"``, ``"1024"`` bytes; Spark's default unit for
    maxResultSize is bytes when no unit is given).

    Raises:
        ValueError: not a size.
    """
    text = value.strip().lower().rstrip("b")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def conf_choice(conf: Mapping[str, str], key: str, choices: Sequence[str], default: str) -> str:
    """One of ``choices`` (any case) from conf ``key``, ``default`` when unset.

    Raises:
        ConfigError: another value, naming ``key`` and the choices.
    """
    value = conf.get(key)
    if value is None or not str(value).strip():
        return default
    text = str(value).strip().lower()
    if text not in choices:
        raise ConfigError(f"Spark conf {key}={value!r} is not one of {', '.join(choices)}")
    return text
