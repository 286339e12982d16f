"""Helpers shared by the trust tests (unit/test_trust*.py, unit/test_run_dir_claims.py and e2e/test_trust_runs.py)
and the FAQ's messages (unit/test_faq.py)."""
import hashlib
from pathlib import Path

import yaml


def snapshot(root: Path) -> dict:
    """{relative path: sha256} of every file under ``root``: what a refused start must leave byte for byte."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def one_error_line(text: str) -> str:
    """The one line of ``text`` (a command's stderr), which must hold one line and no traceback."""
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text[-2000:]
    return lines[0]


def write_module(root: Path, name: str, source: str) -> None:
    path = root.joinpath(*name.split("."))
    if "." in name:
        for parent in list(path.parents)[:name.count(".")]:
            parent.mkdir(parents=True, exist_ok=True)
            (parent / "__init__.py").touch()
    path.with_suffix(".py").write_text(source)


def alias_bomb(path: Path, levels: int, key: str = "reward_kwargs") -> Path:
    """A billion-laughs YAML: under ``key``, each level is a list of nine references to the one before (9**levels
    strings if anything expanded it)."""
    lines = [f"{key}:", "  l0: &l0 [" + ", ".join(['"lol"'] * 9) + "]"]
    lines += [f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    path.write_text("\n".join(lines) + "\n")
    return path


def nan_outside_fingerprint(weights: Path) -> str:
    """Set to NaN, in place, the smallest tensor of a safetensors file that lies wholly outside the blocks the model
    root's fingerprint samples (``sage_grpo.resume._sample_file``): the file keeps its size and its fingerprint, as
    weights changed in place by a bad copy or a bit flip would. Returns the tensor's name."""
    import json
    import struct

    from sage_grpo.resume import _SAMPLE_BYTES, _SAMPLES

    data = bytearray(weights.read_bytes())
    size, header_size = len(data), struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + header_size])
    starts = [max(size - _SAMPLE_BYTES, 0) * i // (_SAMPLES - 1) for i in range(_SAMPLES)]
    sampled = [(start, start + _SAMPLE_BYTES) for start in starts]
    nan = {"F32": b"\x00\x00\xc0\x7f", "BF16": b"\xc0\x7f", "F16": b"\x00\x7e"}
    tensors = sorted((meta["data_offsets"][1] - meta["data_offsets"][0], name) for name, meta in header.items()
                     if name != "__metadata__" and meta["dtype"] in nan)
    for _, name in tensors:
        meta = header[name]
        begin, end = (8 + header_size + offset for offset in meta["data_offsets"])
        if end > begin and all(end <= start or begin >= stop for start, stop in sampled):
            value = nan[meta["dtype"]]
            data[begin:end] = value * ((end - begin) // len(value))
            weights.write_bytes(bytes(data))
            return name
    raise ValueError(f"{weights}: every tensor overlaps a sampled block")


def write_checkpoint_two(args, weights, *, record_prompts: bool = True) -> Path:
    """checkpoint-2 of the run ``args`` define, as the trainer writes it (``weights``: its trainable tensors)."""
    from sage_grpo.checkpoint import write_checkpoint_files  # the package only when a test writes a checkpoint
    from sage_grpo.config import parse_cli, to_dict
    from sage_grpo.config.train import TrainConfig
    from sage_grpo.data import read_prompt_csvs
    from sage_grpo.resume import layout_record

    cfg = parse_cli(TrainConfig, args)
    items = read_prompt_csvs(cfg.data.train_video_csv, notes=[]) if record_prompts else None
    layout = layout_record(cfg.model, 1, 1, 1, cfg.data.batch_size, items)  # one process: batch_size videos a step
    state = {"global_step": 2, "update_steps": 2, "micro_steps": 2, "kl_controller": None,
             "anchor_schedule": {"last_refreshed_at": None}, "layout": layout}
    path = Path(cfg.output.output_dir) / "checkpoint-2"
    write_checkpoint_files(path, model_state=weights, optimizer_state={"state": {}}, training_state=state,
                           config_yaml=yaml.safe_dump(to_dict(cfg)))
    (path.parent / "run_config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    return path
