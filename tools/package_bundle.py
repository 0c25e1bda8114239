"""Build the shareable model-zoo zip of bundle/ and verify it from a clean temporary folder.

    python tools/package_bundle.py --out dist [--weights model.pt [--preset configs/quickstart.yaml]
        [--description TEXT] [--data_source TEXT] [--model_card FILE] [--metrics metrics.json]
        [--data_license FILE]] [--no-weights] [--name glam_mammography] [--keep]

The zip holds ``<name>/{configs,scripts,docs,models}/`` and ``<name>/LICENSE`` (plus ``large_files.yml`` when the
bundle has one); caches, training outputs and model files are left out, except the weights shipped as
``models/model.pt``: the bundle's own ``models/model.pt`` (the demonstration model) by default, ``--weights`` in its
place, none with ``--no-weights``. The weights are checked to load strictly into the inference config's
``network_def`` (``weights_only=True``), built from the settings the checkpoint records (every checkpoint the
bundle's training writes records them; inference.yaml reads them back), and ``metadata.json``'s input/output shapes
are set to the recorded training window. Weights without a settings record (written before the bundle recorded
them) need ``--preset`` with the preset they were trained with: its model ids (``PRESET_IDS``) are written into the
packaged ``inference.yaml`` and ``train.yaml`` and the shapes into ``metadata.json``, so that the shared bundle
builds the network the weights belong to; for weights with a record it is not needed (and is refused when it
disagrees with the record). ``--out`` is a folder (the zip is named ``<name>_v<version>.zip``) or a ``.zip`` path.

With ``--weights`` (the user's model), the metadata and the model card describe that model, never the demonstration
model: ``description`` (``--description``, else one written from the weights' settings record), ``data_source``
(``--data_source``, else a line saying the packager did not state it), ``eval_metrics`` (the best-model selection
recorded in ``selection.json`` beside the weights, and the evaluation's ``metrics.json`` given with ``--metrics``),
``intended_use`` (research use) and the changelog entry of the version; ``docs/README.md`` is ``--model_card FILE``
as it is, else a card written from the same facts (:func:`user_model_card`); ``docs/data_license.txt`` is
``--data_license FILE`` or a note that the licence of the training data was not stated, and the demonstration's
training curves are left out.

The zip also holds ``configs/inference.json``, written from the packaged ``inference.yaml``: MONAI's
``monai.bundle.load(name, bundle_dir=..., workflow_type="inference")`` builds ``network_def`` only from
``configs/{workflow_type}.json`` (without it, it returns the bare state dict). Its content is the YAML's as MONAI
parses it (``yaml.safe_load``; the comments stay in the YAML, the file to edit), except ``bundle_root``: ``load``
parses the config from whatever folder the caller is in, so the JSON's bundle root is the folder of the ``scripts``
package the config imports (the unzipped bundle, which the caller puts on ``sys.path``), and ``ckpt_path``, from
which ``network_def`` reads the shipped weights' settings, is that bundle's ``models/model.pt`` from anywhere. An
override (``--bundle_root``, as the model zoo's tools pass it) replaces it as in the YAML.

The verification unzips into a temporary folder and runs, in fresh interpreters whose only extra path entry is the
unzipped bundle folder (never the repository): ``monai.bundle verify_metadata`` against
``../shared/schema/meta_schema_20240725.json`` when it exists; ConfigParser on every config, with every
``_target_`` and ``$import`` restricted to ``scripts.``, MONAI, torch/ignite and the standard library; and
``monai.bundle run inference`` on two mammogram-shaped images drawn with numpy, with tiny network
sizes and a random checkpoint (or, with shipped weights, models/model.pt in the window it records). With shipped
weights also: ``monai.bundle.load(name, bundle_dir=<unzipped>, workflow_type="inference")`` from another working
folder must return the network built by ``configs/inference.json`` (its class from the unzipped bundle) holding
exactly the tensors of models/model.pt, and S_c of the expected shape; and the model zoo's data-shape check,
``monai.bundle verify_net_in_out network_def`` on ``configs/inference.json`` with ``--bundle_root`` as the zoo's
``ci/verify_bundle.py`` calls it.
The steps that run inside the unzipped bundle are the scripts in ``tools/bundle_checks/``.
Prints one line per step; the exit code is non-zero when any step fails, and the failing step is named.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BUNDLE_ROOT = REPO_ROOT / "bundle"
sys.path.insert(0, str(BUNDLE_ROOT))

from scripts.atomic import atomic_write  # noqa: E402
from scripts.networks.inference import CHECKPOINT_SETTINGS, INFERENCE_CHOSEN  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_texts import DEMO_DOCS, ModelTexts, user_model_card, user_model_metadata  # noqa: E402

DEFAULT_SCHEMA = REPO_ROOT.parent / "shared" / "schema" / "meta_schema_20240725.json"
# the model-zoo layout: nothing else at the bundle root (inference/, eval/, runs/, data) is shared
TOP_LEVEL = ("configs", "scripts", "docs", "models", "LICENSE", "large_files.yml")
EXCLUDED_DIRS = {"__pycache__", "eval", "runs", ".ipynb_checkpoints", ".pytest_cache"}
EXCLUDED_SUFFIXES = {".pyc", ".pyo", ".tmp"}
MODEL_SUFFIXES = {".pt", ".pth", ".ts", ".onnx", ".ckpt", ".safetensors", ".bin"}
# sizes of tests/configs/tiny_inference.yaml: the verification run takes seconds on a CPU
TINY_NETWORK = {"patch_size": 64, "local_depth": 18, "local_width": 4}
TINY_IMAGE = (256, 160)
FULL_IMAGE = (1024, 640)  # shipped weights: synthetic images at most this large (in the weights' own window)
# the bundle's shipped weights (relative to the bundle root): packaged unless --weights replaces them
DEFAULT_WEIGHTS = Path("models") / "model.pt"
STEP_TIMEOUT_S = 900
#: the steps that run inside the unzipped bundle, in fresh interpreters
CHECK_SCRIPTS = Path(__file__).resolve().parent / "bundle_checks"
# the ids of a size preset that define the network and its input (top-level ids of inference.yaml and train.yaml)
PRESET_IDS = (*CHECKPOINT_SETTINGS, *INFERENCE_CHOSEN, "crop_iterations", "crop_buffer")
PRESET_CONFIGS = ("configs/inference.yaml", "configs/train.yaml")
INFERENCE_YAML = "configs/inference.yaml"
# what `monai.bundle.load(..., workflow_type="inference")` reads: MONAI looks for configs/{workflow_type}.json only
INFERENCE_JSON = "configs/inference.json"
# inference.json's bundle_root: the folder holding the `scripts` package the config imports (`$import os` and
# `$import scripts` are among its imports), i.e. the unzipped bundle whichever folder `load` is called from
SELF_LOCATING_ROOT = "$os.path.dirname(os.path.dirname(os.path.abspath(scripts.__file__)))"


class PackagingError(ValueError):
    """A packaging or verification step failed; ``step`` names it."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"[{step}] {message}")
        self.step = step


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)

    def ok(self, step: str, detail: str, seconds: float) -> None:
        self.lines.append(f"ok     {step:<16} {detail} ({seconds:.1f} s)")
        print(self.lines[-1], flush=True)

    def skip(self, step: str, detail: str) -> None:
        self.lines.append(f"skip   {step:<16} {detail}")
        print(self.lines[-1], flush=True)


