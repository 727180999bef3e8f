"""Byte sizes as people read and write them: '2GiB' in, '1.50 MiB' out."""
import re

from .errors import MemplanError

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50}
SCALES = (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
BARE_LEAST = 1 << 10
"""A bare number (no unit) below this many bytes is refused: `--budget 16` is far likelier 16 GiB meant than 16 B."""


def parse_bytes(text, what="--budget"):
    """'2GiB' -> 2147483648; '1.5 GB' -> 1500000000; '4096' -> 4096; '16B' -> 16. A number without a unit
    from 1 to BARE_LEAST - 1 is refused, naming the units. `what` names the setting in the error."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in UNITS:
        raise MemplanError(f"{what} {text!r}: expected a size such as 2GiB, 512MiB, 1.5GB or 4096 (bytes)")
    number = m.group(1)
    if not m.group(2) and 0 < float(number) < BARE_LEAST:
        raise MemplanError(f"{what} {text!r}: a number without a unit counts bytes; give a unit (B, KiB, MiB, GiB, "
                           f"TiB, or KB, MB, GB, TB), e.g. {number}GiB" + ("" if "." in number else f", or {number}B "
                                                                           "if you mean bytes"))
    return int(float(number) * UNITS[m.group(2).lower()])


def format_bytes(n, digits=2):
    """Bytes in the largest binary unit that keeps the number at least 1: '512 B', '1.50 KiB', '97.66 MiB'."""
    for unit, scale in SCALES:
        if abs(n) >= scale:
            return f"{n / scale:,.{digits}f} {unit}"
    return f"{int(n)} B"
