"""A run's record (ablate/config/record.py), in process (~0 s): one writer, one loader, a schema version."""
import json

import pytest

from ablate.config import record


def test_written_whole_with_its_schema_and_read_back_with_figures_by_key(tmp_path):
    written = record.write(tmp_path, {"tokens_per_s": 12.5, "loss": float("nan"), "comm_bytes_by_dim": {"tp": 8}})
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]          # no temporary file left
    back = record.load(tmp_path)
    assert back.data == written.data and back.schema_version == record.SCHEMA_VERSION and back.kind == "run"
    assert back.tokens_per_s == 12.5 and back.loss is None                   # JSON has no NaN: null
    assert back.figure("comm_bytes_by_dim.tp") == 8 and back.figure("comm_bytes_by_dim.dp") is None
    assert record.update(tmp_path, rerun_of="x")["rerun_of"] == "x" and record.load(tmp_path)["tokens_per_s"] == 12.5


def test_a_record_from_before_the_schema_is_read_and_its_kind_inferred(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"max_batch": 8, "trials": []}))
    old = record.load(tmp_path)
    assert old.schema_version == 0 and old.kind == "max_batch"


@pytest.mark.parametrize("text, says", [
    (None, "no such record"),
    ('{"tokens_per_s": 1', r"cannot be read \(JSONDecodeError"),
    ("[1, 2]", "not a record"),
    ('{"schema_version": 99}', "schema 99, newer than this ablate reads"),
])
def test_a_record_that_cannot_be_read_is_one_line(tmp_path, text, says):
    if text is not None:
        (tmp_path / "summary.json").write_text(text)
    with pytest.raises(record.RecordError, match=says):
        record.load(tmp_path)
