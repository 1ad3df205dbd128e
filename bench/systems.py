"""One small class per checkpointing system; add a row by adding a class to ``SYSTEMS``.

The harness calls, per measurement: ``prepare_save(state)`` (untimed: build the system's own
objects, e.g. tf.Variables), ``save(native, prefix)`` (timed, followed by the harness's fsync of
every written file), ``make_template(specs)`` (untimed: the live model an in-place restore fills),
``restore(prefix, template)`` (timed: values end up materialised in memory) and ``to_numpy``
(untimed: for the bit-exact comparison against the source). Framework imports happen in
``unavailable()`` so a run without TensorFlow still measures the others.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, ClassVar

import numpy as np

from bench.workloads import BF16, TensorSpec, zeros_like_specs

__all__ = [
    "SYSTEMS",
    "System",
    "all_system_classes",
    "from_stored_state",
    "make_systems",
    "to_stored_specs",
    "to_stored_state",
]

State = dict[str, np.ndarray]


class System:
    """Base class: a save/restore pair over a ``{name: ndarray}`` state."""

    key: ClassVar[str]
    label: ClassVar[str]
    group: ClassVar[str] = "peer"  # "trackpoint" | "peer" | "baseline"
    in_place: ClassVar[bool] = False  # restore fills a template instead of allocating
    stores_bf16: ClassVar[bool] = True  # False: bf16 goes in as a raw uint16 view
    has_metadata: ClassVar[bool] = True  # False: shapes/dtypes are kept by the harness
    async_capable: ClassVar[bool] = False
    # Workloads with more tensors get one repetition unless the system is named in --systems.
    max_default_tensors: ClassVar[int | None] = None
    kinds: ClassVar[tuple[str, ...]] = ("tensors",)  # the Workload.kind values it measures
    # False: prepare_save and make_template run again before every repetition (untimed), so
    # each save and restore meets objects no earlier call has touched.
    reuse_objects: ClassVar[bool] = True

    def unavailable(self) -> str | None:
        """Why this system cannot run here ("not installed"), or None."""
        return None

    def prepare_save(self, state: State) -> Any:
        return state

    def save(self, native: Any, prefix: str) -> None:
        raise NotImplementedError

    def make_template(self, specs: tuple[TensorSpec, ...]) -> Any:
        return zeros_like_specs(specs) if self.in_place else None

    def reset_template(self, template: Any) -> None:
        """Zero a reused template so a restore that does nothing cannot pass verification."""
        if isinstance(template, dict):
            for a in template.values():
                a.fill(0)

    def restore(self, prefix: str, template: Any) -> Any:
        raise NotImplementedError

    def to_numpy(self, restored: Any, specs: tuple[TensorSpec, ...]) -> State:
        return restored


# A peer without bf16 support gets bf16 tensors as raw uint16 views (same bytes) and hands
# them back as such; the harness converts at the edge so verification still compares bf16.
_U16 = np.dtype(np.uint16)


def to_stored_state(system: System, state: State) -> State:
    if system.stores_bf16:
        return state
    return {k: v.view(_U16) if v.dtype == BF16 else v for k, v in state.items()}


def to_stored_specs(system: System, specs: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
    if system.stores_bf16:
        return specs
    return tuple(TensorSpec(s.name, s.shape, _U16) if s.dtype == BF16 else s for s in specs)


def from_stored_state(system: System, got: State, specs: tuple[TensorSpec, ...]) -> State:
    if system.stores_bf16:
        return got
    bf16 = {s.name for s in specs if s.dtype == BF16}
    return {k: np.asarray(v).view(BF16) if k in bf16 else v for k, v in got.items()}


# -- trackpoint --------------------------------------------------------------------------------
class TrackpointBundle(System):
    key = "tp-bundle"
    label = "trackpoint (bundle)"
    group = "trackpoint"
    in_place = True

    def unavailable(self) -> str | None:
        try:
            from trackpoint.bundle import BundleReader, BundleWriter  # noqa: F401
        except ImportError as exc:
            return f"not available ({exc})"
        return None

    def save(self, native: State, prefix: str) -> None:
        from trackpoint.bundle import BundleWriter

        writer = BundleWriter(prefix)
        for name, array in native.items():
            writer.add(name, array)
        writer.finish()

    def restore(self, prefix: str, template: State) -> State:
        from trackpoint.bundle import BundleReader

        reader = BundleReader(prefix)
        try:
            for name, out in template.items():
                reader.read_into(name, out)
        finally:
            reader.close()
        return template


def _tp_api() -> tuple[Any, Any]:
    """(Checkpoint, CheckpointOptions): from ``trackpoint`` once exported, else their modules."""
    import trackpoint as tp

    checkpoint = getattr(tp, "Checkpoint", None)
    options = getattr(tp, "CheckpointOptions", None)
    if checkpoint is None:
        from trackpoint.checkpoint.checkpoint import Checkpoint as checkpoint
    if options is None:
        from trackpoint.saving.options import CheckpointOptions as options
    return checkpoint, options


class TrackpointCheckpoint(System):
    key = "tp"
    label = "trackpoint"
    group = "trackpoint"
    in_place = True
    async_capable = True

    def unavailable(self) -> str | None:
        try:
            _tp_api()
        except ImportError as exc:
            return f"not available yet ({exc})"
        return None

    def prepare_save(self, state: State) -> Any:
        return _tp_api()[0](**state)

    def save(self, native: Any, prefix: str) -> None:
        native.write(prefix)

    def write_async(self, native: Any, prefix: str) -> None:
        """Returns once the snapshot is taken; :meth:`sync` waits for the write."""
        native.write(prefix, options=_tp_api()[1](enable_async=True))

    def sync(self, native: Any) -> None:
        native.sync()

    def make_template(self, specs: tuple[TensorSpec, ...]) -> Any:
        arrays = zeros_like_specs(specs)
        return _tp_api()[0](**arrays), arrays

    def reset_template(self, template: Any) -> None:
        super().reset_template(template[1])

    def restore(self, prefix: str, template: Any) -> Any:
        ckpt, arrays = template
        status = ckpt.read(prefix)
        return ckpt, arrays, status

    def to_numpy(self, restored: Any, specs: tuple[TensorSpec, ...]) -> State:
        ckpt, arrays, status = restored
        status.assert_consumed()
        out = {}
        for s in specs:
            # In place into the arrays given, or (should the API wrap them) through the attribute.
            value = getattr(ckpt, s.name, arrays[s.name])
            out[s.name] = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
        return out


class TrackpointDict(System):
    """One ``tp.Checkpoint(state=d)`` over the flat dict, saved and restored again and again
    (a training loop): what stays the same between saves may be reused."""

    key = "tp-dict"
    label = "trackpoint, one Checkpoint(state=dict)"
    group = "trackpoint"
    in_place = True

    def unavailable(self) -> str | None:
        return TrackpointCheckpoint().unavailable()

    def prepare_save(self, state: State) -> Any:
        return _tp_api()[0](state=dict(state))

    def save(self, native: Any, prefix: str) -> None:
        native.write(prefix)

    def make_template(self, specs: tuple[TensorSpec, ...]) -> Any:
        arrays = zeros_like_specs(specs)
        return _tp_api()[0](state=arrays), arrays

    def reset_template(self, template: Any) -> None:
        super().reset_template(template[1])

    def restore(self, prefix: str, template: Any) -> Any:
        ckpt, arrays = template
        ckpt.read(prefix).assert_consumed()
        return arrays

    def to_numpy(self, restored: Any, specs: tuple[TensorSpec, ...]) -> State:
        return dict(restored)


class TrackpointDictFresh(TrackpointDict):
    """A new ``tp.Checkpoint(state=d)`` for every save and every restore: nothing to reuse."""

    key = "tp-dict-fresh"
    label = "trackpoint, fresh Checkpoint(state=dict)"

    def prepare_save(self, state: State) -> Any:
        return dict(state)

    def save(self, native: Any, prefix: str) -> None:
        _tp_api()[0](state=native).write(prefix)

    def make_template(self, specs: tuple[TensorSpec, ...]) -> Any:
        return zeros_like_specs(specs)

    def reset_template(self, template: Any) -> None:
        System.reset_template(self, template)

    def restore(self, prefix: str, template: Any) -> Any:
        _tp_api()[0](state=template).read(prefix).assert_consumed()
        return template


# -- TensorFlow --------------------------------------------------------------------------------
def _tf_unavailable() -> str | None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return "not installed"
    return None


class TFCheckpoint(System):
    key = "tf"
    label = "tf.train.Checkpoint"
    in_place = True
    max_default_tensors = 10_000  # 100k variables: ~80 s per save+restore, minutes of setup

    def unavailable(self) -> str | None:
        return _tf_unavailable()

    def prepare_save(self, state: State) -> Any:
        import tensorflow as tf

        variables = {k: tf.Variable(v, name=k) for k, v in state.items()}
        return tf.train.Checkpoint(**variables)

    def save(self, native: Any, prefix: str) -> None:
        native.write(prefix)

    def make_template(self, specs: tuple[TensorSpec, ...]) -> Any:
        import tensorflow as tf

        variables = {s.name: tf.Variable(tf.zeros(s.shape, s.dtype), name=s.name) for s in specs}
        return tf.train.Checkpoint(**variables), variables

    def reset_template(self, template: Any) -> None:
        import tensorflow as tf

        for v in template[1].values():
            v.assign(tf.zeros_like(v))

    def restore(self, prefix: str, template: Any) -> Any:
        ckpt, variables = template
        status = ckpt.read(prefix)  # eager: existing variables are assigned right here
        return variables, status

    def to_numpy(self, restored: Any, specs: tuple[TensorSpec, ...]) -> State:
        variables, status = restored
        status.assert_consumed()
        return {k: v.numpy() for k, v in variables.items()}


class TFRawBundle(System):
    key = "tf-raw"
    label = "TF SaveV2/RestoreV2"

    def unavailable(self) -> str | None:
        return _tf_unavailable()

    def prepare_save(self, state: State) -> Any:
        import tensorflow as tf

        return list(state), [tf.constant(v) for v in state.values()]

    def save(self, native: Any, prefix: str) -> None:
        import tensorflow as tf

        names, tensors = native
        tf.raw_ops.SaveV2(
            prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
        )

    def make_template(self, specs: tuple[TensorSpec, ...]) -> Any:
        import tensorflow as tf

        return [s.name for s in specs], [tf.as_dtype(s.dtype) for s in specs]

    def reset_template(self, template: Any) -> None:
        pass  # holds no values

    def restore(self, prefix: str, template: Any) -> Any:
        import tensorflow as tf

        names, dtypes = template
        tensors = tf.raw_ops.RestoreV2(
            prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), dtypes=dtypes
        )
        return dict(zip(names, tensors))

    def to_numpy(self, restored: Any, specs: tuple[TensorSpec, ...]) -> State:
        return {k: t.numpy() for k, t in restored.items()}


# -- PyTorch, safetensors, numpy -----------------------------------------------------------------
class TorchSave(System):
    key = "torch"
    label = "torch.save/load"

    def unavailable(self) -> str | None:
        return None if importlib.util.find_spec("torch") else "not installed"

    def prepare_save(self, state: State) -> Any:
        import torch

        def to_torch(a: np.ndarray) -> Any:
            if a.dtype == BF16:  # torch has bf16 but from_numpy does not know ml_dtypes
                return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
            return torch.from_numpy(a)

        return {k: to_torch(v) for k, v in state.items()}

    def save(self, native: Any, prefix: str) -> None:
        import torch

        torch.save(native, prefix + ".pt")

    def restore(self, prefix: str, template: Any) -> Any:
        import torch

        return torch.load(prefix + ".pt", weights_only=True, map_location="cpu")

    def to_numpy(self, restored: Any, specs: tuple[TensorSpec, ...]) -> State:
        import torch

        out = {}
        for k, t in restored.items():
            if t.dtype == torch.bfloat16:
                out[k] = t.view(torch.uint16).numpy().view(BF16)
            else:
                out[k] = t.numpy()
        return out


class Safetensors(System):
    key = "safetensors"
    label = "safetensors (numpy)"

    def unavailable(self) -> str | None:
        return None if importlib.util.find_spec("safetensors") else "not installed"

    def save(self, native: State, prefix: str) -> None:
        from safetensors.numpy import save_file

        save_file(native, prefix + ".safetensors")

    def restore(self, prefix: str, template: Any) -> State:
        from safetensors.numpy import load_file

        return load_file(prefix + ".safetensors")


class NumpyTofile(System):
    key = "numpy"
    label = "numpy tofile/fromfile"
    has_metadata = False

    def save(self, native: State, prefix: str) -> None:
        with open(prefix + ".bin", "wb") as f:
            for array in native.values():
                array.tofile(f)

    def make_template(self, specs: tuple[TensorSpec, ...]) -> Any:
        return specs  # fromfile needs to be told every shape and dtype

    def reset_template(self, template: Any) -> None:
        pass

    def restore(self, prefix: str, template: Any) -> State:
        out = {}
        with open(prefix + ".bin", "rb") as f:
            for s in template:
                count = int(np.prod(s.shape))
                out[s.name] = np.fromfile(f, dtype=s.dtype, count=count).reshape(s.shape)
        return out


class RawCopy(System):
    """The ceiling: the same bytes, one os.write stream from one buffer, one fsync."""

    key = "raw"
    label = "raw copy (os.write+fsync)"
    group = "baseline"
    in_place = True
    has_metadata = False
    _MAX_IO = 1 << 30  # Linux moves at most ~2 GiB per read/write call

    @staticmethod
    def _layout(specs: tuple[TensorSpec, ...]) -> tuple[int, list[tuple[TensorSpec, int]]]:
        offsets, pos = [], 0
        for s in specs:
            offsets.append((s, pos))
            pos += s.nbytes
        return pos, offsets

    def prepare_save(self, state: State) -> Any:
        total = sum(a.nbytes for a in state.values())
        buf = np.empty(total, np.uint8)
        pos = 0
        for a in state.values():
            buf[pos : pos + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            pos += a.nbytes
        return buf

    def save(self, native: np.ndarray, prefix: str) -> None:
        view = memoryview(native).cast("B")
        fd = os.open(prefix + ".raw", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            pos = 0
            while pos < len(view):
                pos += os.write(fd, view[pos : pos + self._MAX_IO])
            os.fsync(fd)
        finally:
            os.close(fd)

    def make_template(self, specs: tuple[TensorSpec, ...]) -> Any:
        total, offsets = self._layout(specs)
        buf = np.empty(total, np.uint8)
        buf.fill(0)
        return buf, offsets

    def reset_template(self, template: Any) -> None:
        template[0].fill(0)

    def restore(self, prefix: str, template: Any) -> Any:
        buf, _ = template
        view = memoryview(buf).cast("B")
        with open(prefix + ".raw", "rb", buffering=0) as f:
            pos = 0
            while pos < len(view):
                n = f.readinto(view[pos : pos + self._MAX_IO])
                if not n:
                    raise EOFError(f"{prefix}.raw is shorter than {len(view)} bytes")
                pos += n
        return template

    def to_numpy(self, restored: Any, specs: tuple[TensorSpec, ...]) -> State:
        buf, offsets = restored
        return {
            s.name: buf[pos : pos + s.nbytes].view(s.dtype).reshape(s.shape) for s, pos in offsets
        }


# -- Orbax (optional: measured when orbax-checkpoint is installed) ------------------------------
class Orbax(System):
    key = "orbax"
    label = "orbax (PyTreeCheckpointer)"
    max_default_tensors = 10_000  # ~1 ms per tensor each way: 100k small tensors take minutes

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("orbax") is None:
            return "not installed"
        if importlib.util.find_spec("orbax.checkpoint") is None:
            return "not installed"
        return None

    def save(self, native: State, prefix: str) -> None:
        import orbax.checkpoint as ocp

        ocp.PyTreeCheckpointer().save(os.path.abspath(prefix + ".orbax"), native)

    def restore(self, prefix: str, template: Any) -> State:
        import orbax.checkpoint as ocp

        restored = ocp.PyTreeCheckpointer().restore(os.path.abspath(prefix + ".orbax"))
        return {k: np.asarray(v) for k, v in restored.items()}


SYSTEMS: tuple[type[System], ...] = (
    TrackpointCheckpoint,
    TrackpointDict,
    TrackpointDictFresh,
    TrackpointBundle,
    TFCheckpoint,
    TFRawBundle,
    TorchSave,
    Safetensors,
    NumpyTofile,
    RawCopy,
    Orbax,
)
"""Row order of every table."""


def all_system_classes() -> tuple[type[System], ...]:
    """:data:`SYSTEMS` and then the ``many`` workload's systems (bench/many.py builds on
    :class:`System`, so it is imported here, late)."""
    from bench.many import MANY_SYSTEMS

    return SYSTEMS + MANY_SYSTEMS


def make_systems(keys: list[str] | None = None) -> list[System]:
    """Instances of the selected systems (all when ``keys`` is None), in table order."""
    classes = all_system_classes()
    known = {cls.key: cls for cls in classes}
    unknown = sorted(set(keys or ()) - set(known))
    if unknown:
        raise SystemExit(f"unknown system(s) {unknown}; choose from {sorted(known)}")
    return [cls() for cls in classes if keys is None or cls.key in keys]
