"""What an ExecuTorch program method takes as inputs, read from its ``.pte``.

Count, dtypes and sizes come from the runtime's method metadata (what the runtime itself
enforces); whether a tensor's sizes are fixed or upper bounds is not in that metadata, so it
is read from the serialized program (each tensor's shape dynamism).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np

from ..dtypes import BFLOAT16, CODE_TO_DTYPE, CODE_TO_NAME
from ..errors import UsageError

Program = Union[str, Path, bytes]  # a .pte path, or its bytes

IDENTIFIER = re.compile(rb"ET[0-9A-Za-z]{2}")  # flatbuffer file identifier: b"ET12" today
MIN_BYTES = 16  # root table offset, identifier, and at least a root table's offset to a vtable
STATIC = 0  # TensorShapeDynamism of the serialized program
DYNAMIC_BOUND = 1


def _runtime():
    try:
        from executorch.exir._serialize._program import deserialize_pte_binary
        from executorch.runtime import Runtime
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("executorch"):
            raise
        raise ImportError(
            "evalue_store.executorch needs ExecuTorch: pip install 'evalue_store[executorch]'"
        ) from None
    return Runtime.get(), deserialize_pte_binary


@dataclass(frozen=True)
class InputSpec:
    """One tensor input: ExecuTorch ScalarType code and sizes (exact when ``dynamic`` is
    False, upper bounds when True, None for an unbounded size)."""

    index: int
    scalar_type: int
    sizes: tuple[int | None, ...]
    dynamic: bool

    @property
    def dtype(self) -> np.dtype:
        return CODE_TO_DTYPE[self.scalar_type]

    @property
    def dtype_name(self) -> str:
        return CODE_TO_NAME[self.scalar_type]

    @property
    def rank(self) -> int:
        return len(self.sizes)

    def describe(self) -> str:
        """E.g. ``float32 [4, 2]`` or ``float32 [<=64, <=2]``."""
        dims = ["?" if s is None else (f"<={s}" if self.dynamic else str(s)) for s in self.sizes]
        return f"{self.dtype_name} [{', '.join(dims)}]"


@dataclass(frozen=True)
class MethodInputs:
    """The user inputs of one method, in call order."""

    method: str
    inputs: tuple[InputSpec, ...]

    @property
    def static_batch(self) -> int | None:
        """The batch size every static input fixes (dimension 0), None if none is static."""
        sizes = {s.sizes[0] for s in self.inputs if not s.dynamic and s.rank}
        return sizes.pop() if len(sizes) == 1 else None

    @property
    def max_batch(self) -> int | None:
        """The largest batch every input accepts (None: unbounded)."""
        bounds = [s.sizes[0] for s in self.inputs if s.rank and s.sizes[0] is not None]
        return min(bounds) if bounds else None


def program_bytes(program: Program) -> bytes:
    """The bytes of ``program`` (a .pte path or its bytes), refused with a ValueError unless
    they start as an ExecuTorch program does: ExecuTorch logs the file identifier of a
    program it refuses, and one that is not UTF-8 makes that log raise inside the runtime,
    which aborts the process (std::terminate) instead of raising."""
    data = bytes(program) if isinstance(program, (bytes, bytearray)) else None
    if data is None:
        data = Path(program).read_bytes()
    if len(data) < MIN_BYTES:
        raise UsageError(f"not an ExecuTorch program: {len(data)} bytes")
    if not IDENTIFIER.fullmatch(data[4:8]):
        raise UsageError(
            f"not an ExecuTorch program: its file identifier (bytes 4..8) is {data[4:8]!r}, "
            "where ExecuTorch programs carry b'ET' and two letters or digits (b'ET12')"
        )
    return data


def program_digest(data: bytes) -> str:
    """What tells two programs apart (a Binding's and a Trainer's)."""
    return hashlib.sha256(data).hexdigest()


def verified_program(data: bytes) -> Any:
    """ExecuTorch's ``Program`` of ``data`` (``program_bytes``), loaded with its full
    verification (InternalConsistency: the flatbuffer's offsets and sizes are checked), its
    refusal a ValueError: the only check of a damaged program before it runs."""
    runtime, _ = _runtime()
    from executorch.runtime import Verification

    log = io.StringIO()  # the runtime logs why through sys.stderr: into the error instead
    try:
        with contextlib.redirect_stderr(log):
            loaded = runtime.load_program(data, verification=Verification.InternalConsistency)
    except RuntimeError as exc:
        said = [re.sub(r"^\[[^]]*\] ", "", line) for line in log.getvalue().splitlines()]
        why = "; ".join(dict.fromkeys([str(exc), *filter(None, said)]))
        raise UsageError(
            f"ExecuTorch refuses the program ({why}): damaged, or made for another ExecuTorch"
        ) from None
    sys.stderr.write(log.getvalue())  # a program loaded: what the runtime said is the user's
    return loaded


def read_method_inputs(program: Program, method: str = "forward") -> MethodInputs:
    """The inputs of ``method`` in ``program`` (a .pte path or its bytes).

    Raises ValueError for bytes that are not a program ExecuTorch loads (damaged ones
    included), for a method the program lacks, and for inputs that are not tensors or have
    no batch dimension (rank 0): batches are built along dimension 0.
    """
    _, deserialize = _runtime()
    data = program_bytes(program)
    loaded = verified_program(data)
    if method not in loaded.method_names:
        names = sorted(n for n in loaded.method_names if not n.startswith("__"))
        raise UsageError(f"the program has no method {method!r} (methods: {names})")
    meta = loaded.metadata(method)
    try:  # verified by the runtime: a failure here is a damage its checks do not cover
        plan = next(p for p in deserialize(data).program.execution_plan if p.name == method)
    except Exception as exc:
        raise UsageError(f"the program cannot be read ({type(exc).__name__}: {exc})") from None
    specs = []
    for i in range(meta.num_inputs()):
        value = plan.values[plan.inputs[i]].val
        dynamism = getattr(value, "shape_dynamism", None)
        if dynamism is None:
            kind = type(value).__name__
            raise UsageError(f"input {i} of {method!r} is a {kind}, not a tensor: unsupported")
        info = meta.input_tensor_meta(i)
        dynamism = int(dynamism)
        sizes = tuple(info.sizes())
        if dynamism > DYNAMIC_BOUND:
            sizes = (None,) * len(sizes)
        spec = InputSpec(i, int(info.dtype()), sizes, dynamism != STATIC)
        if spec.scalar_type not in CODE_TO_DTYPE:
            raise UsageError(f"input {i} of {method!r} has ScalarType {spec.scalar_type}")
        if spec.rank == 0:
            raise UsageError(f"input {i} of {method!r} is a 0-d tensor: no batch dimension")
        specs.append(spec)
    return MethodInputs(method, tuple(specs))


def torch_dtype(spec: InputSpec):
    """The torch dtype of an input (bfloat16 included)."""
    import torch

    if spec.dtype == BFLOAT16:
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, spec.dtype)).dtype
