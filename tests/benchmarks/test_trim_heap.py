"""benchmarks.common.trim_heap: the freed memory malloc keeps in the resident set goes back to the kernel, so a peak
measured after an earlier run in the same process counts what the measured call allocates (bench_real_model)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.common import _status_kb, trim_heap


def test_freed_heap_memory_leaves_the_resident_set():
    blocks = [torch.ones(25_000) for _ in range(2000)]  # 100 KB each, below malloc's mmap threshold: on the heap
    kept = blocks[::50]  # one block in fifty stays, so the freed ones are not all at the heap's top
    del blocks
    before = _status_kb("VmRSS")
    if not trim_heap():
        pytest.skip("no glibc malloc_trim here")
    after = _status_kb("VmRSS")
    assert before - after > 100 * 1024, (before, after)  # KB: most of the 195 MB freed is handed back
    assert len(kept) == 40
