"""safetensors: one ``.safetensors`` file holding every field of every record as a named
tensor (``"<i>/<field>"``); ints as 0-d int64 tensors, strings as uint8 tensors of their UTF-8
bytes (safetensors stores tensors only).

The format is made for a few big tensors (W3), not for many records: its JSON header lists
every tensor, so ``open`` parses a header that grows with the record count, and the header
is capped at 100 MB. ``save_file`` takes the whole dataset as one dict in memory.
``safe_open(framework="numpy").get_tensor`` returns a copy.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..workloads import Record
from . import Adapter, Unavailable

try:
    from safetensors import safe_open
    from safetensors.numpy import save_file
except ImportError as exc:
    raise Unavailable(f"{exc}") from exc


class Safetensors(Adapter):
    name = "safetensors"
    zero_copy = False
    packages = ("safetensors",)
    notes = "one file, a named tensor per field per record; get_tensor copies"

    def write(self, records: Iterable[Record], path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        tensors: dict[str, np.ndarray] = {}
        n = 0
        for i, record in enumerate(records):
            for f, value in zip(self.fields, record):
                if f.kind == "int":
                    value = np.array(value, dtype=np.int64)
                elif f.kind == "str":
                    value = np.frombuffer(value.encode(), dtype=np.uint8)
                tensors[f"{i}/{f.name}"] = value
            n += 1
        save_file(tensors, str(path / "data.safetensors"), metadata={"records": str(n)})

    def open(self, path: Path) -> None:
        self.file: Any = safe_open(str(path / "data.safetensors"), framework="numpy")
        self.n = int(self.file.metadata()["records"])

    def get(self, i: int) -> Record:
        out: Record = []
        for f in self.fields:
            value = self.file.get_tensor(f"{i}/{f.name}")
            if f.kind == "int":
                value = int(value)
            elif f.kind == "str":
                value = value.tobytes().decode()
            out.append(value)
        return out

    def close(self) -> None:
        self.file = None
