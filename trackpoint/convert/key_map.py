"""Key maps: how ``trackpoint convert --map FILE`` renames values between layouts.

A key map is JSON::

    {
      "rename": {"dense/kernel/.ATTRIBUTES/VARIABLE_VALUE": {"to": "fc.weight", "transpose": true},
                 "dense/bias/.ATTRIBUTES/VARIABLE_VALUE": "fc.bias"},
      "rules": [{"pattern": "conv(\\d+)/kernel/\\.ATTRIBUTES/VARIABLE_VALUE",
                 "replacement": "convs.\\1.weight", "transpose": [3, 2, 0, 1]}],
      "drop": ["optimizer/.*", "save_counter/.*"],
      "unmapped": "keep"
    }

A name is looked up in ``rename`` (exact), then matched against ``drop`` and then ``rules`` (in
order; a pattern must match the whole name, ``re.fullmatch``; the replacement uses ``\\1`` /
``\\g<name>`` groups). ``transpose`` is ``true`` (reverse the axes: TF's ``[in, out]`` Dense
kernel → torch's ``[out, in]``) or a permutation (TF's HWIO conv kernel → torch's OIHW is
``[3, 2, 0, 1]``). Names nothing matches are kept under their default name (``"keep"``),
dropped (``"drop"``) or rejected (``"error"``). A flat ``{"old": "new"}`` object is a rename
table.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trackpoint._types import PathLike, fspath
from trackpoint.errors import InvalidArgumentError

__all__ = ["KeyMap", "MapRule"]

_SECTIONS = frozenset({"rename", "rules", "drop", "unmapped"})
_UNMAPPED = ("keep", "drop", "error")


Transpose = tuple[int, ...] | bool | None


def _transpose(value: Any, where: str) -> Transpose:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, Sequence) and all(isinstance(v, int) for v in value):
        if sorted(value) != list(range(len(value))):
            raise InvalidArgumentError(f"{where}: transpose {list(value)} is not a permutation")
        return tuple(value)
    raise InvalidArgumentError(
        f"{where}: transpose must be true, false or a permutation like [1, 0], got {value!r}"
    )


@dataclass(frozen=True, slots=True)
class MapRule:
    """One rename: a whole-name regular expression, its replacement, an optional transpose."""

    pattern: re.Pattern[str]
    replacement: str
    transpose: Transpose = None


def _transposed(name: str, array: Any, transpose: Transpose) -> Any:
    """``array`` with its axes permuted (a strided view, no copy)."""
    if not transpose:
        return array
    array = np.asarray(array)
    if isinstance(transpose, bool):  # True: False returned above
        return array.transpose()
    if len(transpose) != array.ndim:
        raise InvalidArgumentError(
            f"the key map transposes {name!r} with {list(transpose)}, but it has "
            f"{array.ndim} dimensions (shape {list(array.shape)})",
            key=name,
        )
    return array.transpose(transpose)


class _Drop:
    def __repr__(self) -> str:
        return "KeyMap.DROP"


class KeyMap:
    """Renames, transposes and drops of value names (JSON layout in the module docstring).

    Args:
        rename: exact name → new name, or → ``{"to": new name, "transpose": ...}``.
        rules: ``{"pattern", "replacement", "transpose"}`` dicts (or :class:`MapRule`), tried
            in order.
        drop: whole-name patterns of values to leave out.
        unmapped: what happens to names nothing matched: ``"keep"``, ``"drop"`` or ``"error"``.

    Raises:
        InvalidArgumentError: a malformed entry or an invalid regular expression.
    """

    DROP: Any = _Drop()
    """What :meth:`apply` returns for a dropped name."""

    def __init__(
        self,
        rename: Mapping[str, Any] | None = None,
        rules: Sequence[Mapping[str, Any] | MapRule] = (),
        drop: Sequence[str] = (),
        unmapped: str = "keep",
    ) -> None:
        self._renames: dict[str, tuple[str, Transpose]] = {}
        for old, new in (rename or {}).items():
            where = f"key map rename of {old!r}"
            if isinstance(new, str):
                self._renames[old] = (new, None)
            elif isinstance(new, Mapping) and isinstance(new.get("to"), str):
                self._renames[old] = (new["to"], _transpose(new.get("transpose"), where))
            else:
                raise InvalidArgumentError(
                    f"{where}: expected a name or {{\"to\": name, \"transpose\": ...}}, got {new!r}"
                )
        self._rules = tuple(
            rule if isinstance(rule, MapRule) else _rule(rule, i) for i, rule in enumerate(rules)
        )
        self._drop = tuple(_compile(p, f"key map drop pattern {p!r}") for p in drop)
        if unmapped not in _UNMAPPED:
            raise InvalidArgumentError(
                f"key map 'unmapped' must be one of {_UNMAPPED}, got {unmapped!r}"
            )
        self.unmapped = unmapped

    @classmethod
    def from_dict(cls, data: Any) -> KeyMap:
        """A key map from parsed JSON (sections, or a flat rename table)."""
        if not isinstance(data, Mapping):
            raise InvalidArgumentError(
                f"a key map is a JSON object, got {type(data).__name__}"
            )
        if not set(data) & _SECTIONS:
            return cls(rename=data)
        unknown = sorted(set(data) - _SECTIONS)
        if unknown:
            raise InvalidArgumentError(
                f"unknown key map sections {unknown}; expected {sorted(_SECTIONS)}"
            )
        rules = data.get("rules", [])
        drop = data.get("drop", [])
        if not isinstance(rules, list) or not isinstance(drop, list):
            raise InvalidArgumentError("key map 'rules' and 'drop' must be JSON lists")
        return cls(data.get("rename"), rules, drop, data.get("unmapped", "keep"))

    @classmethod
    def load(cls, path: PathLike) -> KeyMap:
        """Read a key map from a JSON file.

        Raises:
            NotFoundError: the file does not exist.
            InvalidArgumentError: it is not a valid key map (names the file).
        """
        from trackpoint.storage import locate

        path_str = fspath(path)
        raw = locate(path_str).storage.read_bytes(path_str)
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidArgumentError(
                f"key map {path_str} is not valid JSON: {exc}", path=path_str
            ) from exc
        try:
            return cls.from_dict(data)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{path_str}: {exc.message}", path=path_str) from exc

    def apply(self, name: str, array: Any) -> tuple[str, Any] | Any | None:
        """``(new name, value)`` for a matched name, :attr:`DROP`, or None if nothing matched."""
        renamed = self._renames.get(name)
        if renamed is not None:
            return renamed[0], _transposed(name, array, renamed[1])
        if any(p.fullmatch(name) for p in self._drop):
            return self.DROP
        for rule in self._rules:
            match = rule.pattern.fullmatch(name)
            if match is not None:
                try:
                    target = match.expand(rule.replacement)
                except (re.error, IndexError) as exc:
                    raise InvalidArgumentError(
                        f"key map rule {rule.pattern.pattern!r}: replacement "
                        f"{rule.replacement!r} fails for {name!r} ({exc})",
                        key=name,
                    ) from exc
                return target, _transposed(name, array, rule.transpose)
        return None


def _compile(pattern: Any, where: str) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise InvalidArgumentError(f"{where}: a pattern must be a string")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise InvalidArgumentError(f"{where} is not a valid regular expression: {exc}") from exc


def _rule(data: Mapping[str, Any], index: int) -> MapRule:
    where = f"key map rule #{index}"
    if not isinstance(data, Mapping) or not isinstance(data.get("replacement"), str):
        raise InvalidArgumentError(
            f"{where}: expected {{\"pattern\": regex, \"replacement\": name}}, got {data!r}"
        )
    pattern = _compile(data.get("pattern"), where)
    return MapRule(pattern, data["replacement"], _transpose(data.get("transpose"), where))
