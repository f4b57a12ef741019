"""Shared pytest plumbing for tools/reference.

Tests record their worst tolerance ratios through the ``report`` fixture; the table is printed
at the end of the run even under ``-q`` so the margins are visible without ``-s``."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_ROWS = []


@pytest.fixture
def report():
    def add(case: str, check: str, ratio: float, note: str = ""):
        _ROWS.append((case, check, float(ratio), note))
    return add


def pytest_terminal_summary(terminalreporter):
    if not _ROWS:
        return
    tr = terminalreporter
    tr.section("k3ref worst tolerance ratios (pass if <= 1)")
    w = max(len(c) for c, *_ in _ROWS)
    w2 = max(len(k) for _, k, *_ in _ROWS)
    for case, check, ratio, note in _ROWS:
        tr.write_line(f"{case:<{w}}  {check:<{w2}}  {ratio:10.4g}  {note}")
