"""Memory sizes as --mem takes them."""

from __future__ import annotations

import pytest

from scheduler.slurm.memfmt import format_mem_mb, parse_mem_mb


@pytest.mark.parametrize(
    ("text", "mb"),
    [
        ("100", 100),
        ("100M", 100),
        ("100mb", 100),
        ("4G", 4096),
        ("4GB", 4096),
        ("4g", 4096),
        ("2T", 2 * 1024 * 1024),
        ("1024K", 1),
        ("1K", 1),  # kilobytes round up to a whole megabyte
        ("0", 0),
    ],
)
def test_it_reads_sizes_in_megabytes_by_default(text: str, mb: int) -> None:
    assert parse_mem_mb(text) == mb


@pytest.mark.parametrize("text", ["1.5G", "", "G", "-1", "4GiB", "4 G", "4P", "lots", "4GG"])
def test_it_rejects_what_slurm_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid memory size"):
        parse_mem_mb(text)


def test_tres_memory_uses_the_largest_whole_unit() -> None:
    assert format_mem_mb(8192) == "8G"
    assert format_mem_mb(1536) == "1536M"
    assert format_mem_mb(2 * 1024 * 1024) == "2T"
    assert format_mem_mb(0) == "0M"
