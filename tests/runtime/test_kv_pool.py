"""The KV pool's memory: zero-filled, writable, and without transparent huge pages (Linux)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from trtpipe.runtime.artifact.manifest import KVLayout
from trtpipe.runtime.kv.pool import KVPool, zeros_without_huge_pages


def _vm_flags(address: int) -> list[str]:
    """VmFlags of the mapping of this process that contains ``address`` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:  # a mapping's header line: start-end perms ...
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping contains {address:#x}")


def test_zeros_without_huge_pages_is_a_writable_zero_array():
    a = zeros_without_huge_pages((3, 40, 16, 8), np.float16)
    assert a.shape == (3, 40, 16, 8) and a.dtype == np.float16 and a.flags.c_contiguous and a.flags.writeable
    assert not a.any()
    a[1, 7, 3] = 2.5
    assert float(a.sum()) == 2.5 * 8


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_NOHUGEPAGE and /proc/self/smaps are Linux")
def test_pool_memory_is_advised_against_huge_pages():
    """'nh' in the mapping's VmFlags = MADV_NOHUGEPAGE: a block's first write faults 4 KiB, not a
    2 MiB huge page (with the head-major layout, one per kv head)."""
    pool = KVPool(KVLayout(16, 600, "float32", (3, 3), 64, 0))  # 7.4 MB per array: huge-page sized
    for arr in pool.keys + pool.values:
        assert arr.shape == (3, 600, 16, 64)
        assert "nh" in _vm_flags(arr.ctypes.data)
    assert "nh" not in _vm_flags(np.zeros(1 << 23, np.uint8).ctypes.data)  # the control: NumPy's own
