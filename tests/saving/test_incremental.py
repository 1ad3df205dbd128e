"""Incremental saves (issue 16, docs/incremental.md): unchanged values are hard links to the
previous checkpoint's data files, every checkpoint stays complete on its own, and a value
changed in any way is always written."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest

import trackpoint as tp
from trackpoint.bundle.reader import BundleReader
from trackpoint.errors import InvalidArgumentError
from trackpoint.saving import MaxShardSizePolicy
from trackpoint.saving.change_tracking import content_digest
from trackpoint.storage import LocalStorage, MemoryStorage

INC = tp.CheckpointOptions(incremental=True)
MIB = 1 << 20


def _model(n: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {f"w{i}": rng.random((256, 1024), dtype=np.float32) for i in range(n)}  # 1 MiB


def _data_files(prefix: str) -> list[str]:
    directory, base = os.path.split(prefix)
    return sorted(
        os.path.join(directory, n) for n in os.listdir(directory) if n.startswith(base + ".data-")
    )


def _shared_files(prefix: str) -> list[str]:
    return [path for path in _data_files(prefix) if os.stat(path).st_nlink > 1]


def _read_all(prefix: str) -> dict[str, np.ndarray]:
    with BundleReader(prefix) as reader:
        return {key: reader.read(key) for key in reader.keys()}


def _key(name: str) -> str:
    return f"{name}/.ATTRIBUTES/VARIABLE_VALUE"


def test_unchanged_values_are_linked_and_each_checkpoint_reads_alone(tmp_path) -> None:
    base, adapter = _model(), np.zeros((8, 8), np.float32)
    ckpt = tp.Checkpoint(base=base, adapter=adapter)
    manager = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=None)
    paths = []
    for step in range(1, 4):
        adapter[:] = step
        paths.append(manager.save(options=INC))
    last = paths[-1]
    linked = _shared_files(last)
    assert sum(os.path.getsize(p) for p in linked) >= 3 * MIB  # the frozen base
    # Deleting every other checkpoint by hand never breaks the last one.
    for prefix in paths[:-1]:
        for path in [*_data_files(prefix), prefix + ".index"]:
            os.remove(path)
    got = _read_all(last)
    for name, value in base.items():
        np.testing.assert_array_equal(got[_key(f"base/{name}")], value)
    np.testing.assert_array_equal(got[_key("adapter")], np.full((8, 8), 3, np.float32))
    fresh = {name: np.zeros_like(v) for name, v in base.items()}
    tp.Checkpoint(base=fresh, adapter=np.zeros((8, 8), np.float32)).restore(last)
    for name, value in base.items():
        np.testing.assert_array_equal(fresh[name], value)


def test_write_without_changes_links_every_data_file(tmp_path) -> None:
    ckpt = tp.Checkpoint(base=_model(2), small=np.arange(4.0))
    ckpt.write(str(tmp_path / "a"), INC)
    ckpt.write(str(tmp_path / "b"), INC)
    ckpt.write(str(tmp_path / "c"), INC)  # b's small-values file is reused from here on
    files = _data_files(str(tmp_path / "c"))
    assert files and all(os.stat(path).st_nlink > 1 for path in files)


def test_in_place_change_through_a_numpy_view_is_written(tmp_path) -> None:
    base = _model()
    ckpt = tp.Checkpoint(base=base)
    ckpt.write(str(tmp_path / "a"), INC)
    view = base["w1"][100:102, :3]
    view += 5.0  # same object, same shape, changed through a view
    ckpt.write(str(tmp_path / "b"), INC)
    got = _read_all(str(tmp_path / "b"))
    np.testing.assert_array_equal(got[_key("base/w1")], base["w1"])
    np.testing.assert_array_equal(got[_key("base/w0")], base["w0"])


def test_changed_shape_dtype_and_strings_are_written(tmp_path) -> None:
    holder = tp.Checkpoint(
        v=tp.Variable(np.zeros(3, np.float32)), s=tp.Variable(np.array([b"ab", b"c"], object))
    )
    holder.write(str(tmp_path / "a"), INC)
    holder.v.assign(np.ones(3, np.float32))
    holder.s.assign(np.array([b"ab", b"d"], object))
    holder.write(str(tmp_path / "b"), INC)
    got = _read_all(str(tmp_path / "b"))
    assert got[_key("v")].tolist() == [1.0, 1.0, 1.0]
    assert got[_key("s")].tolist() == [b"ab", b"d"]
    # A value replaced by one of another dtype (same bytes) is written too.
    other = tp.Checkpoint(v=np.zeros(4, np.int32))
    other.write(str(tmp_path / "c"), INC)
    other2 = tp.Checkpoint(v=np.zeros(4, np.float32))
    object.__setattr__(other2, "_self_history", other._self_history)  # same history
    other2.write(str(tmp_path / "d"), INC)
    assert _read_all(str(tmp_path / "d"))[_key("v")].dtype == np.float32


def test_content_digest_is_of_the_stored_form() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert content_digest(a) == content_digest(np.asfortranarray(a))
    assert content_digest(a) == content_digest(a.astype(">f4"))
    assert content_digest(a) != content_digest(a.reshape(4, 3))
    assert content_digest(a) != content_digest(a.view(np.int32))
    assert content_digest(np.array([b"a", b"bc"], object)) != content_digest(
        np.array([b"ab", b"c"], object)
    )


def test_torch_in_place_updates_are_written_even_when_the_version_counter_misses_them(
    tmp_path,
) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
    model[0].requires_grad_(False)  # frozen
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=0.1, fused=True
    )
    ckpt = tp.Checkpoint(model=model, optimizer=optimizer)

    def step() -> None:
        model(torch.ones(2, 64)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    step()
    ckpt.write(str(tmp_path / "a"), INC)
    version = model[1].weight._version
    step()  # the fused kernel leaves _version unchanged
    assert model[1].weight._version == version
    with torch.no_grad():
        model[0].bias.data.add_(1.0)  # .data bypasses the version counter as well
        model[0].weight.numpy()[0, 0] = 42.0  # and so does a numpy view
    ckpt.write(str(tmp_path / "b"), INC)
    got = _read_all(str(tmp_path / "b"))
    for name, tensor in model.state_dict().items():
        key = f"model/{name.replace('.', '/')}/.ATTRIBUTES/VARIABLE_VALUE"
        if key in got:
            np.testing.assert_array_equal(got[key], tensor.numpy())
    keys = [k for k in got if "exp_avg" in k and "OPTIMIZER_SLOT" in k]
    assert keys
    state = optimizer.state[model[1].weight]
    stored = [got[k] for k in keys if got[k].shape == tuple(state["exp_avg"].shape)]
    assert any(np.array_equal(s, state["exp_avg"].numpy()) for s in stored)


@pytest.mark.parametrize("trust", [False, True])
def test_unchanged_jax_arrays_are_linked(tmp_path, trust) -> None:
    jnp = pytest.importorskip("jax.numpy")
    options = tp.CheckpointOptions(incremental=True, trust_immutable_arrays=trust)
    state = {"frozen": jnp.ones((512, 1024)), "step": jnp.zeros(())}
    ckpt = tp.Checkpoint(state=state)
    ckpt.write(str(tmp_path / "a"), options)
    state["step"] = state["step"] + 1  # rebinding: a new array
    state["frozen"] = state["frozen"] + 0  # a new array of the same bytes: linked if hashed
    ckpt.write(str(tmp_path / "b"), options)
    got = _read_all(str(tmp_path / "b"))
    assert float(got[_key("state/step")]) == 1.0
    shared = [p for p in _shared_files(str(tmp_path / "b")) if os.path.getsize(p) >= 2 * MIB]
    assert bool(shared) is not trust  # identity: a new object is written again


def test_jax_array_changed_in_place_through_dlpack_is_written(tmp_path) -> None:
    """Issue 27 finding 14: a CPU jax.Array written in place through DLPack is saved with its
    new value by default; ``trust_immutable_arrays=True`` trusts identity and (as documented)
    keeps the old bytes."""
    jnp = pytest.importorskip("jax.numpy")
    torch = pytest.importorskip("torch")
    state = {"w": jnp.zeros((256, 1024), jnp.float32)}  # 1 MiB: a data file of its own
    ckpt = tp.Checkpoint(state=state)
    ckpt.write(str(tmp_path / "a"), INC)
    torch.from_dlpack(state["w"]).add_(1)  # same jax.Array object, new bytes
    ckpt.write(str(tmp_path / "b"), INC)
    np.testing.assert_array_equal(_read_all(str(tmp_path / "b"))[_key("state/w")], 1.0)
    trusting = tp.CheckpointOptions(incremental=True, trust_immutable_arrays=True)
    ckpt.write(str(tmp_path / "c"), trusting)
    torch.from_dlpack(state["w"]).add_(1)
    ckpt.write(str(tmp_path / "d"), trusting)
    np.testing.assert_array_equal(_read_all(str(tmp_path / "d"))[_key("state/w")], 1.0)
    assert _shared_files(str(tmp_path / "d"))


def test_restored_checkpoint_is_the_baseline(tmp_path) -> None:
    base, adapter = _model(), np.zeros(4, np.float32)
    tp.Checkpoint(base=base, adapter=adapter).write(str(tmp_path / "a"), INC)
    live = {name: np.zeros_like(v) for name, v in base.items()}
    other = np.zeros(4, np.float32)
    ckpt = tp.Checkpoint(base=live, adapter=other)
    ckpt.restore(str(tmp_path / "a")).assert_consumed()
    other += 1
    live["w2"][0, 0] = -1.0  # changed after the restore: must be written
    ckpt.write(str(tmp_path / "b"), INC)
    got = _read_all(str(tmp_path / "b"))
    np.testing.assert_array_equal(got[_key("base/w2")], live["w2"])
    np.testing.assert_array_equal(got[_key("adapter")], other)
    shared = _shared_files(str(tmp_path / "b"))
    assert len([p for p in shared if os.path.getsize(p) == MIB]) == 2  # w0 and w1


def test_tensorflow_reads_an_incremental_checkpoint_after_older_ones_are_deleted(
    tmp_path, tf
) -> None:
    base, adapter = _model(2), np.zeros(16, np.float32)
    ckpt = tp.Checkpoint(base=base, adapter=adapter)
    manager = tp.CheckpointManager(ckpt, tmp_path, max_to_keep=1)
    for step in range(1, 5):
        adapter[:] = step
        manager.save(options=INC)
    latest = manager.latest_checkpoint
    assert manager.checkpoints == [latest]
    assert _shared_files(latest) == []  # the older names are gone; the inodes live on
    assert not any(n.startswith("ckpt-3") for n in os.listdir(tmp_path))
    reader = tf.train.load_checkpoint(latest)
    np.testing.assert_array_equal(reader.get_tensor(_key("base/w1")), base["w1"])
    np.testing.assert_array_equal(reader.get_tensor(_key("adapter")), adapter)
    assert int(reader.get_tensor("save_counter/.ATTRIBUTES/VARIABLE_VALUE")) == 4


def test_async_and_bounded_staging_save_the_values_of_the_call(tmp_path) -> None:
    for name, extra in [("async", {}), ("staged", {"max_staging_bytes": 300_000})]:
        base, adapter = _model(), np.zeros(1000, np.float32)
        ckpt = tp.Checkpoint(base=base, adapter=adapter)
        options = tp.CheckpointOptions(incremental=True, enable_async=True, **extra)
        manager = tp.CheckpointManager(ckpt, tmp_path / name, max_to_keep=2)
        expected = {}
        for step in range(1, 4):
            adapter[:] = step
            path = manager.save(options=options)
            expected[path] = (adapter.copy(), {k: v.copy() for k, v in base.items()})
            adapter[:] = -1  # after the call: must not reach the file
            base["w0"][0, 0] += 1.0 if step == 2 else 0.0
        manager.sync()
        for path in manager.checkpoints:
            got = _read_all(path)
            np.testing.assert_array_equal(got[_key("adapter")], expected[path][0])
            for key, value in expected[path][1].items():
                np.testing.assert_array_equal(got[_key(f"base/{key}")], value)
        assert _shared_files(manager.latest_checkpoint), name
        manager.close()


def test_max_shard_size_policy_limits_hold_and_slices_are_reused(tmp_path) -> None:
    base, adapter = _model(2), np.zeros(10, np.float32)
    policy = MaxShardSizePolicy(300_000)
    options = tp.CheckpointOptions(incremental=True, sharding_policy=policy)
    ckpt = tp.Checkpoint(base=base, adapter=adapter)
    for step, name in enumerate("abc"):
        adapter[:] = step
        ckpt.write(str(tmp_path / name), options)
    prefix = str(tmp_path / "c")
    assert max(os.path.getsize(p) for p in _data_files(prefix)) <= 300_000
    assert len(_shared_files(prefix)) >= 6  # the slices of the two 1 MiB values
    with BundleReader(prefix) as reader:
        assert len(reader.slices(_key("base/w0"))) >= 4
    got = _read_all(prefix)
    np.testing.assert_array_equal(got[_key("base/w1")], base["w1"])
    np.testing.assert_array_equal(got[_key("adapter")], np.full(10, 2, np.float32))
    base["w1"][-1, -1] = 9.0  # one slice's values change: that value is written again
    ckpt.write(str(tmp_path / "d"), options)
    np.testing.assert_array_equal(_read_all(str(tmp_path / "d"))[_key("base/w1")], base["w1"])


def test_previous_checkpoint_deleted_or_replaced_means_a_full_write(tmp_path) -> None:
    base = _model(2)
    ckpt = tp.Checkpoint(base=base)
    ckpt.write(str(tmp_path / "a"), INC)
    for path in [*_data_files(str(tmp_path / "a")), str(tmp_path / "a.index")]:
        os.remove(path)
    ckpt.write(str(tmp_path / "b"), INC)
    assert _shared_files(str(tmp_path / "b")) == []
    # b replaced behind the history's back by another writer: never linked from.
    tp.Checkpoint(base=_model(1)).write(str(tmp_path / "b"))
    ckpt.write(str(tmp_path / "c"), INC)
    assert _shared_files(str(tmp_path / "c")) == []
    np.testing.assert_array_equal(_read_all(str(tmp_path / "c"))[_key("base/w1")], base["w1"])


def test_object_stores_copy_instead_of_linking() -> None:
    storage = MemoryStorage(supports_atomic_rename=False)
    options = tp.CheckpointOptions(incremental=True, storage=storage)
    base, adapter = _model(2), np.zeros(3, np.float32)
    ckpt = tp.Checkpoint(base=base, adapter=adapter)
    ckpt.write("bucket/a", options)
    written = storage.bytes_written
    adapter += 1
    ckpt.write("bucket/b", options)
    assert storage.bytes_copied >= 2 * MIB
    assert storage.bytes_written - written < MIB
    with BundleReader("bucket/b", storage=storage) as bundle:
        np.testing.assert_array_equal(bundle.read(_key("base/w1")), base["w1"])
        np.testing.assert_array_equal(bundle.read(_key("adapter")), adapter)


def test_trust_immutable_arrays_option_is_validated() -> None:
    with pytest.raises(InvalidArgumentError, match="trust_immutable_arrays"):
        tp.CheckpointOptions(incremental=True, trust_immutable_arrays=1)  # type: ignore[arg-type]


def test_incremental_option_is_validated() -> None:
    with pytest.raises(InvalidArgumentError, match="incremental must be a bool"):
        tp.CheckpointOptions(incremental="yes")  # type: ignore[arg-type]


def test_local_link_shares_bytes_and_open_write_never_writes_through_a_link(tmp_path) -> None:
    storage = LocalStorage(fsync=False)
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    storage.write_bytes(src, b"old bytes")
    assert storage.link(src, dst) == "link"
    assert storage.link_count(src) == 2
    storage.write_bytes(dst, b"new")  # breaks the link first
    assert storage.read_bytes(src) == b"old bytes"
    assert storage.link_count(src) == 1


def test_local_link_falls_back_to_a_copy(tmp_path, monkeypatch) -> None:
    storage = LocalStorage(fsync=True)
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    storage.write_bytes(src, b"x" * 100_000)

    def refuse(*args: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", refuse)
    assert storage.link(src, dst) == "copy"
    assert storage.read_bytes(dst) == b"x" * 100_000
    assert storage.link_count(src) == 1


def test_cli_info_reports_shared_bytes(tmp_path, capsys) -> None:
    from trackpoint.cli.main import main

    ckpt = tp.Checkpoint(base=_model(2), adapter=np.zeros(3, np.float32))
    ckpt.write(str(tmp_path / "a"), INC)
    ckpt.write(str(tmp_path / "b"), INC)
    assert main(["info", "--json", str(tmp_path / "b")]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["shared_bytes"] >= 2 * MIB
    assert main(["info", str(tmp_path / "b")]) == 0
    assert "shared with other checkpoints" in capsys.readouterr().out


def test_fsspec_urls_copy_on_the_server() -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    base, adapter = _model(2), np.zeros(3, np.float32)
    ckpt = tp.Checkpoint(base=base, adapter=adapter)
    ckpt.write("memory://inc-test/a", INC)
    adapter += 1
    ckpt.write("memory://inc-test/b", INC)
    names = [p for p in fs.ls("/inc-test", detail=False) if "/b.data-" in p]
    assert len(names) >= 3  # each 1 MiB value in a file of its own, copied from a
    got = tp.load_checkpoint("memory://inc-test/b")
    np.testing.assert_array_equal(got.get_tensor(_key("base/w1")), base["w1"])
    np.testing.assert_array_equal(got.get_tensor(_key("adapter")), adapter)
    fs.rm("/inc-test", recursive=True)


def _damage(path: str, how: str, tmp_path) -> None:
    """Damage data file ``path`` in place; size and mtime kept unless ``how`` is truncation."""
    stat = os.stat(path)
    if how == "flipped":  # one bit, mid-file: bit rot, or a hostile edit
        with open(path, "r+b") as f:
            f.seek(stat.st_size // 2)
            byte = f.read(1)
            f.seek(stat.st_size // 2)
            f.write(bytes([byte[0] ^ 0x10]))
    elif how == "truncated":
        with open(path, "r+b") as f:
            f.truncate(stat.st_size - 4096)
    else:  # replaced by a valid-looking data file of the same size: other values, same layout
        other = {f"w{i}": v + 1.0 for i, v in enumerate(_model().values())}
        tp.Checkpoint(base=other, adapter=np.zeros(16, np.float32)).write(
            str(tmp_path / "other" / "ckpt"), INC
        )
        donor = next(p for p in _data_files(str(tmp_path / "other" / "ckpt"))
                     if os.path.getsize(p) == stat.st_size)  # fmt: skip
        with open(donor, "rb") as src, open(path, "r+b") as dst:
            dst.write(src.read())
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the mtime as it was


@pytest.mark.parametrize("how", ["flipped", "truncated", "replaced"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_damaged_data_file_is_never_linked_forward(tmp_path, caplog, how, mode) -> None:
    """Issue 27 finding 2: a data file of the previous checkpoint damaged in place (same size,
    mtime restored) is not linked into the next one; its values are written from memory, a
    warning names it, and after rotation the newest checkpoint reads back the live values."""
    base, adapter = _model(), np.zeros(16, np.float32)
    ckpt = tp.Checkpoint(base=base, adapter=adapter)
    options = tp.CheckpointOptions(incremental=True, enable_async=mode == "async")
    manager = tp.CheckpointManager(ckpt, tmp_path / "run", max_to_keep=2)
    first = manager.save(options=options)
    manager.sync()
    victim = next(p for p in _data_files(first) if os.path.getsize(p) == MIB)
    _damage(victim, how, tmp_path)
    with caplog.at_level("WARNING", logger="trackpoint.saving.incremental"):
        for step in range(2, 5):
            adapter[:] = step
            manager.save(options=options)
            manager.sync()
    assert manager.checkpoints == [str(tmp_path / "run" / "ckpt-3"),
                                   str(tmp_path / "run" / "ckpt-4")]  # fmt: skip
    for prefix in manager.checkpoints:
        got = _read_all(prefix)
        for name, value in base.items():
            np.testing.assert_array_equal(got[_key(f"base/{name}")], value)
    np.testing.assert_array_equal(_read_all(manager.latest_checkpoint)[_key("adapter")], adapter)
    assert _shared_files(manager.latest_checkpoint)  # the good files are still linked
    assert any(victim in r.getMessage() for r in caplog.records), caplog.text
    manager.close()


def test_damage_to_a_file_shared_by_several_checkpoints_is_not_linked_again(tmp_path) -> None:
    """The damaged inode is every earlier checkpoint's: the next save writes its values."""
    base, adapter = _model(), np.zeros(16, np.float32)
    ckpt = tp.Checkpoint(base=base, adapter=adapter)
    ckpt.write(str(tmp_path / "a"), INC)
    adapter[:] = 1
    ckpt.write(str(tmp_path / "b"), INC)
    victim = next(p for p in _shared_files(str(tmp_path / "b")) if os.path.getsize(p) == MIB)
    _damage(victim, "flipped", tmp_path)
    adapter[:] = 2
    ckpt.write(str(tmp_path / "c"), INC)
    victims = {os.stat(victim).st_ino}
    assert not victims & {os.stat(p).st_ino for p in _data_files(str(tmp_path / "c"))}
    got = _read_all(str(tmp_path / "c"))
    for name, value in base.items():
        np.testing.assert_array_equal(got[_key(f"base/{name}")], value)


