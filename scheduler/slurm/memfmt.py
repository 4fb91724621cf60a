"""Slurm memory sizes: `--mem` and friends (`str_to_mbytes`) and the `16G` form of TRES."""

from __future__ import annotations

_MEM = r"^(\d+)([KMGT]?)B?$"
_FACTOR_MB = {"": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_mem_mb(text: str) -> int:
    """Parse a memory size into megabytes: an integer with an optional `K`, `M`, `G` or
    `T` (and an optional trailing `B`), megabytes by default. Kilobytes round up, as
    Slurm's `str_to_mbytes` does; fractions such as `1.5G` are an error there too.
    """
    stripped = text.strip()
    if stripped.isascii() and stripped.isdigit():
        return int(stripped)  # megabytes (and sbatch's "no --mem" is "0"): no pattern
    import re  # here: sbatch starts without it unless a unit is given (bench/cli.py)

    match = re.match(_MEM, stripped, re.IGNORECASE)
    if match is None:
        raise ValueError(f"invalid memory size {text!r}: expected an integer with K, M, G or T")
    number = int(match.group(1))
    unit = match.group(2).upper()
    if unit == "K":
        return -(-number // 1024)
    return number * _FACTOR_MB[unit]


def format_mem_mb(mb: int) -> str:
    """TRES memory as sacct prints it: `8G`, `1536M`, `2T`."""
    if mb and mb % (1024 * 1024) == 0:
        return f"{mb // (1024 * 1024)}T"
    if mb and mb % 1024 == 0:
        return f"{mb // 1024}G"
    return f"{mb}M"
