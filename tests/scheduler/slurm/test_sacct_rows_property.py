"""sacct's lines made a table at a time (columns of few values made once per distinct
values and joined into one piece, ids and names a column at once, each line by one `%`)
are the lines a plain row-by-row reading of FIELDS makes: any jobs, any fields and
widths (cut with `+`, `%0`, right-justified), fixed or parsable."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.slurm import sacct_format, sacct_records
from scheduler.slurm.sacct_format import FIELDS, Rowwise, parse_fields
from scheduler.slurm.sacct_records import records
from tests.scheduler.slurm.scene import NOW, job

STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "RUNNING", "PENDING")


@st.composite
def jobs(draw: Any) -> list[dict[str, Any]]:
    out = []
    for job_id in sorted(draw(st.sets(st.integers(1, 10**9), min_size=0, max_size=8))):
        state = draw(st.sampled_from(STATES))
        started = state != "PENDING" and draw(st.booleans())
        start = NOW - timedelta(minutes=draw(st.integers(1, 99))) if started else None
        nodes = draw(st.sampled_from([["gpu01"], ["gpu01", "gpu02"], []])) if started else []
        made = job(
            job_id,
            draw(st.sampled_from(["wrap", "a-much-longer-name", ""])),
            state,
            nodes=nodes,
            num_nodes=max(len(nodes), 1),
            num_cpus=draw(st.integers(0, 130)),
            start=start,
            end=None if start is None or state == "RUNNING" else NOW,
            exit_code=draw(st.integers(0, 3)),
            signal=draw(st.sampled_from([0, 9, 15])),
            time_limit_min=draw(st.sampled_from([None, 1, 600])),
        )
        if start is not None and draw(st.booleans()):
            made["allocation"] = {n: {"cpus": draw(st.integers(1, 64))} for n in nodes}
        out.append(made)
    return out


fields = st.lists(
    st.tuples(st.sampled_from(sorted(FIELDS)), st.sampled_from(["", "%0", "%3", "%-7", "%25"])),
    min_size=1,
    max_size=6,
).map(lambda chosen: ",".join(name + width for name, width in chosen))


def row_by_row(
    listed: list[sacct_records.Record], text: str, parsable: str, delimiter: str
) -> list[str]:
    """Each row's cells one at a time, read from FIELDS as they say."""
    columns = parse_fields(text)
    table = sacct_records.as_columns([r.job for r in {id(r.job): r for r in listed}.values()])
    index = {jid: i for i, jid in enumerate(table["job_id"])}
    lines = []
    for record in listed:
        j = index[record.job["job_id"]]
        cells = []
        for column in columns:
            _, _, reads, value = FIELDS[column.name]
            view = record.view or {}
            got = [view[n] if n in view else (table.get(n) or [None] * (j + 1))[j] for n in reads]
            if isinstance(value, Rowwise):
                (cell,) = value.fn(NOW.timestamp(), [record.step], *([v] for v in got))
            else:
                cell = value(NOW.timestamp(), record.step, *got)
            if not parsable:
                cell = sacct_format._fixed(lambda c=cell: c, column.width, column.left)()
            cells.append(cell)
        if parsable:
            lines.append(delimiter.join(cells) + (delimiter if parsable == "p" else ""))
        else:
            lines.append("".join(cells))
    return lines


@settings(max_examples=150, deadline=None)
@given(jobs(), fields, st.sampled_from(["", "p", "P"]), st.sampled_from(["|", ",,"]))
def test_a_table_at_a_time_prints_what_row_by_row_prints(
    history: list[dict[str, Any]], text: str, parsable: str, delimiter: str
) -> None:
    listed = records(history, now=NOW, allocations_only=False)
    printed = sacct_records.format_sacct(
        listed, parse_fields(text), header=False, parsable=parsable, delimiter=delimiter
    )
    assert printed == row_by_row(listed, text, parsable, delimiter)
