"""A model card (``README.md``) for an exported checkpoint, and the opt-in upload to the Hugging Face Hub.

The card says what was trained (full weights or a LoRA adapter, merged or not), from which base (the released
HunyuanVideo-1.5 and its transformer version only when the root's transformer has the released architecture; a tiny
or toy root is named as such), with which rewards and settings (read from the checkpoint's ``config.yaml``), and how
far it got (the run's ``metrics.jsonl`` up to the checkpoint's step). It is written offline; nothing is uploaded
unless ``push_to_hub`` is called (``scripts/export_checkpoint.py --push_to_hub --hub_model_id you/name``).
"""

import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from sage_grpo.checkpoint_layout import CONFIG_FILE, EMA_FILE
from sage_grpo.config.train import CARD_OPTIONS
from sage_grpo.tracking.run_dir import metric_value, read_metrics, training_rows

CARD_FILE = "README.md"
BASE_REPO = "tencent/HunyuanVideo-1.5"
ARCHITECTURE_KEYS = ("num_layers", "num_attention_heads", "attention_head_dim", "num_refiner_layers", "mlp_ratio")
# The settings a reader of the card needs to know what was trained are declared with on_card=True (CARD_OPTIONS);
# the full config is in the run's config.yaml.


def code_span(value: Any) -> str:
    """``value`` as one inline Markdown code span that a table cell or a list item can hold: whatever the text (a
    recorded setting, a folder name, a metric's name), it stays data. Line breaks become spaces, ``|`` is escaped
    for tables, and the fence is one backtick longer than the longest run of backticks inside."""
    text = " ".join(str(value).splitlines()).replace("|", "\\|")
    fence = "`" * (1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return f"{fence} {text} {fence}" if "`" in text else f"{fence}{text}{fence}"


def _checkpoint_step(checkpoint: Path) -> Optional[int]:
    name = checkpoint.name
    return int(name.split("-", 1)[1]) if name.startswith("checkpoint-") and name.split("-", 1)[1].isdigit() else None


def _mean(values: List[float]) -> float:
    return sum(value / len(values) for value in values)  # finite values: no overflow (fmean's sum can overflow)


def _metrics_summary(rows: List[Dict[str, Any]]) -> List[str]:
    rewards = [value for value in (metric_value(row, "gathered_avg_reward_mean") for row in rows)
               if value is not None]
    if not rewards:
        return ["No metrics were found next to the checkpoint."]
    window = max(1, min(5, len(rewards) // 2))
    first, final = _mean(rewards[:window]), _mean(rewards[-window:])
    lines = [f"- steps logged: {len(rewards)}",
             f"- GRPO reward (`gathered_avg_reward_mean`), mean of the first {window} steps: {first:.4f}; of the "
             f"last {window}: {final:.4f}"]
    last = rows[-1]
    for key in sorted(k for k in last if k.startswith("gathered_") and k.endswith("_reward_mean")
                      and k not in ("gathered_avg_reward_mean", "gathered_ori_avg_reward_mean")):
        if metric_value(last, key) is not None:
            lines.append(f"- {code_span(key)} at the last step: {metric_value(last, key):.4f}")
    if metric_value(last, "kl_loss") is not None:
        lines.append(f"- KL to the anchor at the last step (`kl_loss`): {metric_value(last, 'kl_loss'):.3g}")
    return lines


def _weights_lines(checkpoint: Path) -> str:
    """The hub commits the run trained from (its run directory's weights.lock.json, written by download_weights.sh)."""
    from sage_grpo.models.revisions import lock_lines

    lines = lock_lines(checkpoint.parent)
    if not lines:
        return "The run's model root had no `weights.lock.json`: the base weights' hub commits are not recorded."
    return "Downloaded at these commits (`bash download_weights.sh --lock weights.lock.json` fetches them again):\n\n" + \
        "\n".join(f"- {code_span(line)}" for line in lines)


def released_architecture(base_config: Optional[Dict[str, Any]]) -> Optional[bool]:
    """Whether a transformer config has the released HunyuanVideo-1.5 architecture (diffusers' defaults: 54 blocks
    of width 2048); None when the config is unknown."""
    if base_config is None:
        return None
    import inspect

    from diffusers import HunyuanVideo15Transformer3DModel

    defaults = inspect.signature(HunyuanVideo15Transformer3DModel.__init__).parameters
    return all(base_config.get(key, defaults[key].default) == defaults[key].default for key in ARCHITECTURE_KEYS)


def _base(config: Dict[str, Any], base_config: Optional[Dict[str, Any]]) -> Tuple[Optional[str], str, str]:
    """(the header's base_model or None, the transformer as the title names it, where the training started); the
    values read from files enter as code spans."""
    version = code_span(config.get("pretrained_transformer_version", "480p_t2v"))
    released = released_architecture(base_config)
    if released:
        return BASE_REPO, "the HunyuanVideo-1.5 transformer", f"`{BASE_REPO}` (transformer {version})"
    root = f"the checkpoint root {code_span(config.get('pretrained_model_root', '?'))} (transformer {version})"
    if released is None:
        return None, "a HunyuanVideo-1.5-class transformer", (
            f"{root}, whose configuration the export did not find: whether it is the released `{BASE_REPO}` is not "
            "known")
    blocks, heads, head_dim = (base_config.get(key) for key in ("num_layers", "num_attention_heads",
                                                                  "attention_head_dim"))
    width = heads * head_dim if all(type(v) is int for v in (heads, head_dim)) else "?"
    blocks, width = (value if type(value) is int else code_span(value) for value in (blocks, width))
    return None, f"a small test transformer of the HunyuanVideo-1.5 class ({blocks} blocks, width {width})", (
        f"{root}, not from the released `{BASE_REPO}`: its transformer has {blocks} blocks of width {width} where the "
        "released one has 54 of width 2048, a tiny or toy checkpoint such as sage-grpo writes for tests and demos "
        "(scripts/make_tiny_checkpoint.py, scripts/make_toy_checkpoint.py), not weights to publish")


def model_card(checkpoint: Path, *, export_format: str, dtype: str, merged_lora: bool,
               pipeline_record: Optional[Dict[str, Any]] = None, run_config: Optional[Dict[str, Any]] = None,
               base_config: Optional[Dict[str, Any]] = None) -> str:
    """The card's Markdown for an export of ``checkpoint`` (a ``checkpoint-N`` folder or another weights location);
    ``pipeline_record``: the sampling.json of a ``--format pipeline`` export; ``run_config``: the settings the
    checkpoint recorded (default: its ``config.yaml``, read and checked like the command line); ``base_config``: the
    config.json of the transformer the run started from (None: unknown, and the card says so). Every value from a
    file enters the Markdown as a code span (:func:`code_span`), never as Markdown."""
    checkpoint = Path(checkpoint)
    ema = checkpoint.name == EMA_FILE.parent.name and (checkpoint.parent / CONFIG_FILE).is_file()
    checkpoint = checkpoint.parent if ema else checkpoint  # checkpoint-N/ema: the EMA of that checkpoint's weights
    config = run_config if run_config is not None else recorded_settings(checkpoint)
    step = _checkpoint_step(checkpoint)
    rows = [row for row in training_rows(read_metrics(checkpoint.parent)) if step is None or row["step"] <= step]
    base_model, transformer, origin = _base(config, base_config)
    what = _what(transformer, export_format, merged_lora, code_span(config.get("ema_decay")) if ema else None)
    tags = ["text-to-video", "hunyuanvideo-1.5", "grpo", "sage-grpo", "reinforcement-learning"]
    header = {"base_model": base_model, "library_name": "peft" if export_format == "lora" else "diffusers",
              "pipeline_tag": "text-to-video", "tags": tags}
    if base_model is None:
        del header["base_model"]
    shown = [key for key in CARD_OPTIONS if key in config and (config.get("use_lora") or not key.startswith("lora_"))]
    settings = [f"| `--{key}` | {code_span(config[key])} |" for key in shown]
    parts = [
        "---\n" + yaml.safe_dump(header, sort_keys=False) + "---",
        f"# {what[0].upper()}{what[1:]}",
        f"Post-trained with SAGE-GRPO (sage-grpo) from {origin}. Exported from "
        f"{code_span(checkpoint.name)}{f' (step {step})' if step is not None else ''} as `{export_format}` in "
        f"`{dtype}`.",
        "## Training settings",
        "| setting | value |\n|---|---|\n" + "\n".join(settings) if settings else
        "The checkpoint holds no `config.yaml`; its settings are unknown.",
        "## Metrics of the run up to this checkpoint",
        "\n".join(_metrics_summary(rows)),
        "## Base weights",
        _weights_lines(checkpoint),
        "## Loading",
        _loading(export_format, pipeline_record),
    ]
    return "\n\n".join(parts) + "\n"


def _what(transformer: str, export_format: str, merged_lora: bool, ema_decay: Optional[str]) -> str:
    """What the export holds, as the card's title says it (``ema_decay``: the recorded ``--ema_decay`` as a code span
    when the export is the exponential moving average of the trained weights, else None)."""
    if export_format == "lora":
        what = f"a LoRA adapter (peft) for {transformer}"
    elif merged_lora:
        what = f"{transformer} with a trained LoRA adapter merged into its weights"
    else:
        what = f"{transformer}, fully fine-tuned"
    if ema_decay is not None:
        what += f" (the exponential moving average of the trained weights, --ema_decay {ema_decay})"
    return what


def _loading(export_format: str, pipeline_record: Optional[Dict[str, Any]]) -> str:
    """The card's "Loading" section: the code that loads this export."""
    if pipeline_record is not None:
        from sage_grpo.export.pipeline import attribute_overrides, loading_code

        overrides = attribute_overrides(pipeline_record["pipeline_attributes"])
        return (f"```python\n{loading_code(pipeline_record['task'], overrides)}\n```\n"
                f"Sampled as generate.py samples it: guidance scale {pipeline_record['guidance_scale']}, flow "
                f"shift {pipeline_record['flow_shift']} (guider/ and scheduler/ of this folder).")
    if export_format == "lora":
        return ("```python\nfrom peft import PeftModel\n"
                "# base_transformer: HunyuanVideo15Transformer3DModel.from_pretrained(...)\n"
                "transformer = PeftModel.from_pretrained(base_transformer, \"<this folder>\")\n```")
    return ("```python\nfrom diffusers import HunyuanVideo15Transformer3DModel\n"
            "transformer = HunyuanVideo15Transformer3DModel.from_pretrained(\"<this folder>\")\n```\n"
            "or `python generate.py --checkpoint_path <this folder>` with sage-grpo.")


def recorded_settings(checkpoint: Path) -> Dict[str, Any]:
    """The settings the run of ``checkpoint`` recorded in its ``config.yaml``, checked like the command line ({}
    when it has none)."""
    from sage_grpo.config.recorded import recorded_values
    from sage_grpo.config.train import read_run_config

    config_file = checkpoint / CONFIG_FILE
    return recorded_values(read_run_config(config_file)) if config_file.is_file() else {}


def write_model_card(output: Path, checkpoint: Path, **card) -> Path:
    path = Path(output) / CARD_FILE
    path.write_text(model_card(checkpoint, **card))
    return path


def push_to_hub(folder: Path, repo_id: str, *, private: bool = True) -> str:
    """Upload ``folder`` to the Hub repository ``repo_id`` (created if needed, private by default); returns its URL.
    Needs network access and a token (``huggingface-cli login`` or ``HF_TOKEN``)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import OfflineModeIsEnabled

    try:
        api = HfApi()
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message="Upload a sage-grpo export")
    except OfflineModeIsEnabled:
        raise ValueError(f"--push_to_hub: offline mode is on (HF_HUB_OFFLINE=1), nothing was uploaded. The export is "
                         f"in {folder}; unset HF_HUB_OFFLINE and push again, or upload the folder yourself") from None
    except Exception as err:  # network, authentication, permissions: the export itself is complete
        raise ValueError(f"--push_to_hub {repo_id} failed ({type(err).__name__}: {str(err)[:300]}). The export is in "
                         f"{folder}; log in (huggingface-cli login) or check the repository id, then push again")
    return str(url)
