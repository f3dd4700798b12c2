"""Named records: dicts in, names kept, lists or dicts out (issue 11, item 9).

Promises: a dict record is stored as its values (never as its keys), under names fixed by
the first one and kept in the metadata under "evalue_store.fields"; the record bytes are
the positional format's; reads are lists unless ``as_dict``; a record that is not a list,
tuple or dict raises EncodeError and appends nothing.
"""

import collections
import io
import json
import os
import pickle
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import evalue_store as evs
from evalue_store import cli
from evalue_store.dataset.fields import FIELDS_KEY
from evalue_store.torch import EValueDataset, ShardedIterableDataset, collate

NAMES = ("tokens", "label", "id")


def named(i):
    return {"tokens": np.arange(i + 1), "label": i, "id": f"ex-{i}"}


def positional(i):
    return [np.arange(i + 1), i, f"ex-{i}"]


def same(got, want):
    assert type(got) is type(want)
    if isinstance(want, dict):
        assert list(got) == list(want)
        got, want = list(got.values()), list(want.values())
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, np.ndarray):
            np.testing.assert_array_equal(g, w)
        else:
            assert g == w


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_dict_records_are_stored_as_their_values(tmp_path, compression):
    path = tmp_path / "n.evs"
    with evs.Writer(path, compression=compression) as w:
        w.append({"tokens": np.arange(4), "label": 3})
        w.extend([{"tokens": np.arange(2), "label": 5}, {"label": 7, "tokens": np.arange(1)}])
        assert w.fields == ("tokens", "label")
    for backend in ("mmap", "pread"):
        ds = evs.open(path, backend=backend)
        assert ds.fields == ("tokens", "label")
        same(ds[0], [np.arange(4), 3])  # lists by default: the values, not the keys
        same(ds[2], [np.arange(1), 7])  # another key order: stored in the names' order
        named_ds = evs.open(path, backend=backend, as_dict=True)
        same(named_ds[0], {"tokens": np.arange(4), "label": 3})
        want = [
            {"tokens": np.arange(4), "label": 3},
            {"tokens": np.arange(2), "label": 5},
            {"tokens": np.arange(1), "label": 7},
        ]
        for got in (list(named_ds), named_ds[:], named_ds.get_many([0, 1, 2])):
            for g, w_ in zip(got, want):
                same(g, w_)
        same(named_ds[np.array([2])][0], want[2])
        assert pickle.loads(pickle.dumps(named_ds))[1]["label"] == 5  # as_dict survives
        assert named_ds.verify().ok


def test_record_bytes_are_the_positional_format(tmp_path):
    with evs.Writer(tmp_path / "n.evs") as w:
        w.extend(named(i) for i in range(5))
    with evs.Writer(tmp_path / "p.evs") as w:
        w.extend(positional(i) for i in range(5))
    a, b = evs.open(tmp_path / "n.evs"), evs.open(tmp_path / "p.evs")
    for i in range(5):
        assert bytes(a.raw(i)) == bytes(b.raw(i))
    assert b.fields is None and FIELDS_KEY not in b.metadata
    with pytest.raises(ValueError, match="field names"):
        evs.open(tmp_path / "p.evs", as_dict=True)


def test_metadata_keeps_both_the_names_and_the_users_keys(tmp_path):
    path = tmp_path / "m.evs"
    with evs.Writer(path, metadata={"task": "demo"}) as w:
        w.append(named(0))
    assert evs.open(path).metadata == {"task": "demo", FIELDS_KEY: list(NAMES)}
    with evs.Writer(path, "a", metadata={"split": "train"}) as w:  # replaces the user part
        w.append(named(1))
    assert evs.open(path).metadata == {"split": "train", FIELDS_KEY: list(NAMES)}
    with evs.Writer(path, "a") as w:  # no metadata given: the file's is kept
        w.append(positional(2))
        w.set_metadata(None)  # removes the user's part only
    ds = evs.open(path)
    assert ds.metadata == {FIELDS_KEY: list(NAMES)} and ds.fields == NAMES
    with evs.Writer(path, "a", metadata={"v": 2}) as w:
        pass  # no record: the names still survive new metadata
    assert evs.open(path).fields == NAMES
    same(evs.open(path, as_dict=True)[2], named(2))


