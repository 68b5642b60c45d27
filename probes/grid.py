"""The p x p input grid of a modular task, read from its TaskData (never assumed).

Fourier analyses need every pair (a, b) in Z_p x Z_p exactly once, tokens [a, b, =] with
vocabulary p + 1 and p output classes. `ModularGrid.cell[a, b]` is the row of `data.inputs`
holding the pair (a, b), so activations over inputs can be laid out as [p, p, ...] grids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from groklens.errors import BadInput

if TYPE_CHECKING:  # pragma: no cover
    from groklens.tasks import TaskData


@dataclass(frozen=True)
class ModularGrid:
    p: int
    a: np.ndarray  # [N] first operand of each input row
    b: np.ndarray  # [N] second operand
    c: np.ndarray  # [N] the answer (label) in Z_p; (a + b) mod p for modular addition
    cell: np.ndarray  # [p, p] row index of (a, b)

    def to_grid(self, values: np.ndarray) -> np.ndarray:
        """[N, ...] values over input rows -> [p, p, ...] indexed by (a, b)."""
        return np.asarray(values)[self.cell]


def modular_grid(data: TaskData, what: str = "this analysis") -> ModularGrid:
    """The grid of a modular task, or BadInput saying why `what` does not apply."""
    p = int(data.d_vocab_out)
    inputs = data.inputs.numpy()
    labels = data.labels.numpy()
    if data.d_vocab != p + 1 or inputs.shape[1] < 2 or labels.ndim != 1:
        raise BadInput(
            f"{what} needs a modular task over Z_p (vocabulary p + 1, p classes); "
            f"this task has vocabulary {data.d_vocab} and {p} classes"
        )
    a, b = inputs[:, 0].astype(np.int64), inputs[:, 1].astype(np.int64)
    if len(a) != p * p or a.min() < 0 or a.max() >= p or b.min() < 0 or b.max() >= p:
        raise BadInput(f"{what} needs the full p x p grid of operand pairs (p={p}); this task has {len(a)} inputs")
    cell = np.full((p, p), -1, dtype=np.int64)
    cell[a, b] = np.arange(len(a))
    if (cell < 0).any():
        raise BadInput(f"{what} needs every operand pair (a, b) in Z_{p} x Z_{p} exactly once")
    if labels.min() < 0 or labels.max() >= p:
        raise BadInput(f"{what} needs answers in Z_{p}")
    return ModularGrid(p=p, a=a, b=b, c=labels.astype(np.int64), cell=cell)
