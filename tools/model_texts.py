"""What a packaged bundle says about a user's model (``package_bundle.py --weights``): its metadata fields and its
model card, written from the weights' settings record, the ``selection.json`` training wrote beside them and the text
the packager passes, never the demonstration model's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEMO_DOCS", "RESEARCH_USE", "ModelTexts", "user_model_card", "user_model_metadata"]

#: the demonstration model's docs, replaced or left out when --weights ships the user's model
DEMO_DOCS = ("docs/README.md", "docs/data_license.txt", "docs/training_curves.png")
RESEARCH_USE = "Research use only. Not a medical device; not for clinical use, clinical decisions or diagnosis."


@dataclass
class ModelTexts:
    """What the packager says about --weights (every field optional; see the module docstring)."""

    description: str | None = None
    data_source: str | None = None
    model_card: Path | None = None
    metrics: Path | None = None
    data_license: Path | None = None


def selection_record(weights: Path) -> dict | None:
    """The ``selection.json`` training wrote beside the weights (the stage folder), if any."""
    try:
        return json.loads((weights.parent / "selection.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def settings_summary(settings: dict) -> str:
    size = settings.get("image_size")
    parts = []
    if size:
        parts.append(f"{size[0]}x{size[1]} input window")
    if settings.get("pixel_spacing"):
        parts.append(f"{settings['pixel_spacing']} mm pixels")
    if settings.get("patch_size"):
        parts.append(f"{settings['patch_size'][0]} px patches")
    if settings.get("local_depth"):
        padding = " padding by replication" if settings.get("local_padding_mode") == "replicate" else ""
        width = settings.get("local_width")
        parts.append(f"ResNet-{settings['local_depth']}-HR local module of width {width}{padding}")
    parts.append("the paper's global backbone" if not settings.get("global_backbone") else "a custom global backbone")
    return ", ".join(parts)


def selection_summary(record: dict | None) -> str | None:
    if not record or record.get("best_epoch", -1) < 1:
        return None
    value = record.get("best_value")
    text = (
        f"{record.get('stage', '?')} stage selected at epoch {record['best_epoch']} of {record.get('epochs_run')} by "
        f"{record.get('metric')} = {value:.4f} on {record.get('validation_items')} validation images"
    )
    if record.get("reason") and record["reason"] != "selection_metric":
        text += f" ({record['reason']})"
    return text


def evaluation_metrics(metrics: Path | None) -> dict | None:
    if metrics is None:
        return None
    try:
        content = json.loads(metrics.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"--metrics {metrics}: not a readable JSON file ({e})") from e
    if not isinstance(content, dict):
        raise ValueError(f"--metrics {metrics}: expected a JSON object (evaluate's metrics.json)")
    return content


def user_model_metadata(meta_text: str, weights: Path, settings: dict, texts: ModelTexts) -> dict:
    """The packaged ``metadata.json`` for the user's ``weights``: ``meta_text`` (the bundle's metadata.json) with the
    description, data source, evaluation, intended use and changelog of the user's model, from its settings record
    ``settings``, the ``selection.json`` beside it and ``texts``. A ``--metrics`` file that is not a JSON object is a
    ``ValueError`` naming it."""
    meta = json.loads(meta_text)
    selection = selection_summary(selection_record(weights))
    summary = settings_summary(settings) if settings else "settings not recorded in the checkpoint"
    meta["description"] = texts.description or (
        "GLAM (Global-Local Activation Maps, Liu et al., MIDL 2021) trained by the packager of this bundle: it "
        "classifies a mammogram as benign / malignant from image-level labels and produces saliency maps at a "
        f"quarter of the input resolution. This model: {summary}."
    )
    meta["data_source"] = texts.data_source or (
        "Not stated by the packager (package_bundle --data_source): ask them which images the model was trained on."
    )
    eval_metrics: dict = {"note": "soft Dice, pixel average precision, pointing game, ROC AUC: see docs/README.md"}
    if selection:
        eval_metrics["selection"] = selection
    evaluation = evaluation_metrics(texts.metrics)
    if evaluation is not None:
        eval_metrics["evaluation"] = evaluation
    if len(eval_metrics) == 1:
        eval_metrics["evaluation"] = "not given (package_bundle --metrics <eval_dir>/metrics.json)"
    meta["eval_metrics"] = eval_metrics
    meta["intended_use"] = RESEARCH_USE
    meta["changelog"] = {
        meta["version"]: f"the packager's GLAM weights ({weights.name}: {summary}) with the code of GLAM for MONAI "
        f"{meta['version']}"
    }
    return meta


def user_model_card(name: str, meta: dict, settings: dict) -> str:
    """``docs/README.md`` for the user's weights, from the packaged metadata and the weights' settings record."""
    lines = [
        f"# {name}: GLAM for mammography",
        "",
        f"**{RESEARCH_USE}**",
        "",
        "## Model",
        meta["description"],
        "",
        "## Data",
        meta["data_source"],
        "",
        "## Evaluation",
    ]
    for key, value in meta["eval_metrics"].items():
        if key != "note":
            lines.append(f"- {key}: {json.dumps(value) if isinstance(value, (dict, list)) else value}")
    lines += ["", "## Settings recorded in models/model.pt", ""]
    if settings:
        lines += ["| setting | value |", "|---|---|"]
        lines += [f"| {k} | {json.dumps(v)} |" for k, v in sorted(settings.items())]
    else:
        lines.append("The checkpoint records no settings (it was packaged with --preset).")
    lines += [
        "",
        "## Use",
        "```bash",
        "PYTHONPATH=. python -m monai.bundle run_workflow scripts.GLAMWorkflow --run_id inference \\",
        "    --config_file configs/inference.yaml --meta_file configs/metadata.json --bundle_root . \\",
        "    --input_dir DIR --output_dir OUT",
        "```",
        "The inference config builds the network and its input window from the settings the checkpoint records.",
        "",
        "## References",
        *[f"- {r}" for r in meta.get("references", [])],
        "",
    ]
    return "\n".join(lines)
