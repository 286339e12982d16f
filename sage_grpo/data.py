"""Prompt data: the one prompt-CSV reader (training, validation and generate.py), the group-repeating distributed
sampler, and per-sample seeds.

Layout (docs/reference.md#prompt-data-and-the-sampler, docs/reference.md#the-rollout). With ``B`` prompts per
data-parallel rank, ``dp`` ranks and group size ``G``, one step uses ``U = B*dp/G`` unique prompts. Each epoch permutes
the prompt indices (generator seeded ``seed + epoch``), keeps whole chunks of ``U``, repeats every index ``G`` times
consecutively and deals blocks of ``B`` positions to the ranks in order. So with B=2, G=4 ranks (0, 1) hold two copies
each of prompt p0, ranks (2, 3) of p1, and so on.

Seeds: member ``k`` of a group starts from the CSV seed ``s + k`` (``k = i mod G`` when a rank holds whole groups,
``k = rank_in_group*B + i`` when a group spans several ranks), or ``s`` with ``use_same_noise``.

Image-to-video: a row whose ``ref_image_path`` names an image (relative to the CSV's folder, or absolute) is an i2v
sample; every image is opened when the CSV is read, so a missing or unreadable one stops the start before any model
loads, naming the file and the row. Each step's batch is one task: the sampler permutes the prompts as before, splits
the permutation by task (each task's rows keep their random order), cuts each task's rows into the step's chunks of
``U`` prompts and shuffles the chunks with the same generator, so a mixed CSV trains both tasks, every rank of a step
holding the same task. A CSV of one task keeps exactly the order it had before i2v existed. (The reference lets the
first row of a batch decide its task and uses that row's image for the whole batch.) An i2v batch is sampled at
:func:`video_size`: the bucket of ``--video_bucket_hw_base_size`` whose aspect ratio is closest to its first image's,
unless a size is given.

Departure from the reference: the sampler's epoch advances (the reference never calls ``set_epoch``, so its prompt
order repeats every epoch). The sampler is stateless in the global step, so resuming needs only the step counter.
"""

import csv
import hashlib
import io
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch

from sage_grpo.config.validation import SEED_LIMIT, ConfigError, group_layout

DEFAULT_TRAIN_CSV = "assets/demo_train.csv"
DEFAULT_CSV_SEED = 42  # the reference dataset's own default, not --seed


@dataclass(frozen=True)
class PromptItem:
    index: int
    prompt: str
    seed: int
    ref_image_path: str = ""  # the reference image of an image-to-video sample (resolved path), "" for text-to-video

    @property
    def task(self) -> str:
        return "i2v" if self.ref_image_path else "t2v"


def check_image(text: str, folder: Path, where: str) -> str:
    """The path of the image ``text`` names (relative to ``folder``), once it decodes; else a ConfigError."""
    from PIL import Image

    path = Path(text).expanduser()
    path = path if path.is_absolute() else Path(folder) / path
    if not path.is_file():
        raise ConfigError(f"{where}: reference image {text!r} does not exist (looked for {path}). Fix the path "
                          "(a CSV's relative paths are read from its folder) or leave it out for text-to-video.")
    try:
        with Image.open(path) as image:
            image.load()
    except Exception as err:  # PIL raises many types for unreadable files
        raise ConfigError(f"{where}: reference image {str(path)!r} cannot be read ({type(err).__name__}: {err}). "
                          "Use a PNG/JPEG/WebP file or leave it out for text-to-video.") from None
    return str(path)


def check_tasks(items: Sequence[PromptItem], transformer_version: str, option: str) -> None:
    """Image-to-video rows need an image-to-video transformer version (text-to-video rows run on either)."""
    from sage_grpo.models.layout import version_task

    first = next((item for item in items if item.task == "i2v"), None)
    if first is not None and version_task(transformer_version) != "i2v":
        raise ConfigError(f"the prompt {first.prompt[:40]!r} has a ref_image_path ({first.ref_image_path}), which "
                          f"needs an image-to-video transformer, but {option} is {transformer_version!r}. Use e.g. "
                          f"{option} {transformer_version.replace('t2v', 'i2v')} (bash download_weights.sh --variant "
                          f"{transformer_version.replace('t2v', 'i2v')}), or leave ref_image_path empty")