def bundle_files(bundle_root: Path) -> Iterator[tuple[Path, str]]:
    """(source file, path relative to the bundle root) for every file that belongs in the zip, sorted."""
    for top in TOP_LEVEL:
        src = bundle_root / top
        if src.is_file():
            yield src, top
            continue
        if not src.is_dir():
            continue
        for path in sorted(src.rglob("*")):
            rel = path.relative_to(bundle_root)
            if not path.is_file() or any(p in EXCLUDED_DIRS or p.startswith(".") for p in rel.parts):
                continue
            if path.suffix in EXCLUDED_SUFFIXES or (top == "models" and path.suffix in MODEL_SUFFIXES):
                continue
            yield path, rel.as_posix()


def preset_values(preset: Path) -> dict[str, object]:
    """The ``PRESET_IDS`` that ``preset`` sets to plain values (not ``$``/``@`` expressions)."""
    import yaml

    step = "preset"
    if not preset.is_file():
        raise PackagingError(step, f"--preset {preset}: no such file")
    try:
        content = yaml.safe_load(preset.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise PackagingError(step, f"--preset {preset}: not valid YAML ({e})") from e
    if not isinstance(content, dict):
        raise PackagingError(step, f"--preset {preset}: expected a mapping of config ids, got {type(content).__name__}")
    values = {}
    for key in PRESET_IDS:
        value = content.get(key)
        if isinstance(value, str) and value.startswith(("$", "@", "%")):
            raise PackagingError(step, f"--preset {preset}: {key} is an expression ({value!r}); give a plain value")
        if key in content:
            values[key] = value
    if not values:
        raise PackagingError(step, f"--preset {preset} sets none of the model ids {', '.join(PRESET_IDS)}")
    return values


def metadata_with_shapes(bundle_root: Path, image_size: object, step: str) -> str | None:
    """The packaged ``metadata.json`` whose input shape is ``image_size`` (H, W) and output shape the
    quarter-resolution map's; None when the bundle's metadata already says so (it is then shipped unchanged)."""
    h, w = (int(v) for v in image_size)  # type: ignore[attr-defined]
    if h % 4 or w % 4:
        raise PackagingError(step, f"image_size {[h, w]} must be divisible by 4")
    meta = json.loads((bundle_root / "configs" / "metadata.json").read_text(encoding="utf-8"))
    fmt = meta["network_data_format"]
    shapes = (fmt["inputs"]["image"]["spatial_shape"], fmt["outputs"]["pred"]["spatial_shape"])
    if list(shapes[0]) == [h, w] and list(shapes[1]) == [h // 4, w // 4]:
        return None
    fmt["inputs"]["image"]["spatial_shape"] = [h, w]
    fmt["outputs"]["pred"]["spatial_shape"] = [h // 4, w // 4]
    return json.dumps(meta, indent=4) + "\n"


def apply_preset(bundle_root: Path, values: dict[str, object]) -> dict[str, str]:
    """The packaged text of the configs and metadata with the preset's values written in.

    Top-level lines ``id: value`` are rewritten in place (comments and layout kept) in each of ``PRESET_CONFIGS``
    that has the id (e.g. ``joint_modules`` is inference.yaml's only); an id neither has is an error. The metadata's
    input shape becomes ``image_size`` and the output shape the quarter-resolution map's."""
    texts = {rel: (bundle_root / rel).read_text(encoding="utf-8") for rel in PRESET_CONFIGS}
    for key, value in values.items():
        pattern = re.compile(rf"^{re.escape(key)}:[^\n#]*?(?=\s*(#|$))", re.MULTILINE)
        found = 0
        for rel, text in texts.items():
            texts[rel], n = pattern.subn(f"{key}: {json.dumps(value)}", text, count=1)
            found += n
        if not found:
            raise PackagingError("preset", f"none of {', '.join(PRESET_CONFIGS)} has a top-level id {key!r} to set")
    replaced = dict(texts)
    if "image_size" in values:
        meta = metadata_with_shapes(bundle_root, values["image_size"], "preset")
        if meta is not None:
            replaced["configs/metadata.json"] = meta
    return replaced


def recorded_settings(weights: Path) -> dict[str, object] | None:
    """The model settings ``weights`` records (``scripts.networks.settings``); None for a checkpoint without them."""
    from scripts.networks.settings import read_checkpoint_settings

    try:
        return read_checkpoint_settings(weights)
    except ValueError as e:
        raise PackagingError("weights", str(e)) from e


def inference_json(yaml_text: str) -> str:
    """The text of ``configs/inference.json`` for the packaged ``inference.yaml`` text ``yaml_text``: the content
    MONAI reads from the YAML (its ``ConfigParser`` loads YAML with ``yaml.safe_load``) with ``bundle_root``
    replaced by :data:`SELF_LOCATING_ROOT`, so that ``monai.bundle.load`` finds the bundle's weights (and their
    settings record) from any working folder."""
    import yaml

    step = "inference_json"
    try:
        content = yaml.safe_load(yaml_text)
    except yaml.YAMLError as e:
        raise PackagingError(step, f"{INFERENCE_YAML} is not valid YAML ({e})") from e
    if not isinstance(content, dict) or "bundle_root" not in content:
        raise PackagingError(step, f"{INFERENCE_YAML} has no top-level bundle_root to locate the bundle by")
    imports = content.get("imports") or []
    # the expression needs both modules in the config's globals; without them load() would fail on a NameError
    missing = [m for m in ("$import os", "$import scripts") if m not in imports]
    if missing:
        raise PackagingError(step, f"{INFERENCE_YAML} lacks the imports {missing} that bundle_root's expression needs")
    content["bundle_root"] = SELF_LOCATING_ROOT
    return json.dumps(content, indent=4) + "\n"


def check_weights(weights: Path, bundle_root: Path, inference_config: str | None = None) -> None:
    """Raise PackagingError unless ``weights`` is a plain state dict that loads strictly into the inference
    config's ``network_def`` as the zoo tools build it once the weights are ``models/model.pt`` (the settings the
    weights record, GLAM's defaults for those they do not; ``inference_config``: the packaged text of
    ``configs/inference.yaml`` when it differs from the bundle's)."""
    import torch
    import yaml
    from monai.bundle import ConfigParser

    step = "weights"
    if not weights.is_file():
        raise PackagingError(step, f"--weights {weights}: no such file")
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the file cannot be shipped
        raise PackagingError(step, f"--weights {weights}: not loadable with weights_only=True ({e})") from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise PackagingError(step, f"--weights {weights}: not a plain state dict of tensors (a training checkpoint?)")
    parser = ConfigParser()
    if inference_config is None:
        parser.read_config(str(bundle_root / "configs" / "inference.yaml"))
    else:
        parser.read_config(yaml.safe_load(inference_config))
    parser["bundle_root"] = str(bundle_root)
    parser["ckpt_path"] = str(weights)  # the packaged inference.yaml reads these weights' settings record
    try:
        net = parser.get_parsed_content("network_def")
    except Exception as e:  # noqa: BLE001 - e.g. a record the network refuses; the message names the setting
        raise PackagingError(step, f"--weights {weights}: network_def cannot be built: {e}") from e
    from scripts.networks.weights import load_weights

    # the bundle's own strict loader: it names missing / unexpected keys, shape mismatches and recorded settings
    # that differ from the network's (a checkpoint without a record loads as before)
    try:
        load_weights(net, weights)
    except ValueError as e:
        raise PackagingError(
            step, f"--weights {weights} does not match network_def of configs/inference.yaml: {e}"
        ) from e


def build_zip(
    out: Path,
    name: str,
    bundle_root: Path = BUNDLE_ROOT,
    weights: Path | None = None,
    preset: Path | None = None,
    ship_weights: bool = True,
    texts: ModelTexts | None = None,
) -> Path:
    """Write the zip atomically and return its path. ``weights``: shipped as ``models/model.pt``; default the
    bundle's own ``models/model.pt`` when it exists, none when ``ship_weights`` is False."""
    meta = json.loads((bundle_root / "configs" / "metadata.json").read_text(encoding="utf-8"))
    zip_path = out if out.suffix == ".zip" else out / f"{name}_v{meta['version']}.zip"
    if weights is not None and not ship_weights:
        raise PackagingError("weights", "--weights and --no-weights exclude each other")
    if preset is not None and weights is None:
        raise PackagingError("preset", "--preset describes the sizes of --weights: give both")
    users_weights = weights is not None
    if texts is not None and not users_weights and any(vars(texts).values()):
        raise PackagingError(
            "metadata",
            "--description, --data_source, --model_card, --metrics, --data_license "
            "describe --weights: give them with --weights",
        )
    if weights is None and ship_weights and (bundle_root / DEFAULT_WEIGHTS).is_file():
        weights = bundle_root / DEFAULT_WEIGHTS
    replaced = {} if preset is None else apply_preset(bundle_root, preset_values(preset))
    if weights is not None:
        check_weights(weights, bundle_root, replaced.get("configs/inference.yaml"))
        window = (recorded_settings(weights) or {}).get("image_size")
        if window is not None and "configs/metadata.json" not in replaced:
            meta_text = metadata_with_shapes(bundle_root, window, "weights")
            if meta_text is not None:
                replaced["configs/metadata.json"] = meta_text
    dropped: set[str] = set()
    if users_weights:
        # the user's model, never the demonstration model's text
        texts = texts or ModelTexts()
        meta_text = replaced.get("configs/metadata.json") or (bundle_root / "configs" / "metadata.json").read_text(
            encoding="utf-8"
        )
        settings = recorded_settings(weights) or {}
        try:
            meta = user_model_metadata(meta_text, weights, settings, texts)
        except ValueError as e:
            raise PackagingError("metadata", str(e)) from e
        replaced["configs/metadata.json"] = json.dumps(meta, indent=4) + "\n"
        if texts.model_card is not None:
            try:
                replaced["docs/README.md"] = texts.model_card.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise PackagingError("model_card", f"--model_card {texts.model_card}: cannot be read ({e})") from e
        else:
            replaced["docs/README.md"] = user_model_card(name, meta, settings)
        if texts.data_license is not None:
            try:
                replaced["docs/data_license.txt"] = texts.data_license.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise PackagingError(
                    "data_license", f"--data_license {texts.data_license}: cannot be read ({e})"
                ) from e
        else:
            replaced["docs/data_license.txt"] = (
                "The licence of the data this model was trained on was not stated by the packager "
                "(package_bundle --data_license FILE).\n"
            )
        dropped = set(DEMO_DOCS) - set(replaced)
    if (bundle_root / INFERENCE_JSON).exists():
        # it is generated from inference.yaml: a hand-written one would be overwritten or disagree with the YAML
        raise PackagingError(
            "inference_json", f"{bundle_root / INFERENCE_JSON} exists; it is written from {INFERENCE_YAML}: remove it"
        )
    yaml_text = replaced.get(INFERENCE_YAML, (bundle_root / INFERENCE_YAML).read_text(encoding="utf-8"))
    generated = {INFERENCE_JSON: inference_json(yaml_text)}
    with atomic_write(zip_path, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{name}/models/", "")  # the zoo layout has models/ even when no weights are shipped
        written = set()
        for src, rel in bundle_files(bundle_root):
            written.add(rel)
            if rel in dropped:
                continue
            if rel in replaced:
                zf.writestr(f"{name}/{rel}", replaced[rel])
            else:
                zf.write(src, f"{name}/{rel}")
        for rel, text in generated.items():
            zf.writestr(f"{name}/{rel}", text)
        for rel, text in replaced.items():  # e.g. the model card of a bundle that had none
            if rel not in written and rel not in generated:
                zf.writestr(f"{name}/{rel}", text)
        if weights is not None:
            zf.write(weights, f"{name}/models/model.pt")
    return zip_path


def _check_script(name: str) -> str:
    """The text of ``tools/bundle_checks/<name>.py``, run with ``python -c`` inside the unzipped bundle (so that the
    repository's folders are not on the path: a script file would put its own folder there)."""
    return (CHECK_SCRIPTS / f"{name}.py").read_text(encoding="utf-8")


def _clean_env(bundle_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(bundle_dir), PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def _run(step: str, args: list[str], bundle_dir: Path, cwd: Path | None = None) -> str:
    """Run ``python args`` with only the bundle folder on the path, from ``cwd`` (default the bundle folder);
    PackagingError on failure."""
    try:
        res = subprocess.run(
            [sys.executable, *args],
            cwd=bundle_dir if cwd is None else cwd,
            env=_clean_env(bundle_dir),
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        raise PackagingError(step, f"timed out after {STEP_TIMEOUT_S} s") from e
    if res.returncode != 0:
        raise PackagingError(step, f"exit code {res.returncode}:\n{(res.stdout + res.stderr)[-3000:]}")
    return res.stdout + res.stderr


def verify_zip(zip_path: Path, name: str, schema: Path | None, report: Report, keep: Path | None = None) -> None:
    """Unzip into a clean temporary folder and check it as described in the module docstring."""
    with tempfile.TemporaryDirectory(prefix="glam_bundle_verify_") as tmp:
        work = Path(tmp) if keep is None else keep
        work.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        try:
            with zipfile.ZipFile(zip_path) as zf:
                bad = zf.testzip()
                if bad is not None:
                    raise PackagingError("unzip", f"{zip_path}: corrupt member {bad}")
                zf.extractall(work / "unzipped")
        except zipfile.BadZipFile as e:
            raise PackagingError("unzip", f"{zip_path}: {e}") from e
        bundle_dir = work / "unzipped" / name
        if not (bundle_dir / "configs" / "inference.yaml").is_file():
            raise PackagingError("unzip", f"{zip_path} has no {name}/configs/inference.yaml")
        report.ok("unzip", str(bundle_dir), time.perf_counter() - t)

        if schema is not None and schema.is_file():
            t = time.perf_counter()
            out = _run(
                "verify_metadata",
                ["-m", "monai.bundle", "verify_metadata", "--meta_file", "configs/metadata.json"]
                + ["--filepath", str(schema.resolve())],
                bundle_dir,
            )
            if "metadata is verified with no error" not in out:
                raise PackagingError("verify_metadata", f"no confirmation in the output:\n{out[-2000:]}")
            report.ok("verify_metadata", f"against {schema.name}", time.perf_counter() - t)
        else:
            report.skip("verify_metadata", f"schema not found at {schema}")

        t = time.perf_counter()
        out = _run("load_configs", ["-c", _check_script("check_configs"), str(REPO_ROOT)], bundle_dir)
        report.ok("load_configs", out.strip().splitlines()[-1], time.perf_counter() - t)

        shipped = (bundle_dir / "models" / "model.pt").is_file()
        h, w = TINY_IMAGE
        # weights that record their window run in it (the record is checked against the network's settings);
        # older ones in a window of the images' size
        own_window = shipped and "image_size" in (recorded_settings(bundle_dir / "models" / "model.pt") or {})
        if shipped:  # images of the network's input size, smaller when that is large (full size on a CPU)
            meta = json.loads((bundle_dir / "configs" / "metadata.json").read_text(encoding="utf-8"))
            shape = meta["network_data_format"]["inputs"]["image"]["spatial_shape"]
            h, w = (min(int(a), b) for a, b in zip(shape, FULL_IMAGE))
        if shipped:
            t = time.perf_counter()
            # from the work folder, not the bundle's: load() must find the bundle by itself
            out = _run(
                "monai_load",
                ["-c", _check_script("monai_load"), str(bundle_dir.parent), name, str(h), str(w)],
                bundle_dir,
                work,
            )
            loaded = [line for line in out.splitlines() if line.startswith("loaded: ")]
            report.ok("monai_load", loaded[-1][len("loaded: ") :] if loaded else "", time.perf_counter() - t)

            t = time.perf_counter()
            # the model zoo's data-shape check (ci/verify_bundle.py: verify_net_in_out with bundle_root) at the
            # metadata's shapes
            out = _run(
                "verify_net_in_out",
                ["-m", "monai.bundle", "verify_net_in_out", "network_def", "--meta_file", "configs/metadata.json"]
                + ["--config_file", INFERENCE_JSON, "--bundle_root", str(bundle_dir)],
                bundle_dir,
            )
            if "data shape of network is verified with no error" not in out:
                raise PackagingError("verify_net_in_out", f"no confirmation in the output:\n{out[-2000:]}")
            report.ok("verify_net_in_out", f"{INFERENCE_JSON} at the metadata's shapes", time.perf_counter() - t)
        else:
            report.skip("monai_load", "no weights shipped")
            report.skip("verify_net_in_out", "no weights shipped")

        t = time.perf_counter()
        _run(
            "synthetic_inputs",
            ["-c", _check_script("make_inputs"), str(work), str(h), str(w), "0" if shipped else "1"],
            bundle_dir,
        )
        report.ok("synthetic_inputs", f"2 images of {h}x{w}", time.perf_counter() - t)

        t = time.perf_counter()
        overrides = {
            "bundle_root": str(bundle_dir),
            "input_dir": str(work / "inputs"),
            "output_dir": str(work / "out"),
            "num_workers": "0",
            "crop_iterations": "5",
            "crop_buffer": "4",
            "panel_height": "None",
        }
        if not own_window:
            overrides["image_size"] = f"[{h},{w}]"
        if not shipped:
            overrides.update({k: str(v) for k, v in TINY_NETWORK.items()}, ckpt_path=str(work / "tiny_model.pt"))
        args = ["-m", "monai.bundle", "run", "inference", "--config_file", "configs/inference.yaml"]
        args += ["--meta_file", "configs/metadata.json"]
        for k, v in overrides.items():
            args += [f"--{k}", v]
        _run("inference", args, bundle_dir)
        predictions = work / "out" / "predictions.csv"
        if not predictions.is_file():
            raise PackagingError("inference", f"no {predictions}")
        with open(predictions, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        if len(rows) != 2:
            raise PackagingError("inference", f"{predictions} has {len(rows)} rows, expected 2")
        for row in rows:
            probs = [float(row["prob_benign"]), float(row["prob_malignant"])]
            if not all(0.0 <= p <= 1.0 for p in probs):
                raise PackagingError("inference", f"{row['image']}: probabilities {probs} outside [0, 1]")
        weights = "shipped models/model.pt" if shipped else "random tiny checkpoint"
        report.ok("inference", f"predictions.csv has 2 rows ({weights})", time.perf_counter() - t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for <name>_v<version>.zip, or a .zip path")
    weights = ap.add_mutually_exclusive_group()
    weights.add_argument(
        "--weights",
        type=Path,
        help="state dict to ship as models/model.pt instead of the bundle's own models/model.pt (checked first)",
    )
    weights.add_argument(
        "--no-weights", action="store_true", help="ship no weights (models/ empty), e.g. with a large_files.yml"
    )
    ap.add_argument(
        "--preset",
        type=Path,
        help="the preset --weights were trained with; only for weights that record no settings (older checkpoints)",
    )
    ap.add_argument("--name", default="glam_mammography", help="bundle name: the zip's top-level folder")
    ap.add_argument(
        "--description", help="with --weights: metadata description of the model (default: from its settings)"
    )
    ap.add_argument("--data_source", help="with --weights: the data the model was trained on (metadata data_source)")
    ap.add_argument("--model_card", type=Path, help="with --weights: Markdown file shipped as docs/README.md")
    ap.add_argument("--metrics", type=Path, help="with --weights: evaluate's metrics.json, into eval_metrics")
    ap.add_argument("--data_license", type=Path, help="with --weights: text file shipped as docs/data_license.txt")
    ap.add_argument("--schema", type=Path, default=DEFAULT_SCHEMA, help="metadata schema (skipped when missing)")
    ap.add_argument("--keep", type=Path, help="verify in this folder and keep it (for debugging)")
    args = ap.parse_args(argv)
    if not args.name or "/" in args.name or args.name.startswith("."):
        ap.error(f"--name must be a plain folder name, got {args.name!r}")
    report = Report()
    step = "build"
    try:
        t = time.perf_counter()
        texts = ModelTexts(args.description, args.data_source, args.model_card, args.metrics, args.data_license)
        zip_path = build_zip(
            args.out,
            args.name,
            weights=args.weights,
            preset=args.preset,
            ship_weights=not args.no_weights,
            texts=texts,
        )
        with zipfile.ZipFile(zip_path) as zf:
            n = len([i for i in zf.infolist() if not i.is_dir()])
        report.ok("build", f"{zip_path} ({n} files, {zip_path.stat().st_size / 1e6:.2f} MB)", time.perf_counter() - t)
        step = "verify"
        verify_zip(zip_path, args.name, args.schema, report, keep=args.keep)
    except PackagingError as e:
        print(f"FAILED {e.step}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - the report must name the step whatever went wrong
        print(f"FAILED {step}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"bundle verified: {zip_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
