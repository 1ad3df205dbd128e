"""Converting between TensorFlow checkpoints, torch files and safetensors, with key maps."""

from __future__ import annotations

from trackpoint.convert.convert import FORMATS, ConversionResult, convert, detect_format
from trackpoint.convert.key_map import KeyMap

__all__ = ["FORMATS", "ConversionResult", "KeyMap", "convert", "detect_format"]