def video_size(item: PromptItem, fixed: Optional[Tuple[int, int]], bucket_base: int,
               default: Tuple[int, int]) -> Tuple[int, int]:
    """(H, W) to sample ``item`` at: ``fixed`` when given (an i2v image is then cropped to it), else for an i2v item
    the crop-size bucket of ``bucket_base`` closest to its image's aspect ratio, else ``default``."""
    if fixed is not None:
        return fixed
    if item.task == "i2v":
        from sage_grpo.models.image_condition import closest_bucket, image_size

        return closest_bucket(image_size(item.ref_image_path), bucket_base)
    return default


MAX_PROMPT_BYTES = 16 * 1024  # far above any text encoder's context (the reference crops at 1000 tokens)


def read_prompt_csvs(paths: Optional[Sequence[str]], *, default_seed: int = DEFAULT_CSV_SEED,
                     require_seed: bool = False, notes: Optional[List[str]] = None) -> List[PromptItem]:
    """Read and concatenate prompt CSVs (``prompt`` required; ``index``, ``seed``, ``ref_image_path`` optional;
    column names may carry spaces). A row without a seed gets ``default_seed``.

    Every error names the file (and the row), and a file without prompts is one; rows with an empty prompt are
    skipped and reported in ``notes`` (a list the caller logs), or as a warning when no list is given."""
    items: List[PromptItem] = []
    for path in paths or [DEFAULT_TRAIN_CSV]:
        first = len(items)
        skipped = _read_prompt_csv(path, items, default_seed, require_seed)
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


