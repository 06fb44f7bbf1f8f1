"""EP-context blobs: received through ORT's write callback when the EP supports it, else written by the EP.

No EP available with onnxruntime 1.31 implements the callback; ORT then refuses the whole compile with
"... does not support the registered EPContext data write callback" before any work is done, and we
compile again without it, letting the EP write its blob files beside the staged model.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

from ortcompile import ortmarkers
from ortcompile.compile.datapass import WrittenFile
from ortcompile.durable import new_file
from ortcompile.errors import CompilationFailed
from ortcompile.paths import is_plain_name

READ_CHUNK = 16 << 20


def callback_unsupported(exc: BaseException) -> bool:
    return ortmarkers.CALLBACK_UNSUPPORTED in str(exc)


class BlobSink:
    """The EP-context write callback: stores each named blob as a file in `directory`, or in memory (None)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.written: dict[str, WrittenFile] = {}
        self.blobs: dict[str, bytes] = {}
        self._lock = threading.Lock()  # ORT may call concurrently

    def write_func(self, name: str, data: Any) -> None:
        if not is_plain_name(name):  # blob names become file names in the output directory
            raise CompilationFailed(f"EP asked to write context data under an unsafe name {name!r}")
        digest = hashlib.sha256()
        size = data.size()
        chunks = (data.read(offset, min(READ_CHUNK, size - offset)) for offset in range(0, size, READ_CHUNK))
        if self.directory is None:
            content = b"".join(chunks)
            digest.update(content)
            with self._lock:
                self.blobs[name] = content
        else:
            with new_file(self.directory / name) as out:
                for chunk in chunks:
                    digest.update(chunk)
                    out.write(chunk)
        with self._lock:
            self.written[name] = WrittenFile(name, size, digest.hexdigest())
