"""A small training loop over ExecuTorch's ``TrainingModule`` and its SGD optimizer, fed
from a container; short enough to read as an example of doing it by hand.

The program's first output must be the loss (how ExecuTorch's training export works). The
order of an epoch is a function of (seed, epoch) only, so ``state_dict`` (epoch, batches
done, parameters, loss log) resumes a run exactly where it stopped.
"""

from __future__ import annotations

import numbers
import os
import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from ..values import is_sequence
from .binding import Batch, Binding, Data
from .fields import as_count
from .program import Program, program_bytes, program_digest, verified_program

STATE_VERSION = 1
STATE_KEYS = "version epoch batch seed shuffle records batch_size losses parameters".split()


def load_training_module(program: Program) -> Any:
    """ExecuTorch's ``TrainingModule`` for a .pte path or its bytes, verified first: the
    module loader does not run the program verification (a damaged program loaded there
    crashes the process when it runs), so the bytes are loaded once by the runtime with it
    (a ValueError for a damaged program), then handed, the same bytes, to the module,
    which keeps them (``program_bytes``): ExecuTorch's module runs from the buffer it was
    given without a copy, and must not outlive it."""
    from executorch.extension.training import _load_for_executorch_for_training_from_buffer

    data = program_bytes(program)
    verified_program(data)
    module = _load_for_executorch_for_training_from_buffer(data)
    module.program_bytes = data  # the module reads them, not a copy, for as long as it runs
    return module


