"""Benchmarks of sage-grpo (not installed): ``common`` (geometries, checkpoints, timing and FLOP counting shared by
the ``benchmark_*.py`` scripts), ``memory`` (saved-activation and CUDA memory measurements against the planner) and
``sp_emulation`` (one Ulysses rank's attention on one device). Run the scripts from the repository root, e.g.
``python benchmarks/benchmark_step.py --help``.
"""
