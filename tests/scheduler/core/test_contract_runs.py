"""The columns answer's run-length form (`contract.runs`, `?shape=runs`): any column read
back from its form is the column itself; a column goes as runs only where that halves
it; and a malformed one is refused before anything is repeated."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.contract.runs import RUNS, decode_column, encode, encode_column

# What a column holds: few distinct values (states, users), lists (a job's nodes), None.
values = st.one_of(
    st.none(),
    st.sampled_from(["PENDING", "RUNNING", "alice", ""]),
    st.integers(-2, 3),
    st.lists(st.sampled_from(["n1", "n2"]), max_size=2),
)


@given(st.lists(values, max_size=60))
def test_a_column_reads_back_as_itself(column: list[Any]) -> None:
    form = encode_column(column)
    assert decode_column(form, len(column)) == column
    if isinstance(form, dict):
        runs = form[RUNS]
        assert 2 * len(runs) <= len(column)
        assert all(a[0] != b[0] for a, b in zip(runs, runs[1:], strict=False))  # maximal
    else:
        assert form is column


def test_runs_only_where_they_halve_the_column() -> None:
    held = ["PENDING"] * 10_000
    assert encode_column(held) == {RUNS: [["PENDING", 10_000]]}
    ids = list(range(10_000))
    assert encode_column(ids) is ids  # distinct: as it is
    nodes = [["n1"]] * 3 + [["n2"]] * 3
    assert encode_column(nodes) == {RUNS: [[["n1"], 3], [["n2"], 3]]}
    alternating = ["a", "b"] * 4  # two distinct values, but eight runs
    assert encode_column(alternating) is alternating
    assert encode({"state": held[:3], "job_id": [1, 2, 3]}) == {
        "state": {RUNS: [["PENDING", 3]]},
        "job_id": [1, 2, 3],
    }


@pytest.mark.parametrize(
    "column",
    [
        {RUNS: [["a", 2]]},  # too few
        {RUNS: [["a", 10**15]]},  # too many: refused before it is repeated
        {RUNS: [["a", 0], ["b", 3]]},
        {RUNS: [["a", -1], ["b", 4]]},
        {RUNS: [["a", 1.5], ["b", 1.5]]},
        {RUNS: [["a"]]},
        {RUNS: "aaa"},
        {"values": ["a", "a", "a"]},
        ["a", "a"],  # a short plain list
        "aaa",
        None,
    ],
)
def test_a_malformed_column_is_refused(column: Any) -> None:
    with pytest.raises(ValueError):
        decode_column(column, 3)
