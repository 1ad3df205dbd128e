"""Live state for the save oracle: numpy/plain trees, torch modules with optimizers, JAX trees,
``PythonState``; the edits a program makes between saves; fresh objects restored from a save.

Each scenario holds ``roots`` (a ``tp.Checkpoint``'s keyword children) and mutates them the way
a user program does: in place (array writes, ``param.copy_``, an optimizer step, appending to a
nested list) and by rebinding (``tree["w"] = new``, ``ckpt.model = new_model``, adding and
removing children). ``scramble`` changes everything at once (what training does right after an
async ``save()`` returns). ``restored(prefix)`` builds fresh live objects of the same structure,
restores the checkpoint into them and captures them with the oracle.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
from oracle import Expected, capture, is_plain

import trackpoint as tp

__all__ = [
    "DTYPES",
    "JaxScenario",
    "NumpyScenario",
    "PlainScenario",
    "TorchScenario",
    "make_array",
]

DTYPES = [
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "int8",
    "int32",
    "int64",
    "uint8",
    "uint64",
    "bool",
    "complex64",
    ">f4",
    ">i8",
    "S4",
    "U3",
    "object",
]
_TEXT = "ab\u00e9\u5b57z"


def _dtype(name: str) -> np.dtype:
    if name in ("bfloat16", "float8_e4m3fn"):
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def make_array(dtype_name: str, shape: tuple[int, ...], seed: int, layout: str) -> np.ndarray:
    """A new array of any bit pattern (NaN payloads, -0.0, subnormals), C-ordered or not."""
    rng = np.random.default_rng(seed)
    full = (*shape[:-1], shape[-1] * 2) if layout == "strided" and shape else shape
    n = int(np.prod(full))
    if dtype_name == "object":
        flat = np.empty(n, dtype=object)
        flat[:] = [rng.bytes(int(rng.integers(0, 6))) for _ in range(n)]
        array = flat.reshape(full)
    elif dtype_name == "S4":
        words = [
            bytes(rng.choice(list(b"xyz\x01\xff"), int(rng.integers(0, 5))).tolist())
            for _ in range(n)
        ]
        array = np.array(words, dtype="S4").reshape(full) if n else np.zeros(full, "S4")
    elif dtype_name == "U3":
        words = ["".join(rng.choice(list(_TEXT), int(rng.integers(0, 4)))) for _ in range(n)]
        array = np.array(words, dtype="U3").reshape(full) if n else np.zeros(full, "U3")
    elif dtype_name == "bool":
        array = rng.integers(0, 2, full).astype(bool)
    else:
        dtype = _dtype(dtype_name)
        array = np.frombuffer(rng.bytes(n * dtype.itemsize), dtype).reshape(full).copy()
    if layout == "strided" and shape:
        return array[..., ::2]
    if layout == "fortran":
        return np.asfortranarray(array)
    return array


def _fresh_array(like: np.ndarray, seed: int) -> np.ndarray:
    name = {"O": "object", "S": "S4", "U": "U3", "b": "bool"}.get(like.dtype.kind)
    if name is None:
        name = like.dtype.str if like.dtype.byteorder == ">" else like.dtype.name
    return make_array(name, like.shape, seed, "c")


def _blank_array(like: np.ndarray) -> np.ndarray:
    if like.dtype.byteorder == ">":  # a restore refuses a big-endian holder: see the test
        return np.zeros(like.shape, like.dtype.newbyteorder("<"))
    if like.dtype == object:
        blank = np.empty(like.shape, dtype=object)
        blank.reshape(-1)[:] = b""
        return blank
    return np.zeros(like.shape, like.dtype)


# -- numpy and plain trees ---------------------------------------------------------------------

_SENTINEL = "\x00blank"


def _blank_tree(value: Any, *, root: bool = False) -> Any:
    """Same structure, every array zero and every plain value a sentinel."""
    if isinstance(value, np.ndarray):
        return _blank_array(value)
    if isinstance(value, tp.PythonState):
        return JsonState()
    if is_plain(value) and not (root and isinstance(value, (dict, list))):
        return _SENTINEL
    if isinstance(value, dict):
        return {k: _blank_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank_tree(v) for v in value]
    raise AssertionError(f"no blank for {type(value).__name__}")


def _containers(tree: Any) -> list[Any]:
    """Every dict and list of a tree that is a tracked container (not a plain value)."""
    found = []
    if isinstance(tree, (dict, list)) and not is_plain(tree):
        found.append(tree)
        for value in tree.values() if isinstance(tree, dict) else tree:
            found.extend(_containers(value))
    return found


def _arrays(tree: Any) -> list[np.ndarray]:
    if isinstance(tree, np.ndarray):
        return [tree]
    if isinstance(tree, dict):
        return [a for v in tree.values() for a in _arrays(v)]
    if isinstance(tree, list):
        return [a for v in tree for a in _arrays(v)]
    return []


def _plain_lists(tree: Any) -> list[Any]:
    """Mutable lists and dicts inside plain values (edited in place by a program)."""
    found: list[Any] = []
    if isinstance(tree, (dict, list)):
        if is_plain(tree):
            found.append(tree)
        for value in tree.values() if isinstance(tree, dict) else tree:
            found.extend(_plain_lists(value))
    return found


class JsonState(tp.PythonState):
    """A ``PythonState`` whose state is a JSON dict."""

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        self.state = state if state is not None else {}

    def serialize(self) -> bytes:
        return json.dumps(self.state, sort_keys=True).encode()

    def deserialize(self, data: bytes) -> None:
        self.state = json.loads(data)


class TreeScenario:
    """numpy arrays and plain values in nested dicts and lists, plus ``PythonState``s."""

    ACTIONS = ("edit", "rebind", "add", "remove", "edit_plain", "rebind_root", "alias")

    def __init__(self, roots: dict[str, Any], new_leaf: Callable[[np.random.Generator], Any]):
        self.roots = roots
        self.new_leaf = new_leaf

    def act(self, action: str, seed: int, ckpt: Any) -> None:
        rng = np.random.default_rng(seed)
        containers = [c for tree in self.roots.values() for c in _containers(tree)]
        if action == "edit":
            arrays = [a for tree in self.roots.values() for a in _arrays(tree) if a.size]
            states = [s for s in self.roots.values() if isinstance(s, JsonState)]
            if arrays:
                target = arrays[int(rng.integers(len(arrays)))]
                target[...] = _fresh_array(target, seed)
            for state in states:
                state.state[f"k{seed % 7}"] = int(rng.integers(-9, 9))
        elif action == "alias" and containers:
            # A view of another value (a transpose, every other element): an in-place edit
            # of either changes both.
            arrays = [a for tree in self.roots.values() for a in _arrays(tree) if a.ndim]
            dicts = [c for c in containers if isinstance(c, dict)]
            if arrays and dicts:
                base = arrays[int(rng.integers(len(arrays)))]
                view = base.T if rng.integers(2) else base[..., ::2]
                dicts[int(rng.integers(len(dicts)))][f"view{seed % 7}"] = view
        elif action == "edit_plain":
            plain = [p for tree in self.roots.values() for p in _plain_lists(tree)]
            if plain:
                target = plain[int(rng.integers(len(plain)))]
                if isinstance(target, list):
                    target.append(int(rng.integers(100)))
                else:
                    target[f"e{seed % 5}"] = [float(rng.standard_normal())]
        elif action in ("rebind", "add") and containers:
            target = containers[int(rng.integers(len(containers)))]
            if isinstance(target, dict):
                keys = list(target)
                key = (
                    keys[int(rng.integers(len(keys)))]
                    if action == "rebind" and keys
                    else f"n{seed % 97}"
                )
                target[key] = self.new_leaf(rng)
            elif action == "rebind" and target:
                target[int(rng.integers(len(target)))] = self.new_leaf(rng)
            else:
                target.append(self.new_leaf(rng))
        elif action == "remove":
            # Only from dicts: tracked lists are append-only (TF's rule; deleting from one
            # fails the next save with a clear error, which loses nothing).
            dicts = [c for c in containers if isinstance(c, dict) and c]
            if dicts:
                target = dicts[int(rng.integers(len(dicts)))]
                del target[list(target)[int(rng.integers(len(target)))]]
        elif action == "rebind_root":
            name = sorted(self.roots)[int(rng.integers(len(self.roots)))]
            old = self.roots[name]
            new: Any
            if isinstance(old, JsonState):
                new = JsonState({"fresh": seed})
            else:
                new = {"r": self.new_leaf(rng), "s": self.new_leaf(rng)}
            self.roots[name] = new
            setattr(ckpt, name, new)

    def scramble(self, seed: int, ckpt: Any) -> None:
        """Change every value right after an async save() returned."""
        rng = np.random.default_rng(seed)
        for tree in self.roots.values():
            for array in _arrays(tree):
                array[...] = _fresh_array(array, int(rng.integers(1 << 30)))
            for plain in _plain_lists(tree):
                if isinstance(plain, list):
                    plain.append("after the call")
                else:
                    plain["after"] = True
            if isinstance(tree, JsonState):
                tree.state["after"] = "the call"
        for action in ("rebind", "add", "remove", "rebind_root"):
            self.act(action, int(rng.integers(1 << 30)), ckpt)

    def restorer(self) -> Callable[[str], Expected]:
        """Fresh objects of today's structure; the returned function restores and captures."""
        blank = {name: _blank_tree(tree, root=True) for name, tree in self.roots.items()}

        def restore(prefix: str) -> Expected:
            tp.Checkpoint(**blank).restore(prefix).assert_existing_objects_matched()
            return capture(blank)

        return restore