def _csv_text(path: str) -> str:
    """The text of the prompt CSV ``path`` (UTF-8, a byte-order mark dropped): a missing file or one that is not
    UTF-8 is one ConfigError naming it (and the line)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"prompt CSV {path!r} does not exist. Pass an existing file, e.g. {DEFAULT_TRAIN_CSV}")
    try:
        return file.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        line = file.read_bytes()[:err.start].count(b"\n") + 1
        raise ConfigError(f"prompt CSV {path!r}, line {line}: not UTF-8 text ({err.reason} at byte {err.start}). "
                          "Save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


def _read_prompt_csv(path: str, items: List[PromptItem], default_seed: int, require_seed: bool) -> List[int]:
    """Append the prompts of the CSV ``path`` to ``items``; returns the lines of the rows skipped for an empty
    prompt."""
    text = _csv_text(path)
    skipped, done = [], 0  # done: the last line of the last complete record
    try:
        # strict: a quote that never closes (or stray text after a closing quote) is an error, not a prompt that
        # swallows the rows after it
        reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
        _check_header(reader, path, require_seed)
        done = reader.line_num
        for row in reader:
            done = reader.line_num
            prompt = (row.get("prompt") or "").strip()
            if not prompt:
                skipped.append(reader.line_num)
                continue
            items.append(_prompt_item(row, prompt, f"{path}, row {reader.line_num}", len(items), default_seed,
                                      Path(path).parent))
    except csv.Error as err:
        hint = (" (a quoted field opens on this line and never closes)" if "unexpected end of data" in str(err)
                else "")
        raise ConfigError(f"prompt CSV {path!r}, line {done + 1}: {err}{hint}. Fix the quoting: a field that "
                          'starts with " ends with ", and a " inside it is written ""') from None
    return skipped


def _check_header(reader: csv.DictReader, path: str, require_seed: bool) -> None:
    """Read the header of ``reader``, its names stripped of spaces, and check it: no column twice, a ``prompt``
    column, and a ``seed`` column when ``require_seed``."""
    reader.fieldnames = columns = [name.strip() for name in reader.fieldnames or []]
    twice = next((name for index, name in enumerate(columns) if name in columns[:index]), None)
    if twice is not None:  # DictReader would keep the last such column and drop the others silently
        raise ConfigError(f"prompt CSV {path!r}, line {reader.line_num}: the header names column {twice!r} twice "
                          f"(columns: {columns}). Keep one, or rename the other")
    if "prompt" not in columns:
        raise ConfigError(f"prompt CSV {path!r} has no 'prompt' column (columns: {columns}). The first line "
                          "must be a header such as: prompt,seed")
    if require_seed and "seed" not in columns:
        raise ConfigError(f"prompt CSV {path!r} needs a 'seed' column")


def _prompt_item(row: dict, prompt: str, where: str, position: int, default_seed: int, folder: Path) -> PromptItem:
    """The item of one CSV row with a non-empty ``prompt`` (``where`` names the file and row): its index (else
    ``position``), its seed (else ``default_seed``) and its reference image (relative to ``folder``), each checked."""
    if len(prompt.encode("utf-8")) > MAX_PROMPT_BYTES:
        raise ConfigError(f"{where}: the prompt is {len(prompt.encode('utf-8'))} bytes long, over the "
                          f"{MAX_PROMPT_BYTES}-byte limit (is a column separator missing?). Shorten it")
    try:
        index = int(row["index"]) if row.get("index") not in (None, "") else position
        seed = int(row["seed"]) if row.get("seed") not in (None, "") else default_seed
    except ValueError as err:
        raise ConfigError(f"{where}: index and seed must be integers ({err})") from None
    if not 0 <= seed < SEED_LIMIT:  # torch's generators stopped the run on it after the models loaded
        raise ConfigError(f"{where}: seed {seed} must be in [0, 2**63)")
    image = (row.get("ref_image_path") or "").strip()
    if image:
        image = check_image(image, folder, where)
    return PromptItem(index, prompt, seed, image)


def prompts_record(items: Sequence[PromptItem]) -> dict:
    """What a checkpoint records of the prompts it was trained on: their number and a SHA-256 of every row in order
    (index, prompt, seed and the reference image's bytes), which decide each step's prompts and noise. Files moved
    elsewhere give the same record; an edited, reordered or other CSV another."""
    digest = hashlib.sha256()
    for item in items:
        image = hashlib.sha256(Path(item.ref_image_path).read_bytes()).hexdigest() if item.ref_image_path else ""
        digest.update(json.dumps([item.index, item.prompt, item.seed, image]).encode() + b"\n")
    return {"count": len(items), "sha256": digest.hexdigest()}


class GroupedPromptSampler:
    """Which prompts rank ``dp_rank`` rolls out at a global step (the reference's RepeatRandomDistributedSampler)."""

    def __init__(self, num_prompts: int, batch_size: int, num_generations: int, dp_size: int, dp_rank: int,
                 seed: int, tasks: Optional[Sequence[str]] = None):
        """``tasks``: each prompt's task ("t2v"/"i2v"); a step's prompts are all of one task (module docstring)."""
        self.batch_size, self.num_generations = batch_size, num_generations
        self.dp_size, self.dp_rank, self.seed = dp_size, dp_rank, seed
        self.prompts_per_step = batch_size * dp_size // num_generations  # U
        self.num_prompts = num_prompts
        tasks = list(tasks) if tasks is not None else ["t2v"] * num_prompts
        self.task_names = sorted(set(tasks))
        self.task_ids = torch.tensor([self.task_names.index(t) for t in tasks], dtype=torch.long)
        counts = [tasks.count(name) for name in self.task_names]
        self.steps_per_epoch = sum(count // self.prompts_per_step for count in counts)
        if self.steps_per_epoch == 0:
            per_task = ", ".join(f"{count} {task}" for task, count in zip(self.task_names, counts))
            raise ConfigError(f"{num_prompts} prompt(s) ({per_task}) cannot fill one step, which needs "
                              f"{self.prompts_per_step} unique prompts of one task (batch_size x dp / "
                              "num_generations). Add prompts or shrink the batch.")

    def epoch_and_position(self, step: int) -> tuple:
        return divmod(step, self.steps_per_epoch)

    def indices(self, step: int) -> List[int]:
        """Dataset row indices of this rank's ``batch_size`` samples at global ``step``."""
        epoch, position = self.epoch_and_position(step)
        generator = torch.Generator().manual_seed(self.seed + epoch)
        order = torch.randperm(self.num_prompts, generator=generator)
        chunk = self._chunks(order, generator)[position]
        repeated = chunk.repeat_interleave(self.num_generations)  # (B*dp,)
        start = self.dp_rank * self.batch_size
        return repeated[start:start + self.batch_size].tolist()

    def _chunks(self, order: torch.Tensor, generator: torch.Generator) -> List[torch.Tensor]:
        """The epoch's steps, ``U`` prompts each: consecutive pieces of ``order`` when every prompt has one task;
        otherwise each task's rows (in ``order``) cut into pieces, the pieces shuffled."""
        size = self.prompts_per_step
        if len(self.task_names) == 1:
            return list(order[:self.steps_per_epoch * size].split(size))
        pieces = []
        for task in range(len(self.task_names)):
            rows = order[self.task_ids[order] == task]
            pieces += list(rows[:len(rows) // size * size].split(size))
        return [pieces[i] for i in torch.randperm(len(pieces), generator=generator).tolist()]


def sample_seeds(csv_seeds: Sequence[int], num_generations: int, dp_rank: int, batch_size: int,
                 use_same_noise: bool = False) -> List[int]:
    """Initial-noise seeds of this rank's samples: group members get s, s+1, ..., s+G-1
    (docs/reference.md#the-rollout)."""
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