def test_verifying_linked_files_checks_strings_and_large_pieces_in_runs(
    tmp_path, monkeypatch
) -> None:
    """Strings are verified as TensorFlow checksums them; a piece larger than a run is
    checksummed in runs whose CRCs are combined (a bit flipped in any run is found)."""
    from trackpoint.saving import incremental, linking

    monkeypatch.setattr(linking, "_RUN_BYTES", 256 << 10)  # 1 MiB values: 4 runs each
    monkeypatch.setattr(linking, "_PARALLEL_BYTES", 0)  # the runs on several threads
    base = _model(2)
    words = np.array([b"alpha", b"beta", b"", b"gamma" * 100], dtype=object)
    ckpt = tp.Checkpoint(base=base, words=tp.Variable(words), adapter=np.zeros(4))
    ckpt.write(str(tmp_path / "a"), INC)
    ckpt.write(str(tmp_path / "b"), INC)  # the small-values file is written once more
    ckpt.write(str(tmp_path / "c"), INC)
    assert len(_shared_files(str(tmp_path / "c"))) == len(_data_files(str(tmp_path / "c")))
    checked: list[list[str | None]] = []
    real = incremental.verify_files

    def spy(*args, **kwargs):
        checked.append(real(*args, **kwargs))
        return checked[-1]

    monkeypatch.setattr(incremental, "verify_files", spy)
    previous = str(tmp_path / "c")
    for offset in (0, MIB // 4 + 5, MIB - 1):  # the first run, a middle one, the last byte
        big = next(p for p in _data_files(previous) if os.path.getsize(p) == MIB)
        with open(big, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 1]))
        previous = str(tmp_path / f"d{offset}")
        ckpt.write(previous, INC)
        assert sum(r is not None for r in checked[-1]) == 1, (offset, checked[-1])
        got = _read_all(previous)
        for name, value in base.items():
            np.testing.assert_array_equal(got[_key(f"base/{name}")], value)
    small = min(_data_files(previous), key=os.path.getsize)
    with open(small, "r+b") as f:
        data = bytearray(f.read())
        at = data.find(b"gamma")
        data[at] ^= 1
        f.seek(0)
        f.write(data)
    ckpt.write(str(tmp_path / "e"), INC)
    assert sum(r is not None for r in checked[-1]) == 1, checked[-1]
    got = _read_all(str(tmp_path / "e"))
    assert list(got[_key("words")]) == list(words)