def NumpyScenario(roots: dict[str, Any]) -> TreeScenario:  # noqa: N802  (a factory)
    def new_leaf(rng: np.random.Generator) -> Any:
        if rng.integers(3) == 0:
            return {"p": int(rng.integers(-5, 5)), "q": [float(rng.standard_normal())]}
        dtype = DTYPES[int(rng.integers(len(DTYPES)))]
        shape = tuple(int(d) for d in rng.integers(0, 4, int(rng.integers(0, 3))))
        layout = ["c", "fortran", "strided"][int(rng.integers(3))]
        return make_array(dtype, shape, int(rng.integers(1 << 30)), layout)

    return TreeScenario(roots, new_leaf)


def PlainScenario(roots: dict[str, Any]) -> TreeScenario:  # noqa: N802  (a factory)
    def new_leaf(rng: np.random.Generator) -> Any:
        choices: list[Any] = [
            int(rng.integers(-(2**40), 2**40)),
            float(rng.standard_normal()),
            "t\u00e9xt",
            b"\x00b",
            None,
            True,
            (1, "two"),
            [np.float32(rng.standard_normal())],
            {"nested": [1, [2, {}]]},
            np.int64(7),
            [],
        ]
        return choices[int(rng.integers(len(choices)))]

    return TreeScenario(roots, new_leaf)


