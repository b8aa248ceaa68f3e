"""A proposer and a window policy that keep every PassResult the loop hands them (runtime tests)."""

from __future__ import annotations

from jacobi_rt.runtime.proposers import JacobiProposer
from jacobi_rt.runtime.windows import FixedWindow


class Recording(JacobiProposer):
    def __init__(self):
        super().__init__()
        self.results = []

    def observe(self, result):
        self.results.append(result)
        super().observe(result)


class RecordingWindow(FixedWindow):
    def __init__(self, window):
        super().__init__(window)
        self.results = []

    def observe(self, result):
        self.results.append(result)