def test_names_fixed_by_the_first_dict_of_a_reopened_file_keep_its_metadata(tmp_path):
    path = tmp_path / "e.evs"
    with evs.Writer(path, metadata={"task": "x"}):
        pass  # an empty file: no names yet
    with evs.Writer(path, "a") as w:
        w.append(named(0))
    assert evs.open(path).metadata == {"task": "x", FIELDS_KEY: list(NAMES)}


def test_later_records_must_match_the_names(tmp_path):
    path = tmp_path / "k.evs"
    with evs.Writer(path) as w:
        w.append(named(0))
        for bad, message in [
            ({"tokens": np.arange(2), "label": 1}, "missing \\['id'\\]"),
            ({**named(1), "extra": 1}, "unknown \\['extra'\\]"),
            ({"a": 1, "b": 2, "c": 3}, "must have the file's fields"),
            (positional(1)[:2], "needs 3 values"),
            ([1, 2, 3, 4], "needs 3 values"),
        ]:
            with pytest.raises(evs.EncodeError, match=message):
                w.append(bad)
        w.append(positional(1))  # a list of the right length is positional
        w.append((np.arange(3), 2, "ex-2"))
        assert len(w) == 3
    with evs.Writer(path, "a") as w:  # mode "a" checks dicts against the stored names
        with pytest.raises(evs.EncodeError, match="missing"):
            w.append({"tokens": np.arange(1)})
        w.append(named(3))
    ds = evs.open(path, as_dict=True)
    assert len(ds) == 4 and [r["label"] for r in ds] == [0, 1, 2, 3]


def test_a_dict_after_unnamed_records_raises(tmp_path):
    path = tmp_path / "u.evs"
    with evs.Writer(path) as w:
        w.append(positional(0))
        with pytest.raises(evs.EncodeError, match="positional"):
            w.append(named(1))
    with evs.Writer(path, "a") as w:
        with pytest.raises(evs.EncodeError, match="positional"):
            w.append(named(1))
        w.append(positional(1))
    assert evs.open(path).fields is None and len(evs.open(path)) == 2


@pytest.mark.parametrize(
    "record",
    [
        (v for v in [1, 2]),
        {1, 2},
        frozenset([1]),
        "ab",
        b"ab",
        np.arange(3),
        7,
        None,
        collections.deque([1, 2]),
        range(3),
        iter([1]),
        {},
        {1: "a"},
    ],
    ids=lambda r: type(r).__name__,
)
def test_other_records_raise_and_append_nothing(tmp_path, record):
    with evs.Writer(tmp_path / "o.evs") as w:
        with pytest.raises(evs.EncodeError, match="record|field"):
            w.append(record)
        with pytest.raises(evs.EncodeError):
            w.extend([record])
        assert len(w) == 0 and w.fields is None
    with evs.ShardWriter(str(tmp_path / "s-{:02d}.evs"), max_records=2) as sw:
        with pytest.raises(evs.EncodeError):
            sw.append(record)
        assert len(sw) == 0