# -- torch ---------------------------------------------------------------------------------------


def torch_child(kind: str, seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    width = 2 + seed % 3
    if kind == "linear":
        return torch.nn.Linear(width, 3, bias=seed % 2 == 0)
    if kind == "bn":
        return torch.nn.BatchNorm1d(width)
    if kind == "ln":
        return torch.nn.LayerNorm(width)
    if kind == "emb":
        return torch.nn.Embedding(4, width)
    if kind == "seq":
        return torch.nn.Sequential(
            torch.nn.Linear(width, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1, bias=False)
        )
    if kind == "buffers":
        module = torch.nn.Module()
        module.register_buffer("lowp", torch.randn(width).to(torch.bfloat16))
        module.register_buffer("count", torch.tensor(seed, dtype=torch.int64))
        module.register_buffer("mask", torch.rand(width) > 0.5)
        module.register_buffer("scratch", torch.zeros(2), persistent=False)
        return module
    if kind == "param":
        module = torch.nn.Module()
        module.weight = torch.nn.Parameter(torch.randn(width, 2))
        return module
    raise AssertionError(kind)


TORCH_CHILDREN = ("linear", "bn", "ln", "emb", "seq", "buffers", "param")
OPTIMIZERS = ("adam", "adamw", "sgd_momentum", "sgd", "rmsprop")


def make_optimizer(kind: str, params: Any) -> Any:
    import torch

    params = list(params)
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.01)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=0.01, betas=(0.8, 0.9))
    if kind == "sgd_momentum":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1)
    if kind == "rmsprop":
        return torch.optim.RMSprop(params, lr=0.01, centered=True)
    raise AssertionError(kind)


def make_net(children: list[tuple[str, str, int]]) -> Any:
    import torch

    net = torch.nn.Module()
    for name, kind, seed in children:
        setattr(net, name, torch_child(kind, seed))
    return net


