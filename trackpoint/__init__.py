"""trackpoint: TensorFlow-compatible object-based checkpointing without TensorFlow."""
