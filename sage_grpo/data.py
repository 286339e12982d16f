"""Prompt data: the one prompt-CSV reader (training, validation and generate.py), the group-repeating distributed
sampler, and per-sample seeds.

Layout (reference_spec §2.2, §2.4). With ``B`` prompts per data-parallel rank, ``dp`` ranks and group size ``G``,
one step uses ``U = B*dp/G`` unique prompts. Each epoch permutes the prompt indices (generator seeded ``seed + epoch``),
keeps whole chunks of ``U``, repeats every index ``G`` times consecutively and deals blocks of ``B`` positions to the
ranks in order. So with B=2, G=4 ranks (0, 1) hold two copies each of prompt p0, ranks (2, 3) of p1, and so on.

Seeds: member ``k`` of a group starts from the CSV seed ``s + k`` (``k = i mod G`` when a rank holds whole groups,
``k = rank_in_group*B + i`` when a group spans several ranks), or ``s`` with ``use_same_noise``.

Departure from the reference: the sampler's epoch advances (the reference never calls ``set_epoch``, so its prompt
order repeats every epoch). The sampler is stateless in the global step, so resuming needs only the step counter.
"""

import csv
import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

import torch

from sage_grpo.config.validation import ConfigError, group_layout

DEFAULT_TRAIN_CSV = "assets/demo_train.csv"
DEFAULT_CSV_SEED = 42  # the reference dataset's own default, not --seed


@dataclass(frozen=True)
class PromptItem:
    index: int
    prompt: str
    seed: int
    ref_image_path: str = ""


def _check_image(path: str, where: str) -> None:
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.verify()
    except Exception as err:  # PIL raises many types for unreadable files
        raise ConfigError(f"{where}: reference image {path!r} cannot be read ({type(err).__name__}: {err}). "
                          "Fix the path or leave ref_image_path empty for text-to-video.") from None
    raise ConfigError(f"{where}: ref_image_path {path!r} asks for image-to-video, which sage-grpo does not support "
                      "yet (the 480p_t2v/720p_t2v transformers are text-to-video). Leave ref_image_path empty.")


MAX_PROMPT_BYTES = 16 * 1024  # far above any text encoder's context (the reference crops at 1000 tokens)


def read_prompt_csvs(paths: Optional[Sequence[str]], *, default_seed: int = DEFAULT_CSV_SEED,
                     require_seed: bool = False, notes: Optional[List[str]] = None) -> List[PromptItem]:
    """Read and concatenate prompt CSVs (``prompt`` required; ``index``, ``seed``, ``ref_image_path`` optional;
    column names may carry spaces). A row without a seed gets ``default_seed``.

    Every error names the file (and the row), and a file without prompts is one; rows with an empty prompt are
    skipped and reported in ``notes`` (a list the caller logs), or as a warning when no list is given."""
    items: List[PromptItem] = []
    for path in paths or [DEFAULT_TRAIN_CSV]:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"prompt CSV {path!r} does not exist. Pass an existing file, e.g. {DEFAULT_TRAIN_CSV}")
        try:
            text = file.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as err:
            line = file.read_bytes()[:err.start].count(b"\n") + 1
            raise ConfigError(f"prompt CSV {path!r}, line {line}: not UTF-8 text ({err.reason} at byte {err.start}). "
                              "Save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
        skipped, first = [], len(items)
        try:
            reader = csv.DictReader(io.StringIO(text, newline=""))
            reader.fieldnames = columns = [name.strip() for name in reader.fieldnames or []]
            if "prompt" not in columns:
                raise ConfigError(f"prompt CSV {path!r} has no 'prompt' column (columns: {columns}). The first line "
                                  "must be a header such as: prompt,seed")
            if require_seed and "seed" not in columns:
                raise ConfigError(f"prompt CSV {path!r} needs a 'seed' column")
            for row in reader:
                where = f"{path}, row {reader.line_num}"
                prompt = (row.get("prompt") or "").strip()
                if not prompt:
                    skipped.append(reader.line_num)
                    continue
                if len(prompt.encode("utf-8")) > MAX_PROMPT_BYTES:
                    raise ConfigError(f"{where}: the prompt is {len(prompt.encode('utf-8'))} bytes long, over the "
                                      f"{MAX_PROMPT_BYTES}-byte limit (is a column separator missing?). Shorten it")
                try:
                    index = int(row["index"]) if row.get("index") not in (None, "") else len(items)
                    seed = int(row["seed"]) if row.get("seed") not in (None, "") else default_seed
                except ValueError as err:
                    raise ConfigError(f"{where}: index and seed must be integers ({err})") from None
                image = (row.get("ref_image_path") or "").strip()
                if image:
                    _check_image(image, where)
                items.append(PromptItem(index, prompt, seed, image))
        except csv.Error as err:
            raise ConfigError(f"prompt CSV {path!r}, line {reader.line_num}: {err}") from None
        if skipped:
            shown = ", ".join(map(str, skipped[:10])) + (f" and {len(skipped) - 10} more" if len(skipped) > 10 else "")
            message = f"prompt CSV {path}: {len(skipped)} row(s) with an empty prompt skipped (line {shown})"
            if notes is not None:
                notes.append(message)
            else:
                warnings.warn(message, RuntimeWarning, stacklevel=2)
        if len(items) == first:
            raise ConfigError(f"prompt CSV {path!r} holds no prompts. Add rows under the 'prompt' header.")
    return items


class GroupedPromptSampler:
    """Which prompts rank ``dp_rank`` rolls out at a global step (the reference's RepeatRandomDistributedSampler)."""

    def __init__(self, num_prompts: int, batch_size: int, num_generations: int, dp_size: int, dp_rank: int,
                 seed: int):
        self.batch_size, self.num_generations = batch_size, num_generations
        self.dp_size, self.dp_rank, self.seed = dp_size, dp_rank, seed
        self.prompts_per_step = batch_size * dp_size // num_generations  # U
        self.steps_per_epoch = num_prompts // self.prompts_per_step
        self.num_prompts = num_prompts
        if self.steps_per_epoch == 0:
            raise ConfigError(f"{num_prompts} prompt(s) cannot fill one step, which needs {self.prompts_per_step} "
                              "unique prompts (batch_size x dp / num_generations). Add prompts or shrink the batch.")

    def epoch_and_position(self, step: int) -> tuple:
        return divmod(step, self.steps_per_epoch)

    def indices(self, step: int) -> List[int]:
        """Dataset row indices of this rank's ``batch_size`` samples at global ``step``."""
        epoch, position = self.epoch_and_position(step)
        generator = torch.Generator().manual_seed(self.seed + epoch)
        order = torch.randperm(self.num_prompts, generator=generator)
        chunk = order[position * self.prompts_per_step:(position + 1) * self.prompts_per_step]
        repeated = chunk.repeat_interleave(self.num_generations)  # (B*dp,)
        start = self.dp_rank * self.batch_size
        return repeated[start:start + self.batch_size].tolist()


def sample_seeds(csv_seeds: Sequence[int], num_generations: int, dp_rank: int, batch_size: int,
                 use_same_noise: bool = False) -> List[int]:
    """Initial-noise seeds of this rank's samples (spec §2.4): group members get s, s+1, ..., s+G-1."""
    ranks_per_group, _ = group_layout(batch_size, num_generations)
    seeds = []
    for i, seed in enumerate(csv_seeds):
        if use_same_noise:
            seeds.append(int(seed))
        elif ranks_per_group == 1:
            seeds.append(int(seed) + i % num_generations)
        else:
            seeds.append(int(seed) + (dp_rank % ranks_per_group) * batch_size + i)
    return seeds
