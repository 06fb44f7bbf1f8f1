"""One data pass for several models: each distinct tensor content written once (--share-weights, stitch)."""

from __future__ import annotations

import hashlib

from ortcompile.compile.datapass import DataPass, FileSink
from ortcompile.layout import DataLayout, Placement
from ortcompile.output.digest import WrittenFile


class SharedDataPass(DataPass):
    """One data pass for the whole batch: writes each distinct tensor content once."""

    def __init__(self, sink: FileSink, shared_name: str, layout: DataLayout) -> None:
        super().__init__(sink, shared_name, layout)
        self.by_content: dict[str, Placement] = {}
        self.reused_bytes = 0

    def store(self, name: str, data: memoryview, element_size: int, origin: tuple[int, int] | None = None) -> Placement:
        key = hashlib.sha256(data).hexdigest()
        earlier = self.by_content.get(key)
        needed = self.layout.policy.alignment_for(len(data), element_size)
        if earlier is not None and earlier.nbytes == len(data) and earlier.offset % needed == 0:
            self.reused_bytes += len(data)
            return earlier
        placement = super().store(name, data, element_size, origin)
        self.by_content[key] = placement
        return placement

    def abandon(self) -> None:
        """Per-model failures abort the whole batch; the staging directory is removed by its owner."""

    def close(self) -> list[WrittenFile]:
        return DataPass.finish(self)
