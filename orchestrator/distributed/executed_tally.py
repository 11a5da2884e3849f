"""What one orchestrator call stored, per plan index: the outcome of each run's latest execution.

Two numpy arrays over the plan, an outcome code (int8, 0 = nothing stored this call) and its
execution's finish time (int64 microseconds: ``finished_at``, else ``measured_at``), filled as the
store cursor reads new rows, so the summary at the end reads no store and holds no row: 9 bytes a
planned run. The latest execution is the one that finished last (``storage.runs.EXECUTION_RULE``;
a tie keeps the one read first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.outcomes import Outcome

OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome)
_CODE = {o: k + 1 for k, o in enumerate(OUTCOMES)}


class ExecutedTally:
    """The latest execution stored this call of each of ``size`` plan indices."""

    def __init__(self, size: int) -> None:
        self._code = np.zeros(size, dtype=np.int8)
        self._at = np.zeros(size, dtype=np.int64)

    def add(self, index: np.ndarray, rows: pa.Table) -> None:
        """Note the executions of ``rows`` (``outcome``, ``finished_at``, ``measured_at``), the
        row ``k`` an execution of plan index ``index[k]``."""
        if index.size == 0:
            return
        stamp = pc.coalesce(rows.column("finished_at"), rows.column("measured_at")).cast(pa.int64())
        at = np.asarray(pc.fill_null(stamp, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        code = np.array([_CODE.get(o, 0) for o in rows.column("outcome").to_pylist()], dtype=np.int8)
        order = np.lexsort((at, index))  # by index, then finish time: the last of each index wins
        index, at, code = index[order], at[order], code[order]
        last = np.r_[index[1:] != index[:-1], True]
        index, at, code = index[last], at[last], code[last]
        newer = (self._code[index] == 0) | (at > self._at[index])
        self._code[index[newer]] = code[newer]
        self._at[index[newer]] = at[newer]

    def summary(self, models: Sequence[str], model_positions: Callable[[np.ndarray], np.ndarray],
                ) -> tuple[int, dict[str, dict[str, int]]]:
        """(runs stored this call, model -> outcome -> runs); ``model_positions``: plan indices ->
        the position of each one's model in ``models``."""
        index = np.flatnonzero(self._code)
        if index.size == 0:
            return 0, {}
        keys, counts = np.unique(model_positions(index).astype(np.int64) * 256 + self._code[index], return_counts=True)
        out: dict[str, dict[str, int]] = {}
        for key, n in zip(keys.tolist(), counts.tolist()):
            out.setdefault(models[key // 256], {})[OUTCOMES[key % 256 - 1]] = int(n)
        return int(index.size), out
