"""Test-session setup.

``POSENC_NAN_FILL=1`` turns on the guard against uninitialised reads: every tensor that
PyTorch allocates without initialising (``torch.empty`` and friends, including the buffers of
compiled kernels) is filled with NaN (integers with their largest value), so a kernel that reads memory
it never wrote gives NaN instead of whatever the allocator happened to return. `make test` runs the
engine tests a second time this way (with ``MALLOC_PERTURB_`` and a raised
``MALLOC_MMAP_THRESHOLD_`` for the C allocator as well; the Makefile says why).
"""

import os

import torch

if os.environ.get("POSENC_NAN_FILL") == "1":
    # fill_uninitialized_memory only acts under deterministic algorithms; warn_only keeps ops that have
    # no deterministic implementation running (with a warning) instead of raising
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
