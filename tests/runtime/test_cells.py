"""posenc.runtime.cells.CellStore: finished cells survive, damaged or foreign files read as missing, a cell is
written once."""

import json
import threading

import pytest

from posenc.runtime.cells import CellStore, cell_digest


def test_put_get_round_trip_and_key_order_does_not_matter(tmp_path):
    store = CellStore(tmp_path / "cells")
    assert store.get({"a": 1}) is None and len(store) == 0
    store.put({"method": "yarn", "length": 4096, "params": {"factor": 2.0}}, {"ppl": 12.5, "hits": [1, 0]})
    assert store.get({"length": 4096, "params": {"factor": 2.0}, "method": "yarn"}) == {"ppl": 12.5, "hits": [1, 0]}
    assert {"method": "yarn", "length": 4096, "params": {"factor": 2.0}} in store
    assert store.get({"method": "yarn", "length": 4096, "params": {"factor": 4.0}}) is None
    assert len(store) == 1
    assert [k for k, _ in store.items()] == [{"length": 4096, "method": "yarn", "params": {"factor": 2.0}}]


def test_truncated_or_foreign_file_reads_as_missing(tmp_path):
    store = CellStore(tmp_path)
    key = {"cell": 1}
    store.put(key, {"v": 1})
    path = store.path(key)
    path.write_text(path.read_text()[:10])  # a torn write (the atomic writer never leaves one)
    assert store.get(key) is None and len(store) == 0
    path.write_text(json.dumps({"key": {"cell": 2}, "value": 5}))  # a file under the wrong name
    assert store.get(key) is None


def test_no_temp_files_left_and_values_overwrite(tmp_path):
    store = CellStore(tmp_path)
    store.put({"k": 1}, 1)
    store.put({"k": 1}, 2)
    assert store.get({"k": 1}) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{cell_digest({'k': 1})}.json"]


@pytest.mark.parametrize("key", [[1, 2], {"x": float("nan")}, {"x": object()}])
def test_bad_keys_are_refused(tmp_path, key):
    with pytest.raises(ValueError, match="cell key"):
        CellStore(tmp_path).get(key)


def test_none_value_is_refused(tmp_path):
    with pytest.raises(ValueError, match="None"):
        CellStore(tmp_path).put({"k": 1}, None)


# --- without Ray ------------------------------------------------------------------------------------------------


def test_put_once_writes_a_cell_once(tmp_path):
    """The first value of a cell is kept: a second write (a retried task, a racing worker) returns False and changes
    nothing; of 8 threads writing one cell at once exactly one writes it; no temp file is left; a broken file under
    the cell's name (not a stored cell) is replaced."""
    store = CellStore(tmp_path)
    key = {"cell": 1}
    assert store.put_once(key, {"v": 1}) is True
    first = store.path(key).stat()
    assert store.put_once(key, {"v": 2}) is False
    assert store.get(key) == {"v": 1} and store.path(key).stat().st_ino == first.st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == [store.path(key).name]
    other = {"cell": 2}
    got, barrier = [], threading.Barrier(8)

    def write(i):
        barrier.wait()
        got.append((store.put_once(other, {"v": i}), i))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for wrote, i in got if wrote]
    assert len(got) == 8 and len(winners) == 1 and store.get(other) == {"v": winners[0]}
    assert len(list(tmp_path.iterdir())) == 2  # two cells, no temp file
    broken = {"cell": 3}
    store.path(broken).write_text("{not json")
    assert store.put_once(broken, {"v": 3}) is True and store.get(broken) == {"v": 3}
    with pytest.raises(ValueError, match="must not be None"):
        store.put_once({"cell": 4}, None)


def _whole(v):
    return isinstance(v["answers"], list)


def test_a_damaged_value_reads_as_missing_and_put_replaces_it(tmp_path):
    """A cell file that parses but whose value lacks a field (``KeyError: 'answers'`` in the run that read it, issue
    50.10) reads as missing under the store's ``check``, like a truncated file, and the next ``put`` replaces it."""
    store = CellStore(tmp_path, check=_whole)
    key = {"cell": 1}
    store.put(key, {"answers": [1]})
    path = store.path(key)
    path.write_text(json.dumps({"key": key, "value": {"answer": [1]}}))  # parses; the value is damaged
    assert store.get(key) is None and key not in store and len(store) == 0
    assert CellStore(tmp_path).get(key) == {"answer": [1]}  # no check: taken as it is
    for damaged in ("not a dict", [1, 2], {"answers": None}):
        path.write_text(json.dumps({"key": key, "value": damaged}))
        assert store.get(key) is None
    assert store.put_once(key, {"answers": [2]})  # a damaged file under the name is not the cell: replaced
    assert store.get(key) == {"answers": [2]} and list(tmp_path.glob(".*.tmp")) == []


def test_remove_stale_temps_removes_the_temp_files_of_cells_only(tmp_path):
    store = CellStore(tmp_path)
    store.put({"cell": 1}, {"v": 1})
    stale = tmp_path / f".{cell_digest({'cell': 2})}.json.x1y2z3.tmp"  # what a killed put leaves
    stale.write_text('{"key": {"cell"')
    other = tmp_path / ".results.json.abc.tmp"
    other.write_text("{}")
    assert store.remove_stale_temps() == [stale]
    assert not stale.exists() and other.exists() and store.get({"cell": 1}) == {"v": 1}
    assert CellStore(tmp_path / "none").remove_stale_temps() == []
