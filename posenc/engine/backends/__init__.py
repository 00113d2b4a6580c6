"""The execution paths of the engine, one :class:`~posenc.engine.backends.base.Backend` each, in one
registry: ``impl=<name>`` selects one by name, ``impl="auto"`` walks
:data:`posenc.engine.dispatch.AUTO_ORDER`."""

from posenc.engine.backends.band import BandMerge
from posenc.engine.backends.base import Backend
from posenc.engine.backends.blockwise import Blockwise
from posenc.engine.backends.chunks import ChunkMerge
from posenc.engine.backends.flex import Flex, build_block_mask
from posenc.engine.backends.reference import Reference
from posenc.engine.backends.retrieved import Retrieved
from posenc.engine.backends.sdpa import Sdpa
from posenc.engine.backends.sinks import SinksWindow
from posenc.engine.backends.toeplitz import Toeplitz

BACKENDS: tuple[Backend, ...] = (Reference(), Sdpa(), Blockwise(), Flex(), BandMerge(), Toeplitz(), SinksWindow(),
                                 ChunkMerge(), Retrieved())
BY_NAME: dict[str, Backend] = {b.name: b for b in BACKENDS}

__all__ = ["BACKENDS", "BY_NAME", "Backend", "build_block_mask"]