def test_declared_names_in_metadata_carry_over_and_are_checked(tmp_path):
    src = tmp_path / "src.evs"
    with evs.Writer(src, metadata={"task": "t"}) as w:
        w.extend(named(i) for i in range(3))
    ds = evs.open(src)
    with evs.Writer(tmp_path / "copy.evs", metadata=ds.metadata) as w:  # as the CLI copies
        for i in range(len(ds)):
            w.append_raw(ds.raw(i), ds.alignment)
    copy = evs.open(tmp_path / "copy.evs")
    assert copy.fields == NAMES and copy.metadata == ds.metadata
    with evs.Writer(tmp_path / "d.evs", metadata={FIELDS_KEY: ["a", "b"]}) as w:
        w.append([1, 2])  # names declared: a list record is named by them
        with pytest.raises(evs.EncodeError, match="must have"):
            w.append({"x": 1, "y": 2})
        with pytest.raises(evs.EncodeError, match="names the fields"):
            w.set_metadata({FIELDS_KEY: ["c", "d"]})
    assert evs.open(tmp_path / "d.evs", as_dict=True)[0] == {"a": 1, "b": 2}
    for bad in ("ab", [], [1], ["a", "a"]):
        with pytest.raises(evs.EncodeError):
            evs.Writer(tmp_path / "bad.evs", metadata={FIELDS_KEY: bad})
    with pytest.raises(evs.EncodeError, match="names the fields"):  # refused when opened
        evs.Writer(src, "a", metadata={FIELDS_KEY: ["other", "names", "here"]})
    assert evs.open(src).fields == NAMES  # the stored names were not clobbered
    with evs.Writer(src, "a") as w:  # and the file is free again
        w.append(positional(9))


def test_shard_writer_names_every_shard(tmp_path):
    pattern = str(tmp_path / "s-{:02d}.evs")
    with evs.ShardWriter(pattern, max_records=2, metadata={"task": "t"}) as sw:
        sw.append(named(0))
        sw.extend([named(1), positional(2), positional(3), named(4)])  # shard 1: lists only
        assert sw.fields == NAMES
        with pytest.raises(evs.EncodeError, match="missing"):
            sw.append({"tokens": np.arange(1)})
    for k in range(3):
        md = evs.open(pattern.format(k)).metadata
        assert md == {"task": "t", FIELDS_KEY: list(NAMES)}, k
    sharded = evs.open_shards(sw.manifest_path)
    assert sharded.fields == NAMES
    same(sharded[3], positional(3))
    named_shards = evs.open_shards(sw.manifest_path, as_dict=True)
    for i, record in enumerate(named_shards):
        same(record, named(i))
    same(named_shards[[4, 0]][0], named(4))
    same(pickle.loads(pickle.dumps(named_shards))[2], named(2))
    with evs.ShardWriter(pattern, max_records=2, resume=True) as sw:  # names come back
        assert sw.fields == NAMES
        with pytest.raises(evs.EncodeError):
            sw.append({"other": 1})
        sw.append(named(5))
    assert evs.open_shards(sw.manifest_path, as_dict=True)[5]["label"] == 5


def test_shard_writer_refuses_dicts_after_unnamed_shards(tmp_path):
    with evs.ShardWriter(str(tmp_path / "u-{:02d}.evs"), max_records=1) as sw:
        sw.append(positional(0))
        with pytest.raises(evs.EncodeError, match="positional"):
            sw.append(named(1))  # it would start shard 1, named, after unnamed shard 0


