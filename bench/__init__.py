"""trackpoint's benchmark harness: ``python bench/run.py`` (``make bench``).

Not part of the library. Modules: ``workloads`` (the tensors), ``systems`` (one small class per
checkpointing system), ``measure`` (timing, durability, peak RSS, machine facts), ``report``
(tables, targets, docs/performance.md) and ``run`` (the command line and the interleaved loop).
"""
