"""The CPU's caches as the kernels read them (`mechanisms._cpu`), from a sysfs tree written here, and the sizes the
kernels derive from them."""
from pathlib import Path

import pytest

from attn_core.mechanisms import _cpu, _linear_core, gated_deltanet, kda, mamba2


def _entry(root: Path, index: int, level: int, kind: str, size: str) -> None:
    d = root / f"index{index}"
    d.mkdir(parents=True)
    (d / "level").write_text(f"{level}\n")
    (d / "type").write_text(f"{kind}\n")
    (d / "size").write_text(f"{size}\n")


def test_sysfs_gives_the_level_two_and_the_last_level(tmp_path):
    # an Intel Xeon as the issue describes it: 48 KiB L1d, 32 KiB L1i, 2 MiB L2 a core, 36 MiB L3
    _entry(tmp_path, 0, 1, "Data", "48K")
    _entry(tmp_path, 1, 1, "Instruction", "32K")
    _entry(tmp_path, 2, 2, "Unified", "2048K")
    _entry(tmp_path, 3, 3, "Unified", "36M")
    assert _cpu._from_sysfs(tmp_path) == (2 * 1024 * 1024, 36 * 1024 * 1024)


def test_a_cpu_without_a_third_level_shares_its_second(tmp_path):
    _entry(tmp_path, 0, 1, "Data", "32K")
    _entry(tmp_path, 1, 2, "Unified", "512K")
    assert _cpu._from_sysfs(tmp_path) == (512 * 1024, 512 * 1024)


def test_no_sysfs_reads_nothing(tmp_path):
    assert _cpu._from_sysfs(tmp_path / "missing") == (None, None)


@pytest.mark.parametrize("text,value", [("1024K", 1 << 20), ("36M", 36 << 20), ("512", 512), ("1G", 1 << 30)])
def test_sizes_as_sysfs_writes_them(text, value):
    assert _cpu.size_of(text) == value


def test_the_kernels_sizes_are_fractions_of_this_cpus_caches():
    c = _cpu.caches()
    assert c.per_core > 0 and c.shared >= c.per_core and c.cores >= 1
    assert c.own == c.per_core * c.cores
    # the EPYC the sizes were tuned on (1 MiB a core, 2 cores, 32 MiB shared) gets 2, 16, 4, 4 and 2 MiB
    assert _linear_core.CHUNK_BYTES == c.own and gated_deltanet.SEGMENT_BYTES == c.own == kda.SEGMENT_BYTES
    assert mamba2.SEGMENT_BYTES == min(2 * c.own, 4 << 20)  # and no more than the EPYC's 4 MiB
    assert _linear_core.WHOLE_BYTES == c.shared // 2 and _linear_core.GROUP_BYTES == c.shared // 8
    assert _linear_core.NATIVE_GROUP_BYTES == 4 * c.own  # 16 MiB on the 2-core Xeon it was measured on


@pytest.mark.parametrize("l2,shared,expected", [
    (1 << 20, 32 << 20, 32 << 20),  # the EPYC the sizes were tuned on: as reported
    (2 << 20, 36 << 20, 32 << 20),  # a Xeon's 36 MiB: 32 taken
    (2 << 20, 480 << 20, 32 << 20),  # a 2-core guest of a socket whose 480 MiB many cores share
    (512 << 10, None, 512 << 10),  # no last level listed: the level 2
])
def test_the_last_level_the_kernels_size_by_is_at_most_32_mib(l2, shared, expected):
    size, source = _cpu.taken(l2, shared, "sysfs")
    assert size == expected
    assert source == "sysfs" if (shared or l2) <= 32 << 20 else f"{shared >> 20} MiB reported" in source


def test_caches_take_the_bounded_last_level(monkeypatch):
    monkeypatch.setattr(_cpu, "_from_sysfs", lambda: (2 << 20, 480 << 20))
    _cpu.caches.cache_clear()
    try:
        c = _cpu.caches()
        assert (c.per_core, c.shared) == (2 << 20, 32 << 20) and "480 MiB reported" in c.describe()
    finally:
        _cpu.caches.cache_clear()
