"""``torch.distributed.checkpoint`` folders read without running code from them.

DCP pickles a checkpoint's ``.metadata``: :func:`read_dcp_metadata` unpickles it with an unpickler that only builds
the DCP metadata classes and a few plain types. The non-tensor values a DCP checkpoint stores as bytes (optimizer
hyper-parameters) are loaded by :func:`safe_load_planner`'s planner with ``weights_only=True`` (torch's default
planner uses ``weights_only=False``). :func:`dcp_load` reads a state through both.
"""

import io
import pickle
from pathlib import Path

from sage_grpo.safe_io.reading import CheckpointError, UnsafeFileError, refusal_reason
from sage_grpo.safe_io.writing import PathLike

_DCP_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                              "TensorStorageMetadata", "BytesStorageMetadata",
                                              "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _DCPMetadataUnpickler(pickle.Unpickler):
    """Builds only the classes DCP metadata is made of (and torch dtypes); any other global is refused."""

    def __init__(self, file, source: Path):
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str):
        import torch

        if name in _DCP_METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeFileError(f"refusing to read {self.source}: it names {module}.{name}, which is not part of "
                              "torch.distributed.checkpoint metadata (a crafted file can run code this way). Use a "
                              "checkpoint written by sage-grpo or torch.distributed.checkpoint")

    def persistent_load(self, pid):
        raise UnsafeFileError(f"refusing to read {self.source}: persistent ids are not part of DCP metadata")


def read_dcp_metadata(folder: PathLike):
    """The ``Metadata`` of the DCP checkpoint in ``folder``, unpickled with :class:`_DCPMetadataUnpickler`."""
    from torch.distributed.checkpoint.metadata import Metadata

    path = Path(folder) / ".metadata"
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: {folder} is not a complete torch.distributed.checkpoint folder")
    try:
        metadata = _DCPMetadataUnpickler(io.BytesIO(path.read_bytes()), path).load()
    except UnsafeFileError:
        raise
    except Exception as err:  # truncated or garbled pickle
        raise CheckpointError(f"cannot read {path}: {type(err).__name__}: {str(err)[:200]} (truncated or not DCP "
                              "metadata)") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeFileError(f"refusing to read {path}: it holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


def safe_dcp_reader(folder: PathLike):
    """A ``FileSystemReader`` whose metadata comes from :func:`read_dcp_metadata` (tensor data is already read with
    ``weights_only=True`` by torch)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata = read_dcp_metadata(self.path)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader(str(folder))


def safe_load_planner(allow_partial_load: bool = True):
    """A ``DefaultLoadPlanner`` that loads byte items (non-tensor values) with ``weights_only=True``."""
    import torch
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            # Load with weights_only=True, then hand the default planner (which places the value in the nested state
            # dict, through private helpers) a re-serialisation of that plain data: its own weights_only=False load
            # then only sees what was just written here. The items are small (optimizer hyper-parameters).
            try:
                loaded = torch.load(value, map_location="cpu", weights_only=True)
            except pickle.UnpicklingError as err:
                raise UnsafeFileError(f"refusing to load {read_item.dest_index.fqn} from a DCP checkpoint: it is "
                                      f"not plain data ({refusal_reason(err)})") from None
            value = io.BytesIO()
            torch.save(loaded, value)
            value.seek(0)
            super().load_bytes(read_item, value)

    return SafeLoadPlanner(allow_partial_load=allow_partial_load)


def dcp_load(state: dict, folder: PathLike, *, allow_partial_load: bool = True) -> None:
    """``torch.distributed.checkpoint.load`` into ``state`` in place, through the safe reader and planner."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state, storage_reader=safe_dcp_reader(folder), planner=safe_load_planner(allow_partial_load))
    except CheckpointException as err:  # DCP wraps each rank's exception (with its stack) in a tuple
        causes = [failure[0] if isinstance(failure, tuple) else failure for failure in err.failures.values()]
        for cause in causes:
            if isinstance(cause, CheckpointError):
                raise cause from None
        # a shard (.distcp) that torch's weights-only reader cannot read: truncated, or replaced by another file
        cause = causes[0] if causes else err
        unsafe = isinstance(cause, pickle.UnpicklingError)  # torch's text would suggest weights_only=False: not echoed
        reason = refusal_reason(cause) if unsafe else f"{type(cause).__name__} {str(cause)[:200]!r}"
        raise (UnsafeFileError if unsafe else CheckpointError)(
            f"cannot read the DCP checkpoint {folder}: a shard is not tensor data written by "
            f"torch.distributed.checkpoint ({reason}). Was a .distcp file truncated or replaced? Use another "
            "checkpoint") from None