class TorchScenario:
    """A module of varied children and an optimizer over its parameters."""

    ACTIONS = (
        "step",
        "edit",
        "rebind_child",
        "rebind_buffer",
        "add_child",
        "remove_child",
        "rebind_root",
        "tie",
        "strided_buffer",
    )

    def __init__(self, children: list[tuple[str, str, int]], optimizer: str) -> None:
        self.optimizer_kind = optimizer
        model = make_net(children)
        if not list(model.parameters()):  # torch refuses an empty optimizer
            model.keep = torch_child("linear", 0)
        self.roots: dict[str, Any] = {
            "model": model,
            "opt": make_optimizer(optimizer, model.parameters()),
        }

    def _new_optimizer(self, ckpt: Any) -> None:
        if not list(self.roots["model"].parameters()):  # torch refuses an empty optimizer
            self.roots["model"].keep = torch_child("linear", 0)
        self.roots["opt"] = make_optimizer(self.optimizer_kind, self.roots["model"].parameters())
        ckpt.opt = self.roots["opt"]

    def step(self, seed: int) -> None:
        import torch

        model, opt = self.roots["model"], self.roots["opt"]
        torch.manual_seed(seed)
        opt.zero_grad()
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            return
        loss = sum(((p.float() - torch.randn_like(p.float())) ** 2).sum() for p in params)
        loss.backward()  # type: ignore[union-attr]
        opt.step()

    def act(self, action: str, seed: int, ckpt: Any) -> None:
        import torch

        rng = np.random.default_rng(seed)
        model = self.roots["model"]
        names = [n for n, _ in model.named_children()]
        if action == "step":
            self.step(seed)
        elif action == "edit":
            tensors = list(model.state_dict(keep_vars=True).values())
            for state in self.roots["opt"].state.values():
                tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
            tensors = [t for t in tensors if t.numel()]
            if tensors:
                target = tensors[int(rng.integers(len(tensors)))]
                with torch.no_grad():
                    if target.dtype == torch.bool:
                        target.logical_not_()
                    else:
                        target.add_(torch.ones_like(target) * 3)
        elif action == "rebind_child" and names:
            name = names[int(rng.integers(len(names)))]
            setattr(model, name, torch_child(TORCH_CHILDREN[seed % len(TORCH_CHILDREN)], seed))
            self._new_optimizer(ckpt)
        elif action == "rebind_buffer":
            holders = [m for m in model.modules() if "lowp" in m._buffers]
            for holder in holders:
                holder.lowp = torch.randn(1 + seed % 4).to(torch.bfloat16)
                holder.count = torch.tensor(-seed, dtype=torch.int64)
        elif action == "tie" and names:  # one module reachable by two names (tied weights)
            setattr(model, f"tied{seed % 3}", getattr(model, names[int(rng.integers(len(names)))]))
        elif action == "strided_buffer":  # a non-contiguous tensor, edited in place later
            torch.manual_seed(seed)
            model.register_buffer(f"strided{seed % 3}", torch.randn(3, 4).T[:, ::2])
        elif action == "add_child":
            setattr(model, f"extra{seed % 5}", torch_child("linear", seed))
        elif action == "remove_child" and names:
            delattr(model, names[int(rng.integers(len(names)))])
            self._new_optimizer(ckpt)
        elif action == "rebind_root":
            self.roots["model"] = make_net([("fresh", "linear", seed), ("b", "buffers", seed)])
            ckpt.model = self.roots["model"]
            self._new_optimizer(ckpt)
            self.step(seed)

    def scramble(self, seed: int, ckpt: Any) -> None:
        import torch

        with torch.no_grad():
            for tensor in self.roots["model"].state_dict(keep_vars=True).values():
                if tensor.dtype == torch.bool:
                    tensor.logical_not_()
                else:
                    tensor.add_(torch.ones_like(tensor) * 7)
        self.step(seed)
        for action in ("rebind_buffer", "add_child", "rebind_root"):
            self.act(action, seed + 1, ckpt)

    def restorer(self) -> Callable[[str], Expected]:
        """Fresh objects of today's structure; the returned function restores and captures."""
        import torch

        model, opt = self.roots["model"], self.roots["opt"]
        fresh = copy.deepcopy(model)
        with torch.no_grad():
            for tensor in fresh.state_dict(keep_vars=True).values():
                tensor.zero_()
        names = {id(p): n for n, p in model.named_parameters()}
        params = [fresh.get_parameter(names[id(p)]) for g in opt.param_groups for p in g["params"]]
        fresh_opt = make_optimizer(self.optimizer_kind, params)

        def restore(prefix: str) -> Expected:
            tp.Checkpoint(model=fresh, opt=fresh_opt).restore(
                prefix
            ).assert_existing_objects_matched()
            return capture({"model": fresh, "opt": fresh_opt})

        return restore


