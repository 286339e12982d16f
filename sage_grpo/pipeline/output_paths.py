"""Where ``generate.py`` writes its videos (``--output_path``), decided before any model loads.

* A path ending in ``.mp4``: one item is written there; several go to the folder of that path without ``.mp4``, as
  ``sample_{i:03d}_seed_{seed}_{sanitized prompt}.mp4`` (the reference's naming).
* An existing folder, a path ending in ``/``, or a path without an extension: a folder, whatever the number of items,
  holding ``sample_...mp4`` files (the reference writes one item to the path itself, which for a folder or a name
  without extension failed only after sampling; docs/differences.md).
* Any other extension (``.gif``, ``.avi``, ...) and an existing file where a folder is needed are refused in one
  line naming a valid path: every video is an mp4.

Files that already exist at the planned names (a video, or its ``<name>_config.json``) are replaced, as rerunning a
command is expected to; :func:`replaced_files` names them so the plan says so before anything is sampled.
"""

import os
import time
from pathlib import Path
from typing import List, Sequence

from sage_grpo.video_io import sanitize_name

VIDEO_SUFFIX = ".mp4"


def output_paths(output_path: str, items: Sequence, version: str) -> List[Path]:
    """The file of each item (``items``: objects with ``prompt`` and ``seed``); see the module docstring.
    ``output_path`` None or empty: ``./outputs/output_{version}_{YYYY-mm-dd_HH-MM-SS}.mp4``, as the reference."""
    given = output_path or str(Path("outputs") / f"output_{version}_{time.strftime('%Y-%m-%d_%H-%M-%S')}.mp4")
    target = Path(given)
    if target.is_dir() or given.endswith(("/", os.sep)):
        folder = target
    elif target.suffix.lower() == VIDEO_SUFFIX:
        if len(items) == 1:
            return [target]
        folder = target.with_suffix("")
    elif target.suffix:
        raise ValueError(f"--output_path {given}: {target.suffix} is not a video file name; videos are written as "
                         f"mp4: pass {target.with_suffix(VIDEO_SUFFIX)} (one video) or a folder, {given}/")
    else:
        folder = target
    if folder.exists() and not folder.is_dir():  # a file the user keeps
        raise ValueError(f"--output_path {given}: {folder} is an existing file, not a folder to write the videos "
                         f"into; pass {folder}{VIDEO_SUFFIX} for one video, or a new folder such as {folder}_videos/")
    return [folder / f"sample_{i:03d}_seed_{item.seed}_{sanitize_name(item.prompt)}{VIDEO_SUFFIX}"
            for i, item in enumerate(items)]


def replaced_files(paths: Sequence[Path]) -> List[Path]:
    """The planned files (videos and their settings files) that exist already and will be replaced."""
    return [path for path in paths if path.is_file()]