def test_crc32c_combine_equals_the_crc_of_the_concatenation() -> None:
    from trackpoint.bundle.crc import crc32c
    from trackpoint.saving.linking import crc32c_combine

    rng = np.random.default_rng(3)
    for size_a, size_b in [(0, 5), (7, 0), (100, 1000), (3, 1 << 20), (1 << 16, 12345)]:
        a, b = rng.bytes(size_a), rng.bytes(size_b)
        assert crc32c_combine(crc32c(a), crc32c(b), size_b) == crc32c(a + b)


def test_linked_values_are_verified_by_their_digest_when_they_have_one(
    tmp_path, monkeypatch
) -> None:
    """A value stored whole in one piece is checked by the XXH3 digest of the file's bytes,
    which must equal the digest of the value in memory (no crc32c fallback in the good case);
    a byte changed in the file is found by it."""
    from trackpoint.saving import linking

    base = _model(2)
    ckpt = tp.Checkpoint(base=base)
    ckpt.write(str(tmp_path / "a"), INC)
    got: list[bytes] = []
    real = linking.content_digests

    def spy(arrays):
        got.extend(real(arrays))
        return got[-len(arrays) :] if arrays else []

    monkeypatch.setattr(linking, "content_digests", spy)
    crcs: list[int] = []
    monkeypatch.setattr(linking, "crc32c", lambda data: crcs.append(len(data)) or 0)
    ckpt.write(str(tmp_path / "b"), INC)
    assert {content_digest(v) for v in base.values()} <= set(got)
    assert all(n < MIB for n in crcs), crcs  # the 1 MiB values were never crc-checked
    assert len(_shared_files(str(tmp_path / "b"))) >= 2