# -- JAX -----------------------------------------------------------------------------------------

JAX_DTYPES = ("float32", "bfloat16", "float16", "int32", "uint8", "bool", "int8")


def jax_leaf(rng: np.random.Generator) -> Any:
    import jax.numpy as jnp

    dtype = JAX_DTYPES[int(rng.integers(len(JAX_DTYPES)))]
    shape = tuple(int(d) for d in rng.integers(0, 4, int(rng.integers(0, 3))))
    return jnp.asarray(make_array(dtype, shape, int(rng.integers(1 << 30)), "c"))


class JaxScenario:
    """A JAX parameter tree, an optax state over it and a step counter; every update rebinds."""

    ACTIONS = ("optax_step", "rebind_leaf", "add", "remove", "rebind_root")

    def __init__(self, params: dict[str, Any], with_optax: bool) -> None:
        import jax.numpy as jnp

        self.roots: dict[str, Any] = {"params": params, "step": jnp.asarray(0, jnp.int32)}
        self.with_optax = with_optax
        if with_optax:
            self._init_optax(0)

    def _init_optax(self, seed: int) -> None:
        import jax.numpy as jnp
        import optax

        self.tx = optax.adam(0.01)
        weights = {"w": jnp.linspace(-1, 1 + seed, 6).reshape(2, 3), "b": jnp.zeros(3)}
        self.roots["weights"] = weights
        self.roots["opt_state"] = self.tx.init(weights)

    def _dicts(self) -> list[dict[str, Any]]:
        found, todo = [], [self.roots["params"]]
        while todo:
            node = todo.pop()
            found.append(node)
            todo.extend(v for v in node.values() if isinstance(v, dict))
        return found

    def act(self, action: str, seed: int, ckpt: Any) -> None:
        import jax
        import jax.numpy as jnp
        import optax

        rng = np.random.default_rng(seed)
        dicts = self._dicts()
        target = dicts[int(rng.integers(len(dicts)))]
        if action == "optax_step" and self.with_optax:
            weights = self.roots["weights"]
            grads = jax.tree_util.tree_map(lambda x: jnp.ones_like(x) * 0.5, weights)
            updates, self.roots["opt_state"] = self.tx.update(grads, self.roots["opt_state"])
            self.roots["weights"] = optax.apply_updates(weights, updates)
            self.roots["step"] = self.roots["step"] + 1
            ckpt.weights = self.roots["weights"]
            ckpt.opt_state = self.roots["opt_state"]
            ckpt.step = self.roots["step"]
        elif action == "rebind_leaf":
            leaves = [k for k, v in target.items() if not isinstance(v, dict)]
            if leaves:
                key = leaves[int(rng.integers(len(leaves)))]
                target[key] = jax_leaf(rng)
        elif action == "add":
            target[f"n{seed % 31}"] = jax_leaf(rng)
        elif action == "remove" and len(target) > 1:  # never empty a dict: see
            # test_a_checkpoint_leaves_a_jax_tree_a_pytree (an empty dict becomes a leaf)
            del target[list(target)[int(rng.integers(len(target)))]]
        elif action == "rebind_root":
            self.roots["params"] = {"w": jax_leaf(rng), "d": {"b": jax_leaf(rng)}}
            ckpt.params = self.roots["params"]
            if self.with_optax:
                self._init_optax(seed % 5)
                ckpt.weights = self.roots["weights"]
                ckpt.opt_state = self.roots["opt_state"]

    def scramble(self, seed: int, ckpt: Any) -> None:
        import jax

        for node in self._dicts():
            for key, value in list(node.items()):
                if not isinstance(value, dict):
                    node[key] = jax.numpy.full_like(value, 1) if value.size else value
        for action in ("optax_step", "add", "rebind_root"):
            self.act(action, seed, ckpt)

    def restorer(self) -> Callable[[str], Expected]:
        """A zero target of today's structure; the returned function restores and captures."""
        import jax

        target = jax.tree_util.tree_map(lambda x: jax.numpy.zeros_like(x), self.roots)
        return lambda prefix: capture(tp.jax.restore(prefix, target))
