"""What a start writes in its run directory, once the models and the reward have loaded (so a failed start leaves an
earlier run as it was): the claim taken (:meth:`~sage_grpo.tracking.run_claim.RunDirPlan.take`: locked, an earlier
run or a later branch cleared), the allowed setting changes of a resume, ``run_config.yaml`` (the values the run now
uses, on resume too), the model weights' revisions, and ``run_plan.json`` (the start-up's plan); then the metrics
logger and its trackers."""

import json
from pathlib import Path
from typing import Any, List

from sage_grpo.config import save_yaml, to_dict
from sage_grpo.models.revisions import record_run_weights
from sage_grpo.resume import CONFIG_CHANGES_FILE, describe_setting, record_config_changes
from sage_grpo.safe_io import atomic_write
from sage_grpo.startup.plan import RunPlan
from sage_grpo.tracking.run_claim import RunDirPlan
from sage_grpo.tracking.run_dir import RUN_MARKER, RUN_PLAN_FILE, MetricsLogger
from sage_grpo.tracking.trackers import start_trackers


def take_run_dir(cfg: Any, plan: RunPlan, claim: RunDirPlan, notes: List[str]) -> Path:
    """Take the run directory ``claim`` planned and write the start's files (module docstring); lines for the log
    go to ``notes``. On the writing process only."""
    check = plan.resume.check
    run_dir = claim.take(notes)
    if check is not None and check.differences:
        record_config_changes(run_dir, check)
        changes = ", ".join(f"{describe_setting(k)} {old!r} -> {new!r}" for k, (old, new) in
                            check.differences.items())
        notes.append(f"--allow_config_change: continuing {check.path} with changed settings: {changes} "
                     f"(recorded in {run_dir / CONFIG_CHANGES_FILE})")
    save_yaml(cfg, run_dir / RUN_MARKER)
    record_run_weights(cfg.model.pretrained_model_root, run_dir, run_dir / RUN_MARKER)  # the hub commits, if locked
    atomic_write(run_dir / RUN_PLAN_FILE, json.dumps(plan.as_record(), indent=1) + "\n")
    return run_dir


def open_logger(cfg: Any, plan: RunPlan, report_to: tuple, run_dir: Path, is_main: bool) -> MetricsLogger:
    """The metrics logger of the run (console, ``train.log``, ``metrics.jsonl``) and, on the main process, its
    trackers (``--report_to``; a resumed run continues its tracker runs)."""
    output = cfg.output
    trackers = (start_trackers(report_to, run_dir, project=output.tracker_project_name, run_name=output.run_name,
                               config=to_dict(cfg), resuming=plan.resume.resuming) if is_main else ())
    return MetricsLogger(run_dir, enabled=is_main, log_interval=output.log_interval, trackers=trackers,
                         max_steps=cfg.optim.max_steps)
