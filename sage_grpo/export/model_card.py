"""A model card (``README.md``) for an exported checkpoint, and the opt-in upload to the Hugging Face Hub.

The card says what was trained (full weights or a LoRA adapter, merged or not), from which base (HunyuanVideo-1.5 and
its transformer version), with which rewards and settings (read from the checkpoint's ``config.yaml``), and how far it
got (the run's ``metrics.jsonl`` up to the checkpoint's step). It is written offline; nothing is uploaded unless
``push_to_hub`` is called (``scripts/export_checkpoint.py --push_to_hub --hub_model_id you/name``).
"""

import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from sage_grpo.checkpoint_layout import CONFIG_FILE, EMA_FILE
from sage_grpo.tracking.run_dir import read_metrics, training_rows

CARD_FILE = "README.md"
BASE_REPO = "tencent/HunyuanVideo-1.5"
# The settings a reader of the card needs to know what was trained (the full config is in the run's config.yaml).
CARD_SETTINGS = ("pretrained_transformer_version", "reward_model", "reward_weights", "sde_type", "eta",
                 "grpo_sampling_steps", "infer_flow_shift_video", "cfg_scale", "kl_weight", "use_moving_KL",
                 "update_ref_model_step", "use_dual_kl", "use_grad_balancing", "use_muon", "learning_rate",
                 "lr_scheduler", "batch_size", "num_generations", "use_lora", "lora_r", "lora_alpha", "seed")


def _checkpoint_step(checkpoint: Path) -> Optional[int]:
    name = checkpoint.name
    return int(name.split("-", 1)[1]) if name.startswith("checkpoint-") and name.split("-", 1)[1].isdigit() else None


def _metrics_summary(rows: List[Dict[str, Any]]) -> List[str]:
    rewards = [row["gathered_avg_reward_mean"] for row in rows if "gathered_avg_reward_mean" in row]
    if not rewards:
        return ["No metrics were found next to the checkpoint."]
    window = max(1, min(5, len(rewards) // 2))
    first, final = statistics.fmean(rewards[:window]), statistics.fmean(rewards[-window:])
    lines = [f"- steps logged: {len(rewards)}",
             f"- GRPO reward (`gathered_avg_reward_mean`), mean of the first {window} steps: {first:.4f}; of the "
             f"last {window}: {final:.4f}"]
    last = rows[-1]
    for key in sorted(k for k in last if k.startswith("gathered_") and k.endswith("_reward_mean")
                      and k not in ("gathered_avg_reward_mean", "gathered_ori_avg_reward_mean")):
        lines.append(f"- `{key}` at the last step: {last[key]:.4f}")
    if "kl_loss" in last:
        lines.append(f"- KL to the anchor at the last step (`kl_loss`): {last['kl_loss']:.3g}")
    return lines


def _weights_lines(checkpoint: Path) -> str:
    """The hub commits the run trained from (its run directory's weights.lock.json, written by download_weights.sh)."""
    from sage_grpo.models.revisions import lock_lines

    lines = lock_lines(checkpoint.parent)
    if not lines:
        return "The run's model root had no `weights.lock.json`: the base weights' hub commits are not recorded."
    return "Downloaded at these commits (`bash download_weights.sh --lock weights.lock.json` fetches them again):\n\n" + \
        "\n".join(f"- `{line}`" for line in lines)


def model_card(checkpoint: Path, *, export_format: str, dtype: str, merged_lora: bool,
               pipeline_record: Optional[Dict[str, Any]] = None) -> str:
    """The card's Markdown for an export of ``checkpoint`` (a ``checkpoint-N`` folder or another weights location);
    ``pipeline_record``: the sampling.json of a ``--format pipeline`` export."""
    checkpoint = Path(checkpoint)
    ema = checkpoint.name == EMA_FILE.parent.name and (checkpoint.parent / CONFIG_FILE).is_file()
    checkpoint = checkpoint.parent if ema else checkpoint  # checkpoint-N/ema: the EMA of that checkpoint's weights
    config_file = checkpoint / CONFIG_FILE
    config = yaml.safe_load(config_file.read_text()) if config_file.is_file() else None
    config = config if isinstance(config, dict) else {}
    step = _checkpoint_step(checkpoint)
    rows = [row for row in training_rows(read_metrics(checkpoint.parent)) if step is None or row["step"] <= step]
    version = config.get("pretrained_transformer_version", "480p_t2v")
    if export_format == "lora":
        what = "a LoRA adapter (peft) for the HunyuanVideo-1.5 transformer"
    elif merged_lora:
        what = "the HunyuanVideo-1.5 transformer with a trained LoRA adapter merged into its weights"
    else:
        what = "the HunyuanVideo-1.5 transformer, fully fine-tuned"
    if ema:
        what += f" (the exponential moving average of the trained weights, --ema_decay {config.get('ema_decay')})"
    tags = ["text-to-video", "hunyuanvideo-1.5", "grpo", "sage-grpo", "reinforcement-learning"]
    header = {"base_model": BASE_REPO, "library_name": "peft" if export_format == "lora" else "diffusers",
              "pipeline_tag": "text-to-video", "tags": tags}
    shown = [key for key in CARD_SETTINGS if key in config and (config.get("use_lora") or not key.startswith("lora_"))]
    settings = [f"| `--{key}` | `{config[key]}` |" for key in shown]
    if pipeline_record is not None:
        from sage_grpo.export.pipeline import attribute_overrides, loading_code

        overrides = attribute_overrides(pipeline_record["pipeline_attributes"])
        loading = (f"```python\n{loading_code(pipeline_record['task'], overrides)}\n```\n"
                   f"Sampled as generate.py samples it: guidance scale {pipeline_record['guidance_scale']}, flow "
                   f"shift {pipeline_record['flow_shift']} (guider/ and scheduler/ of this folder).")
    elif export_format == "lora":
        loading = ("```python\nfrom peft import PeftModel\n"
                   "# base_transformer: HunyuanVideo15Transformer3DModel.from_pretrained(...)\n"
                   "transformer = PeftModel.from_pretrained(base_transformer, \"<this folder>\")\n```")
    else:
        loading = ("```python\nfrom diffusers import HunyuanVideo15Transformer3DModel\n"
                   "transformer = HunyuanVideo15Transformer3DModel.from_pretrained(\"<this folder>\")\n```\n"
                   "or `python generate.py --checkpoint_path <this folder>` with sage-grpo.")
    parts = [
        "---\n" + yaml.safe_dump(header, sort_keys=False) + "---",
        f"# {what[0].upper()}{what[1:]}",
        f"Post-trained with SAGE-GRPO (sage-grpo) from `{BASE_REPO}` (transformer `{version}`), exported from "
        f"`{checkpoint.name}`{f' (step {step})' if step is not None else ''} as `{export_format}` in `{dtype}`.",
        "## Training settings",
        "| setting | value |\n|---|---|\n" + "\n".join(settings) if settings else
        "The checkpoint holds no `config.yaml`; its settings are unknown.",
        "## Metrics of the run up to this checkpoint",
        "\n".join(_metrics_summary(rows)),
        "## Base weights",
        _weights_lines(checkpoint),
        "## Loading",
        loading,
    ]
    return "\n\n".join(parts) + "\n"


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
