"""Files a user is handed, read without running code from them, and files written so that a crash leaves them whole.

Pickle-based files can name any Python callable and have it called while loading. Every such file this project reads
goes through this package:

* ``training_state.pt``, ``optimizer.pt``, the prompt-embedding cache: :func:`load_plain`, ``torch.load`` with
  ``weights_only=True`` (tensors, numbers, strings, lists, tuples, dicts, dtypes; the NumPy RNG state that earlier
  versions stored is accepted as a plain array). Anything else is refused with :class:`UnsafeFileError`.
* A sharded checkpoint's ``.metadata`` (``torch.distributed.checkpoint`` pickles it): :func:`read_dcp_metadata`, an
  unpickler that only builds the DCP metadata classes and a few plain types.
* The non-tensor values a DCP checkpoint stores as bytes (optimizer hyper-parameters): :func:`safe_load_planner`
  loads them with ``weights_only=True`` (torch's default planner uses ``weights_only=False``).

safetensors files and YAML (``yaml.SafeLoader``) hold plain data by construction; JSON goes through
:func:`read_json_object`.

The modules: :mod:`~sage_grpo.safe_io.reading` (plain torch files, finite weights, JSON),
:mod:`~sage_grpo.safe_io.dcp` (DCP folders) and :mod:`~sage_grpo.safe_io.writing` (where a command may write, atomic
writes, a full disk). Callers import from the package.
"""

from sage_grpo.safe_io.writing import (DiskFullError, PathLike, atomic_write, check_output_outside_inputs,
                                       disk_full_as_error, disk_full_error, fsync_dir, fsync_tree, is_disk_full,
                                       nbytes_of)
from sage_grpo.safe_io.reading import (MAX_JSON_BYTES, CheckpointError, UnsafeFileError, check_finite, load_plain,
                                       read_json_object, read_weight_map, shard_names)
from sage_grpo.safe_io.dcp import dcp_load, read_dcp_metadata, safe_dcp_reader, safe_load_planner

__all__ = ["MAX_JSON_BYTES", "CheckpointError", "DiskFullError", "PathLike", "UnsafeFileError", "atomic_write",
           "check_finite", "check_output_outside_inputs", "dcp_load", "disk_full_as_error", "disk_full_error",
           "fsync_dir", "fsync_tree", "is_disk_full", "load_plain", "nbytes_of", "read_dcp_metadata",
           "read_json_object", "read_weight_map", "safe_dcp_reader", "safe_load_planner", "shard_names"]