class Trainer:
    """Train ``method`` of ``program`` on ``data`` with SGD.

    ``binding`` options (``fields``, ``batch_size``, ``last``, ``check``) go to ``Binding``.
    ``losses`` logs the loss of every step taken (resumed runs included).
    """

    def __init__(
        self,
        program: Program,
        data: Data | Binding,
        method: str = "forward",
        *,
        lr: float = 0.1,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        shuffle: bool = True,
        seed: int = 0,
        **binding: Any,
    ):
        for name, value in dict(lr=lr, momentum=momentum, weight_decay=weight_decay).items():
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a number, not {type(value).__name__} {value!r}")
        if not isinstance(shuffle, (bool, np.bool_)):
            raise TypeError(f"shuffle must be a bool, not {type(shuffle).__name__} {shuffle!r}")
        code = program_bytes(program)  # read once: what is bound is what is trained
        if isinstance(data, Binding):
            if binding:
                raise TypeError(f"binding options {sorted(binding)} go to bind(), not here")
            _same_program(data, code, method)
        self.data = data if isinstance(data, Binding) else Binding(data, code, method, **binding)
        self.module = load_training_module(code)
        self.method = method
        self.sgd = dict(lr=float(lr), momentum=float(momentum), weight_decay=float(weight_decay))
        self.shuffle, self.seed = bool(shuffle), seed
        self.epoch = 0  # the epoch in progress
        self.batch = 0  # batches of it already trained on
        self.losses: list[float] = []
        self._optimizer: Any = None
        self._ran = False  # whether the module ran forward_backward (its parameters exist)

    def step(self, batch: Batch | list[torch.Tensor]) -> float:
        """One forward/backward and SGD step on a batch; returns the loss. Its effects (the
        parameters updated, the loss logged) happen together or not at all, a Ctrl-C
        included (see ``_take``)."""
        return self._take(batch.inputs if isinstance(batch, Batch) else batch, advance=False)

    def _take(self, inputs: list[torch.Tensor], advance: bool) -> float:
        """A step, and with ``advance`` the batch counted as done. The forward/backward
        changes nothing that ``state_dict`` holds, so an interrupt there costs nothing; the
        update and its bookkeeping (loss logged, batch counted) run with SIGINT deferred
        to their end, so that ``state_dict`` never shows parameters updated by a step it
        does not count (a resumed run would take that step twice)."""
        outputs = self.module.forward_backward(self.method, inputs)
        self._ran = True
        value = float(outputs[0])  # before the update: a loss that fails changes nothing
        gradients = self.module.named_gradients()
        if self._optimizer is None:  # the parameters exist once a forward_backward ran
            self._optimizer = _sgd(self.module.named_parameters(), **self.sgd)
        with sigint_deferred():
            self._optimizer.step(gradients)
            self.losses.append(value)
            if advance:
                self.batch += 1
        return value

    def _live(self) -> dict[str, torch.Tensor]:
        """The program's parameters, live: ExecuTorch's module shows them only after a
        forward_backward, so before the first step one runs on the first records (its
        outputs and gradients dropped; it updates nothing)."""
        if not self._ran:
            rows = np.resize(np.arange(len(self.data.dataset)), self.data.batch_size)
            self.module.forward_backward(self.method, self.data.read(rows))
            self._ran = True
        return self.module.named_parameters()

    def train(self, epochs: int, max_steps: int | None = None) -> list[float]:
        """Train until ``epochs`` epochs are complete (counting those done before a resume),
        or for at most ``max_steps`` steps; returns this call's losses."""
        epochs = as_count("epochs", epochs)
        max_steps = None if max_steps is None else as_count("max_steps", max_steps)
        start = len(self.losses)
        while self.epoch < epochs:
            order = self.data.epoch_order(self.epoch, self.seed, self.shuffle)
            for batch in self.data.batches(order, start=self.batch, reuse=True):
                if max_steps is not None and len(self.losses) - start >= max_steps:
                    return self.losses[start:]
                self._take(batch.inputs, advance=True)
            with sigint_deferred():
                self.epoch, self.batch = self.epoch + 1, 0
        return self.losses[start:]

    def parameters(self) -> dict[str, torch.Tensor]:
        """The program's parameters by name (live tensors), before the first step too."""
        return dict(self._live())

    def state_dict(self) -> dict:
        """Position, parameters and loss log (SGD momentum buffers are not included: with
        ``momentum`` a resumed run restarts them)."""
        params = {k: v.detach().numpy().copy() for k, v in self.parameters().items()}
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "batch": self.batch,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "records": len(self.data.dataset),
            "batch_size": self.data.batch_size,
            "losses": list(self.losses),
            "parameters": params,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()`` of a run over the same data and program. Every
        field is checked before anything changes: a field of the wrong type is a TypeError,
        a value this trainer cannot continue from (another seed, a batch past the epoch's
        batches, a parameter missing or of another shape or dtype) a UsageError; either
        names the field and leaves the trainer as it was."""
        epoch, batch, losses, parameters = self._checked(state)
        live = self._live()
        for name, value in parameters.items():
            live[name].copy_(torch.from_numpy(value))
        self.epoch, self.batch, self.losses = epoch, batch, losses
        self._optimizer = None  # a new one over them (momentum restarts)

    def _checked(self, state: Any) -> tuple[int, int, list[float], dict[str, np.ndarray]]:
        """``state``'s epoch, batch, loss log and parameters (copies), each checked."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from state_dict(), not {type(state).__name__}")
        missing = [key for key in STATE_KEYS if key not in state]
        if missing:
            raise UsageError(f"state lacks {missing}: not a Trainer.state_dict()")
        if not isinstance(state["shuffle"], (bool, np.bool_)):
            raise TypeError(f"state shuffle must be a bool, not {state['shuffle']!r}")
        mine = dict(version=STATE_VERSION, seed=self.seed, shuffle=self.shuffle)
        mine.update(records=len(self.data.dataset), batch_size=self.data.batch_size)
        for key, value in mine.items():
            theirs = state[key] if key == "shuffle" else as_count(f"state {key}", state[key])
            if theirs != value:
                raise UsageError(f"state {key} is {theirs!r}, this trainer's {value!r}")
        epoch = as_count("state epoch", state["epoch"])
        batch = as_count("state batch", state["batch"])
        if batch > len(self.data):  # == : stopped after an epoch's last step, before its end
            raise UsageError(f"state batch is {batch}: an epoch here has {len(self.data)} batches")
        return epoch, batch, _losses(state["losses"]), self._parameters(state["parameters"])

    def _parameters(self, given: Any) -> dict[str, np.ndarray]:
        """A state's parameters, copies, checked against the program's: the same names,
        each an array of the same shape and dtype."""
        if not isinstance(given, Mapping):
            raise TypeError(f"state parameters must be a dict, not {type(given).__name__}")
        live = self._live()
        missing, extra = sorted(set(live) - set(given)), sorted(set(given) - set(live))
        if missing or extra:
            wrong = f"lack {missing}" if missing else f"name {extra}, which the program lacks"
            raise UsageError(f"state parameters {wrong} (the program's: {sorted(live)})")
        result = {}
        for name, tensor in live.items():
            value = given[name]
            if isinstance(value, torch.Tensor):
                value = value.detach().cpu().numpy()
            if not isinstance(value, np.ndarray):
                kind = type(value).__name__
                raise TypeError(f"state parameters[{name!r}] is {kind}, not an array")
            want = (str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
            if (value.dtype.name, value.shape) != want:
                raise UsageError(
                    f"state parameters[{name!r}] is {value.dtype.name} of shape {value.shape}, "
                    f"the program's {want[0]} of shape {want[1]}"
                )
            result[name] = np.array(value)  # a copy: the state stays the caller's
        return result


def _losses(losses: Any) -> list[float]:
    """A state's loss log: a sequence of numbers (a str is a TypeError, not a log)."""
    if not is_sequence(losses):
        raise TypeError(f"state losses must be a list of numbers, not {type(losses).__name__}")
    for k, loss in enumerate(losses):
        if isinstance(loss, (bool, np.bool_)) or not isinstance(
            loss, (int, float, np.integer, np.floating)
        ):
            raise TypeError(f"state losses[{k}] is {type(loss).__name__} {loss!r}, not a number")
    return [float(loss) for loss in losses]


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """Run the block with a SIGINT (Ctrl-C) that arrives during it deferred to its end:
    recorded by a handler of our own, then, with the previous handler back, handed to it
    (Python's default raises KeyboardInterrupt there; SIG_IGN drops it; SIG_DFL kills the
    process as the signal would have). Only the main thread runs Python signal handlers,
    and a handler not set from Python cannot be put back: elsewhere the block just runs.
    A KeyboardInterrupt raised in the block by other means (a tracer, a test) is not
    deferred."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is None:
        yield
        return
    caught: list[Any] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(signal.SIGINT, caught[0])
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGINT)


def _same_program(binding: Binding, code: bytes, method: str) -> None:
    """Refuse a binding made for another program or method: its checks and batches hold
    for that one only (ExecuTorch would fail with an opaque error code, or train on inputs
    it never checked)."""
    if binding.program_digest != program_digest(code):
        raise UsageError("the binding was made for another program than the trainer's")
    if binding.method != method:
        raise UsageError(f"the binding is of method {binding.method!r}, the trainer's {method!r}")


def _sgd(named: dict, lr: float, momentum: float, weight_decay: float) -> Any:
    from executorch.extension.training import get_sgd_optimizer

    return get_sgd_optimizer(named, lr, momentum, 0.0, weight_decay, False)
