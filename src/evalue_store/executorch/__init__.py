"""Train ExecuTorch programs from containers (the ``[executorch]`` extra).

* ``read_method_inputs``: what a ``.pte`` method takes (count, dtypes, static or bounded
  sizes), from ExecuTorch's own metadata.
* ``bind`` / ``Binding``: a dataset checked against those inputs, record by record, and
  read as batches shaped for the method (``Batch``); ``Binding.collate`` gives the same
  tensors to a torch ``DataLoader`` over ``evalue_store.torch.EValueDataset``.
* ``Trainer``: ExecuTorch's ``TrainingModule`` + SGD over those batches: epochs, seeded
  shuffling, resumable position, a loss log.

Records that do not fit raise ``evalue_store.InputMismatchError`` naming the record, the
field and what the program expects.
"""

from ..errors import InputMismatchError
from .binding import Batch, Binding, bind
from .fields import Field, Layout
from .program import InputSpec, MethodInputs, read_method_inputs
from .training import Trainer, load_training_module

__all__ = [
    "Batch",
    "Binding",
    "Field",
    "InputMismatchError",
    "InputSpec",
    "Layout",
    "MethodInputs",
    "Trainer",
    "bind",
    "load_training_module",
    "read_method_inputs",
]