def test_torch_adapters_give_dicts_with_tensors(tmp_path):
    with evs.ShardWriter(str(tmp_path / "t-{:02d}.evs"), max_records=3) as sw:
        sw.extend(named(i) for i in range(8))
    ds = EValueDataset(sw.manifest_path, as_dict=True)
    sample = ds[torch.tensor(2)]
    assert list(sample) == list(NAMES) and isinstance(sample["tokens"], torch.Tensor)
    assert sample["label"] == 2 and sample["id"] == "ex-2"
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate)
    batches = list(loader)  # the dataset is pickled into the workers
    assert [b["label"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert batches[0]["id"] == ["ex-0", "ex-1", "ex-2", "ex-3"]
    assert isinstance(batches[0]["tokens"], tuple)  # Padded: lengths differ
    it = ShardedIterableDataset(sw.manifest_path, shuffle=False, as_dict=True)
    assert [s["label"] for s in it] == list(range(8))
    plain = EValueDataset(sw.manifest_path)
    assert isinstance(plain[0], list)
    with pytest.raises(ValueError, match="as_dict"):
        EValueDataset(evs.open_shards(sw.manifest_path), as_dict=True)


def test_train_dictionary_takes_dict_records():
    records = [named(i % 5) for i in range(20)]
    assert evs.train_dictionary(records, size=4096) == evs.train_dictionary(
        [positional(i % 5) for i in range(20)], size=4096
    )


def _cli(*args):
    out = io.StringIO()
    with redirect_stdout(out):
        code = cli.main([str(a) for a in args])
    assert code == 0
    return out.getvalue()


def test_info_and_stats_show_field_names(tmp_path):
    path = tmp_path / "c.evs"
    with evs.Writer(path) as w:
        w.extend(named(i) for i in range(4))
    text = _cli("info", path)
    assert "[0] tokens: " in text and "[2] id: " in text
    report = json.loads(_cli("info", path, "--json"))
    assert [row["field"] for row in report["schema"]] == list(NAMES)
    stats = _cli("stats", path)
    assert "[1] label: Int x4" in stats
    report = json.loads(_cli("stats", path, "--json"))
    assert [p["field"] for p in report["positions"]] == list(NAMES)
    html = tmp_path / "r.html"
    _cli("stats", path, "--html", html)
    assert "Position 0" not in html.read_text() and "tokens" in html.read_text()


def test_raw_records_must_fit_the_names_too(tmp_path):
    with evs.Writer(tmp_path / "p.evs") as w:
        w.append([1, 2])
    raw = evs.open(tmp_path / "p.evs").raw(0)
    with evs.Writer(tmp_path / "n.evs") as w:
        w.append(named(0))
        with pytest.raises(evs.EncodeError, match="needs 3 values"):
            w.append_raw(raw)
        assert len(w) == 1


def _cli_code(*args):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main([str(a) for a in args])
    return code, out.getvalue() + err.getvalue()


def test_cli_copy_compress_and_merge_keep_the_names(tmp_path):
    a, b, c = tmp_path / "a.evs", tmp_path / "b.evs", tmp_path / "c.evs"
    for path in (a, b):
        with evs.Writer(path, metadata={"part": path.name}) as w:
            w.extend(named(i) for i in range(3))
    with evs.Writer(c) as w:
        w.extend({"x": i, "y": i, "z": i} for i in range(3))
    _cli("copy", a, "-o", tmp_path / "copy.evs")
    _cli("compress", a, "-o", tmp_path / "a.evs.zst")
    _cli("merge", a, b, "-o", tmp_path / "ab.evs", "--metadata", '{"v": 1}')
    for out in ("copy.evs", "a.evs.zst", "ab.evs"):
        assert evs.open(tmp_path / out).fields == NAMES, out
    assert evs.open(tmp_path / "ab.evs").metadata == {"v": 1, FIELDS_KEY: list(NAMES)}
    code, text = _cli_code("merge", a, c, "-o", tmp_path / "ac.evs")  # positional then
    assert code == 0 and "name their fields differently" in text
    merged = evs.open(tmp_path / "ac.evs")
    assert merged.fields is None and merged.metadata == {"part": "a.evs"} and len(merged) == 6


def test_a_file_with_unreadable_metadata_still_takes_list_records(tmp_path):
    path = tmp_path / "bad.evs"
    with evs.Writer(path, metadata={"k": "v" * 40}) as w:
        w.append([1])
    ds = evs.open(path)
    at = ds.commit.metadata_offset
    ds.close()
    with open(path, "r+b") as f:  # the metadata block is no longer JSON
        f.seek(at)
        f.write(b"\xff")
    with evs.Writer(path, "a") as w:
        w.append([2])
        with pytest.raises(evs.EncodeError, match="cannot be read"):
            w.append({"a": 1})
    assert [r[0] for r in evs.open(path, verify=False)] == [1, 2]


def test_as_dict_on_an_unnamed_file_raises_and_releases_it(tmp_path):
    path = tmp_path / "p.evs"
    with evs.Writer(path) as w:
        w.append([1])
    before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    for _ in range(20):
        with pytest.raises(ValueError, match="field names"):
            evs.open(path, as_dict=True)
    if before is not None:
        assert len(os.listdir("/proc/self/fd")) <= before + 1


def test_a_field_name_that_is_not_unicode_is_refused_at_once(tmp_path):
    """A dict key with a lone surrogate fixed the names; every commit and close() then
    failed with UnicodeEncodeError, losing every record of the session, valid ones too
    (attacker finding, session 11, seventh run, C04)."""
    path = tmp_path / "s.evs"
    with evs.Writer(path) as w:
        for record in ({"tok\ud800": 1}, {"ok": 1, "\udfff": 2}):
            with pytest.raises(evs.EncodeError, match="not valid Unicode"):
                w.append(record)
        with pytest.raises(evs.EncodeError, match="not valid Unicode"):
            w.extend_columns({"\ud800": np.arange(3)})
        w.extend(named(i) for i in range(3))
    assert len(evs.open(path)) == 3 and evs.open(path).fields == NAMES


def test_names_must_fit_the_records_they_name(tmp_path):
    """Names given in metadata to a file of unnamed records were not checked against them
    (FORMAT.md section 7 rule 3): records of 2 values got 1 or 3 names, and reading them
    as dicts then failed (attacker finding, session 11, seventh run, C05)."""
    path = tmp_path / "lists.evs"
    with evs.Writer(path) as w:
        w.append([1, 2])
    for names in (["only"], ["x", "y"], ["x", "y", "z"]):
        with evs.Writer(path, "a") as w, pytest.raises(evs.EncodeError, match="without names"):
            w.set_metadata({FIELDS_KEY: names, "k": 1})
        with pytest.raises(evs.EncodeError, match="without names"):
            evs.Writer(path, "a", metadata={FIELDS_KEY: names})
    with evs.open(path) as ds:
        assert ds.fields is None and ds.metadata == {} and len(ds) == 1
    with evs.Writer(tmp_path / "new.evs") as w:  # lists of this writer: their counts are known
        w.extend([[1, 2], [3, 4]])
        with pytest.raises(evs.EncodeError, match=r"records of \[2\] values"):
            w.set_metadata({FIELDS_KEY: ["a", "b", "c"]})
        w.set_metadata({FIELDS_KEY: ["a", "b"]})
    assert evs.open(tmp_path / "new.evs", as_dict=True)[1] == {"a": 3, "b": 4}


def test_metadata_keys_that_become_one_json_key_are_refused(tmp_path):
    """json.dumps makes keys strings: {1: 'a', '1': 'b'} was stored with "1" twice, and a
    reader kept one value (attacker finding, session 11, seventh run, C03)."""
    for metadata in ({1: "a", "1": "b"}, {True: 1, "true": 2}, {"x": {None: 1, "null": 2}}):
        with pytest.raises(evs.EncodeError, match="appears twice"):
            evs.Writer(tmp_path / "m.evs", "w", metadata=metadata)
        with evs.Writer(tmp_path / "m.evs", "w") as w, pytest.raises(evs.EncodeError):
            w.set_metadata(metadata)
    with evs.Writer(tmp_path / "m.evs", "w", metadata={0: "cat", 1: "dog"}):
        pass  # int keys alone are fine: they are stored as "0" and "1"
    assert evs.open(tmp_path / "m.evs").metadata == {"0": "cat", "1": "dog"}


@pytest.mark.parametrize("how", ["writer", "shards"])
def test_named_records_salvaged_from_a_crash_take_their_names_again(tmp_path, how):
    """A writer of dicts killed before its first commit leaves records whose names died
    with it: mode "a" and ShardWriter(resume=True) salvaged them unnamed, and the resumed
    loop of the same dicts then failed ("a dict record after records without field
    names"; attacker finding, session 11, seventh run, C09). The first dict now names them
    when its fields fit every salvaged record; else it is refused."""
    import subprocess
    import sys

    path = tmp_path / "s-00000.evs"
    child = f"""
import os, numpy as np, evalue_store as evs
w = evs.ShardWriter({str(tmp_path / "s-{:05d}.evs")!r}, max_records=1000)
for i in range(6):
    w.append({{"tokens": np.arange(i + 1), "label": i, "id": f"ex-{{i}}"}})
w._writer._sink.flush()
os.kill(os.getpid(), 9)
"""
    subprocess.run([sys.executable, "-c", child], check=False)
    with pytest.raises(evs.EncodeError, match=r"records of \[3\] values"):
        with evs.Writer(path, "a") as w:
            w.append({"tokens": np.arange(1), "label": 0})  # two fields: they do not fit
    with evs.open(path) as ds:  # the refused dict's abort left them the tail they were
        assert len(ds) == 0 and ds.uncommitted_bytes > 0
    if how == "writer":
        with evs.Writer(path, "a") as w:
            w.extend(named(i) for i in range(6, 8))
    else:
        with evs.ShardWriter(str(tmp_path / "s-{:05d}.evs"), max_records=1000, resume=True) as w:
            assert len(w) == 6
            w.extend(named(i) for i in range(6, 8))
    with evs.open(path, as_dict=True) as ds:
        assert ds.fields == NAMES and len(ds) == 8
        for i in range(8):
            same(ds[i], named(i))


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_refused_first_dict_leaves_the_salvaged_records_to_be_named(tmp_path, compression):
    """A first dict whose keys come in another order than the crashed writer's is refused;
    the with block's abort then committed the salvaged records unnamed, and no writer could
    name them again (attacker finding, session 13, round 14, C02). They now wait for the
    first commit, and the abort leaves them the tail they were."""
    import subprocess
    import sys

    path = tmp_path / "named.evs"
    child = f"""
import os, numpy as np, evalue_store as evs
w = evs.Writer({str(path)!r}, compression={compression!r})
for i in range(6):
    w.append({{"tokens": np.arange(300000 + i), "label": i, "name": f"r{{i}}"}})
w._sink.flush()
os._exit(0)
"""
    subprocess.run([sys.executable, "-c", child], check=True)
    with pytest.raises(evs.EncodeError, match="in another order"):
        with evs.Writer(path, "a") as w:
            w.append({"label": 99, "tokens": np.arange(2), "name": "new"})
    with evs.open(path) as ds:
        assert len(ds) == 0 and ds.uncommitted_bytes > 0
    with evs.Writer(path, "a") as w:
        w.append({"tokens": np.arange(2), "label": 99, "name": "new"})
    with evs.open(path, as_dict=True) as ds:
        assert ds.fields == ("tokens", "label", "name") and len(ds) >= 2
        assert ds[-1]["label"] == 99 and ds[0]["name"] == "r0"
        assert ds.verify().ok


def test_extend_columns_names_salvaged_records_only_in_their_order(tmp_path):
    """extend_columns fixed the names of records salvaged from a crashed dict writer in
    its keys' order unchecked, where append refuses another order: every salvaged record's
    label was its token tensor (attacker finding, session 13, round 16, C05)."""
    import subprocess
    import sys

    path = tmp_path / "c.evs"
    child = f"""
import os, numpy as np, evalue_store as evs
w = evs.Writer({str(path)!r})
for i in range(4):
    w.append({{"tok": np.full(300000, i, np.int64), "label": i, "name": f"r{{i}}"}})
w._sink.flush()
os._exit(0)
"""
    subprocess.run([sys.executable, "-c", child], check=True)
    swapped = {"label": np.array([7, 8]), "tok": np.zeros((2, 3), np.int64), "name": ["a", "b"]}
    with pytest.raises(evs.EncodeError, match="in another order"):
        with evs.Writer(path, "a") as w:
            w.extend_columns(swapped)
    with evs.Writer(path, "a") as w:
        w.extend_columns({k: swapped[k] for k in ("tok", "label", "name")})
    with evs.open(path, as_dict=True) as ds:
        assert ds.fields == ("tok", "label", "name") and len(ds) == 6
        assert ds[0]["label"] == 0 and ds[0]["tok"].shape == (300000,)
        assert ds[5]["label"] == 8 and ds[5]["name"] == "b"


def test_as_dict_on_a_file_without_names_is_an_evs_error(tmp_path):
    """README: every error is an evs.Error; as_dict on an unnamed file raised a bare
    ValueError (attacker finding, session 13, round 16, C06)."""
    from evalue_store.torch import EValueDataset

    path = tmp_path / "unnamed.evs"
    with evs.Writer(path) as w:
        w.append([np.arange(3), 1])
    for read in (
        lambda: evs.open(path, as_dict=True),
        lambda: evs.open_shards([path], as_dict=True)[0],
        lambda: EValueDataset(path, as_dict=True)[0],
    ):
        with pytest.raises(evs.FormatError, match="as_dict needs field names") as e:
            read()
        assert e.value.code == "fields"


def _killed_with_a_tail(path, records: list, committed: int, **options) -> None:
    """A writer of ``records`` that committed the first ``committed`` and was killed with the
    rest written but not committed (an uncommitted tail)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            w = evs.Writer(path, **options)
            w.extend(records[:committed])
            if committed:
                w.commit()
            w.extend(records[committed:])
            w._sink.flush()
        finally:
            os.kill(os.getpid(), 9)
    os.waitpid(pid, 0)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_names_given_at_reopen_are_checked_before_the_salvage_commits(tmp_path, compression):
    """A tail salvaged by Writer(path, "a", metadata=...) was committed with that metadata
    before its names were checked: 3 names for records of 2 values, or names given to a
    file of unnamed records, were stored (reads as dicts then failed), and a refused call
    still replaced the other keys (attacker findings, session 12, tenth run, C01, C02).
    Now the call is refused first; the tail is left for the next writer to salvage."""
    options = {"compression": compression} if compression else {}
    lists = tmp_path / "lists.evs"
    _killed_with_a_tail(
        lists, [[np.full(3000, i), i] for i in range(6)], 3, metadata={"k": 1}, **options
    )
    only = tmp_path / "only.evs"  # a writer of dicts killed before its first commit
    _killed_with_a_tail(only, [{"a": np.arange(3), "b": i} for i in range(4)], 0, **options)
    named_file = tmp_path / "named.evs"
    dicts = [{"a": np.arange(3), "b": i} for i in range(6)]
    _killed_with_a_tail(named_file, dicts, 3, metadata={"k": 1}, **options)
    cases = [
        (lists, {FIELDS_KEY: ["x", "y", "z"]}, "without names"),
        (lists, {FIELDS_KEY: ["x", "y"], "k": 2}, "without names"),
        (only, {FIELDS_KEY: ["x", "y", "z"]}, r"records of \[2\] values"),
        (named_file, {FIELDS_KEY: ["x", "y"], "k": 2}, "this file's are"),
    ]
    for path, metadata, match in cases:
        before = evs.open(path)
        before_metadata, before_fields, before_len = before.metadata, before.fields, len(before)
        with pytest.raises(evs.EncodeError, match=match):
            evs.Writer(path, "a", metadata=metadata)
        with evs.open(path) as ds:
            assert (ds.metadata, ds.fields, len(ds)) == (before_metadata, before_fields, before_len)
    with evs.Writer(lists, "a") as w:  # the tail is still there to salvage
        assert w.salvage is not None and w.salvage.salvaged_records == 3
    with evs.open(lists) as ds:
        assert len(ds) == 6 and ds.metadata == {"k": 1} and int(ds[5][1]) == 5
    with evs.Writer(only, "a", metadata={FIELDS_KEY: ["a", "b"]}):
        pass  # names that fit the salvaged records name them
    with evs.open(only, as_dict=True) as ds:
        assert ds.fields == ("a", "b") and len(ds) == 4 and int(ds[3]["b"]) == 3


def test_mode_w_through_a_symlink_to_no_file_makes_that_file(tmp_path):
    """Writer(link, "w") on a symlink naming no file raised FileNotFoundError, where mode "a"
    makes the file it names (attacker finding, session 12, tenth run, C04)."""
    link = tmp_path / "link.evs"
    link.symlink_to(tmp_path / "target.evs")
    with evs.Writer(link, "w") as w:
        w.append([1, "x"])
    assert link.is_symlink() and len(evs.open(tmp_path / "target.evs")) == 1


def test_recover_commits_records_salvaged_from_dicts_unnamed(tmp_path):
    """recover appends nothing to name them by (README, "Named records"): after it, only
    lists can be appended; resuming with the dict writer itself names them (attacker
    finding, session 12, tenth run, C03: the README listed recover among the writers that
    name them)."""
    dicts = [{"a": np.arange(3), "b": i} for i in range(4)]
    for path in (tmp_path / "recovered.evs", tmp_path / "resumed.evs"):
        _killed_with_a_tail(path, dicts, 0)
    assert evs.recover(tmp_path / "recovered.evs").salvaged_records == 4
    with evs.Writer(tmp_path / "recovered.evs", "a") as w:
        with pytest.raises(evs.EncodeError, match="after records without field names"):
            w.append(dicts[0])
        w.append([np.arange(3), 4])
    with evs.Writer(tmp_path / "resumed.evs", "a") as w:
        w.append(dicts[0])
    assert evs.open(tmp_path / "resumed.evs", as_dict=True).fields == ("a", "b")


def test_a_dict_whose_keys_would_swap_salvaged_values_is_refused(tmp_path):
    """Records salvaged from a dict writer killed before its first commit are named by the
    first dict appended, in its keys' order: given in another order than the killed
    writer's, its names swapped the salvaged values silently (attacker's remark, session
    12, tenth run). A dict whose values fit the salvaged record only once reordered is now
    refused; in the writer's order it names them."""
    path = tmp_path / "d.evs"
    dicts = [{"tokens": np.arange(4), "label": i, "id": f"ex-{i}"} for i in range(3)]
    _killed_with_a_tail(path, dicts, 0)
    crashed = path.read_bytes()
    swapped = {"label": 3, "tokens": np.arange(4), "id": "ex-3"}
    with pytest.raises(evs.EncodeError, match="in another order"):
        with evs.Writer(path, "a") as w:
            w.append(swapped)
    path.write_bytes(crashed)
    with evs.Writer(path, "a") as w:
        w.append({"tokens": np.arange(4), "label": 3, "id": "ex-3"})
        w.append(swapped)  # once the names are fixed, later dicts go by name
    with evs.open(path, as_dict=True) as ds:
        assert ds.fields == ("tokens", "label", "id") and len(ds) == 5
        assert [ds[i]["label"] for i in range(5)] == [0, 1, 2, 3, 3]


def test_a_field_of_ints_and_doubles_does_not_look_like_another_key_order(tmp_path):
    """A field holding an Int in one record and a Double in the next made a first dict in
    the crashed writer's own key order look like a swap (refused), while a swapped one was
    accepted (attacker finding, session 12, thirteenth run, C02). Numbers are one class."""
    path = tmp_path / "n.evs"
    dicts = [
        {"score": 1, "loss": 2.5, "pad": np.arange(2)},
        {"score": 0.5, "loss": 3, "pad": np.arange(2)},
    ]
    _killed_with_a_tail(path, dicts, 0)
    with evs.Writer(path, "a") as w:
        w.append({"score": 0.25, "loss": 4, "pad": np.arange(2)})
    with evs.open(path, as_dict=True) as ds:
        assert ds.fields == ("score", "loss", "pad") and ds[0]["score"] == 1 and ds[1]["loss"] == 3
