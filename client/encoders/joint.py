"""Joint metrics: a tuple of values as one cell of the product domain, then the cell oracle.

:class:`JointEncoder` maps the tuple to its cell
(:meth:`~veil.shared.kinds.joint.JointParams.cell_of`) and hands the cell to the
encoder of the metric's cell oracle (GRR, OUE, OLH or Hadamard,
:mod:`veil.client.encoders.oracles`), whose category ``str(cell)`` it is. The
permanent response's stream is that oracle's (purpose ``prr``), with the context
``fingerprint || 0x00 || utf8(str(cell))`` where the fingerprint is the joint
metric's own: parameters declared anew under the metric's name (other variables,
domains or epsilons) draw independent permanent responses, and no two metrics
share a stream.

With ``marginals`` the installation's cohort names its marginal
(:attr:`~veil.shared.kinds.joint.JointParams.marginal_sets`, the cohort seed modulo
their number, fixed by the secret): the encoder checks the whole tuple and reports
the cell of that marginal (:meth:`~veil.shared.kinds.joint.JointParams.marginal_cell`)
the same way, so the memo key and the stream's context are that cell's index.
"""

from __future__ import annotations

from typing import Any

from veil.client.encoders.base import ENCODERS, Encoder
from veil.shared.kinds.joint import JointParams


class JointEncoder(Encoder[JointParams]):
    """The cell oracle's encoder over the cells, keyed by the joint metric's fingerprint."""

    params_type = JointParams

    def __init__(self, params: JointParams, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        oracle = params.cell_oracle
        self.cells = ENCODERS.lookup(oracle.mechanism_name)(
            oracle, self.metric, self.secret, self.cohort or 0, self.fresh.random_bytes,
            self.layout)
        # the cell oracle's streams are keyed by the joint parameters' fingerprint
        self.cells.permanent_stream = self.permanent_stream  # type: ignore[method-assign]
        self.cells.fresh = self.fresh

    def memo_key(self, value: Any) -> bytes:
        """The cell's index as ASCII digits (the cell oracle's category): the tuple's, or with
        ``marginals`` its cell in the installation's marginal; a
        :class:`~veil.shared.errors.ParameterError` names the variable at fault."""
        if self.cohort is not None:
            return str(self.params.marginal_cell(self.cohort, value)).encode()
        return str(self.params.cell_of(value)).encode()

    def derive(self, key: bytes) -> Any:
        return self.cells.derive(key)

    def finish(self, permanent: Any) -> Any:
        return self.cells.finish(permanent)
