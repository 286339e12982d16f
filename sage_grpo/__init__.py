"""sage-grpo: GRPO post-training of HunyuanVideo-1.5 with the SAGE-GRPO sampler, equalizer and dual trust region.

Layout, low layers first (the order tests/unit/test_architecture.py enforces; each folder in one layer): ``sde`` (one
file per SDE kernel, the SDE table), ``rl`` (advantages, PPO loss, KL, anchor, the KL-controller table, equalizer),
``config`` (typed schema and CLI; its choices read from the tables below it), ``models`` (HunyuanVideo-1.5 loading,
LoRA, VAE decode, tiny checkpoints), ``distributed`` (mesh, FSDP2, Ulysses), ``optim``, ``toy`` (the toy world),
``rewards`` (VideoAlign, toy rewards, reward setup), ``tracking`` (run directory, trackers, plots), ``export``,
``pipeline`` (the sampler: rollout, replay, generation), ``plan`` (the memory planner), ``checkpoint`` and
``resume``, ``trainer``, then ``cli``, ``studies`` (the toy world's pretraining and study) and ``evaluate``.
"""

__version__ = "0.2.0"


def lazy_exports(package: str, exports: dict):
    """``(__getattr__, __dir__)`` for a package whose names are imported when first used (PEP 562): ``exports`` maps
    each name to the package's module that defines it, so importing the package (or a torch-free module of it, such
    as a table of names) imports none of the heavy ones."""
    import importlib
    import sys

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        setattr(sys.modules[package], name, value)  # looked up once
        return value

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
