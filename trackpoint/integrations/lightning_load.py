"""``LightningModule.load_from_checkpoint`` for checkpoints ``TrackpointCheckpointIO`` wrote.

Lightning's ``load_from_checkpoint`` opens the path with ``fsspec`` and ``torch.load`` itself,
without a ``CheckpointIO`` or any other hook on the way, so on a trackpoint checkpoint (a
directory) it fails with a bare ``IsADirectoryError``. Two ways that work:

* :func:`load_from_checkpoint`: ``tp.lightning.load_from_checkpoint(Model, path, **kwargs)``
  builds ``Model`` from the saved hyperparameters (``kwargs`` override them), calls its
  ``on_load_checkpoint`` and loads the weights, exactly as Lightning's classmethod does once it
  has the dict (its own ``_load_state`` is reused);
* :class:`TrackpointLoadingMixin`: mixed into the module class, it makes
  ``Model.load_from_checkpoint(path)`` itself accept trackpoint directories (and keeps
  Lightning's behaviour for ``torch.save`` files).
"""

from __future__ import annotations

import os
from typing import Any, TypeVar, cast

from trackpoint._types import PathLike, fspath
from trackpoint.errors import InvalidArgumentError
from trackpoint.integrations.lightning_read import read_checkpoint_dict
from trackpoint.integrations.lightning_state import MapLocation

try:  # the unified package (`pip install lightning`)
    import lightning.pytorch as pl
    from lightning.pytorch.core import saving as _lightning_saving
except ModuleNotFoundError:  # only `pip install pytorch-lightning`
    import pytorch_lightning as pl  # type: ignore[no-redef]
    from pytorch_lightning.core import saving as _lightning_saving  # type: ignore[no-redef]

# Lightning's own steps after reading the dict (private names of lightning 2.x, tested with
# 2.6.6): building the class from the hyperparameters, and reading a torch.save file.
_saving: Any = _lightning_saving

__all__ = ["TrackpointLoadingMixin", "load_from_checkpoint"]

T = TypeVar("T")


def load_from_checkpoint(
    cls: type[T],
    checkpoint_path: PathLike,
    map_location: MapLocation = None,
    hparams_file: PathLike | None = None,
    strict: bool | None = None,
    **kwargs: Any,
) -> T:
    """``cls.load_from_checkpoint(checkpoint_path, ...)`` for a trackpoint checkpoint.

    Example:
        >>> model = tp.lightning.load_from_checkpoint(Model, "ckpts/last.ckpt", lr=0.01)

    Args:
        cls: a ``LightningModule`` or ``LightningDataModule`` subclass.
        checkpoint_path: the checkpoint directory Lightning named (``ckpts/epoch=3.ckpt``).
            A ``torch.save`` file is read by Lightning's own loader, as its classmethod does.
        map_location: where tensors go (as for ``TrackpointCheckpointIO.load_checkpoint``);
            None keeps them on the CPU.
        hparams_file: a ``.yaml`` or ``.csv`` file whose hyperparameters replace the saved ones.
        strict: as Lightning's ``strict`` (None: the module's ``strict_loading``).
        **kwargs: hyperparameters overriding the saved ones, as Lightning's kwargs do.

    Returns:
        The module (its weights loaded, on the device of the loaded tensors) or datamodule.

    Raises:
        NotFoundError: no checkpoint at ``checkpoint_path``.
        InvalidArgumentError: ``cls`` is not a Lightning module class, the checkpoint was
            not written from a Lightning dict, or ``hparams_file`` has another extension.
    """
    if not (
        isinstance(cls, type) and issubclass(cls, (pl.LightningModule, pl.LightningDataModule))
    ):
        raise InvalidArgumentError(
            f"tp.lightning.load_from_checkpoint(cls, ...) needs a LightningModule or "
            f"LightningDataModule class, got {cls!r}"
        )
    path = fspath(checkpoint_path)
    if os.path.isfile(path):  # a torch.save checkpoint: Lightning's own loader reads it
        loaded = _saving._load_from_checkpoint(
            cls, path, map_location=map_location, hparams_file=hparams_file, strict=strict, **kwargs
        )
        return cast(T, loaded)
    checkpoint = read_checkpoint_dict(path, map_location=map_location)
    key = cls.CHECKPOINT_HYPER_PARAMS_KEY
    if hparams_file is not None:
        hparams_path = fspath(hparams_file)
        extension = hparams_path.rsplit(".", 1)[-1].lower()
        if extension == "csv":
            checkpoint[key] = _saving.load_hparams_from_tags_csv(hparams_path)
        elif extension in ("yml", "yaml"):
            checkpoint[key] = _saving.load_hparams_from_yaml(hparams_path)
        else:
            raise InvalidArgumentError(
                f"hparams_file {hparams_path!r} must be a .csv, .yml or .yaml file"
            )
    checkpoint.setdefault(key, {})
    checkpoint[key].update(kwargs)
    if issubclass(cls, pl.LightningDataModule):
        return cast(T, _saving._load_state(cls, checkpoint, **kwargs))
    model: Any = _saving._load_state(cls, checkpoint, strict=strict, **kwargs)
    tensors = [v for v in checkpoint.get("state_dict", {}).values() if hasattr(v, "device")]
    return cast(T, model.to(tensors[0].device) if tensors else model)


class TrackpointLoadingMixin:
    """Makes ``Model.load_from_checkpoint`` read trackpoint checkpoint directories too.

    Example:
        >>> class Model(tp.lightning.TrackpointLoadingMixin, L.LightningModule): ...
        >>> model = Model.load_from_checkpoint("ckpts/last.ckpt")   # a trackpoint directory

    Files (``torch.save`` checkpoints) still go through Lightning's own classmethod.
    """

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: Any,
        map_location: Any = None,
        hparams_file: Any = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """Lightning's ``load_from_checkpoint``, for trackpoint directories as well."""
        if isinstance(checkpoint_path, (str, os.PathLike)) and os.path.isdir(
            fspath(checkpoint_path)
        ):
            return load_from_checkpoint(
                cls, checkpoint_path, map_location, hparams_file, strict, **kwargs
            )
        parent: Any = super()
        return parent.load_from_checkpoint(
            checkpoint_path,
            map_location=map_location,
            hparams_file=hparams_file,
            strict=strict,
            **kwargs,
        )
