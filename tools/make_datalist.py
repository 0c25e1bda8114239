#!/usr/bin/env python
"""Build a datalist ({"training", "validation", "test"}, split by patient) from your files.

Examples (docs/own_data.md walks through each source):
    # CBIS-DDSM as downloaded from TCIA (the CSVs' UID paths are resolved in the tree; official test set kept)
    python tools/make_datalist.py --csv mass_case_description_train_set.csv mass_case_description_test_set.csv \
        calc_case_description_train_set.csv calc_case_description_test_set.csv \
        --root /data/CBIS-DDSM --out /data/lists/cbis.json
    # VinDr-Mammo (labels from BI-RADS; the CSV's split column is kept; finding_annotations.csv adds the boxes)
    python tools/make_datalist.py --csv /data/vindr/breast-level_annotations.csv \
        /data/vindr/finding_annotations.csv --root /data/vindr --out /data/vindr/datalist.json
    # INbreast (';'-separated INbreast.csv, AllDICOMs/, AllXML/)
    python tools/make_datalist.py --csv /data/INbreast/INbreast.csv --root /data/INbreast --out /data/lists/inb.json
    # a hospital folder sorted by class: <root>/normal/..., <root>/benign/..., <root>/malignant/...
    python tools/make_datalist.py --folder /data/hospital --out /data/lists/hospital.json
    # inference-only list from a folder of DICOMs (labels unknown: every item in "test")
    python tools/make_datalist.py --dicom-dir /data/exams --out /data/exams/datalist.json --fractions 0 0 1

Paths in the datalist are relative to its folder (MONAI's base_dir convention) unless --absolute; symbolic links
are kept as given. Exit status: 0 on success; 1 when a file or CSV row could not be used (every one listed; nothing
is written unless --allow-missing); 2 on bad arguments, when nothing usable was found, or when the split would
break training (an empty validation split, a requested split left empty, no labels to train on).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent / "bundle"))
if str(_HERE) not in sys.path:  # loaded by path (importlib), not run: the datalists package beside this file
    sys.path.insert(0, str(_HERE))

from datalists.builders import (  # noqa: E402
    items_from_csv,
    items_from_dicom_dir,
    items_from_folder,
    path_for_datalist,
    split_choices,
    split_items,
    unique_boxes,
)
from datalists.parsers import parse_spacing  # noqa: E402

from scripts.atomic import probe_writable  # noqa: E402
from scripts.data.datalist import (  # noqa: E402
    SPLITS,
    DatalistError,
    check_patient_splits,
    check_split_sizes,
    load_datalist,
    normalise_fractions,
    patient_key,
    resolve_paths,
    save_datalist,
)
from scripts.data.errors import CsvRowError  # noqa: E402


def _spacing_option(text: str):
    try:
        value = parse_spacing(text, "--pixel_spacing")
    except CsvRowError as err:
        raise argparse.ArgumentTypeError(str(err).split(": ", 1)[1]) from None
    return "none" if value is None else value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--csv", type=Path, nargs="+", help="CSV(s) of a known layout (docs/data.md)")
    source.add_argument("--folder", type=Path, help="hospital folder with normal/ benign/ malignant/ sub-folders")
    source.add_argument("--dicom-dir", type=Path, help="folder searched recursively for DICOMs (labels unknown)")
    parser.add_argument("--out", type=Path, required=True, help="datalist JSON to write")
    parser.add_argument("--root", type=Path, default=None, help="root of the CSV's file paths (default: its folder)")
    parser.add_argument("--mask-dir", type=Path, default=None, help="where merged masks go (default: OUT's folder)")
    parser.add_argument("--fractions", type=float, nargs=3, default=(0.7, 0.15, 0.15), metavar=("TRAIN", "VAL", "TEST"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--official-split",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the archive's own test set (CBIS-DDSM, VinDr-Mammo); TRAIN:VAL then split the rest",
    )
    parser.add_argument("--val-datalist", type=Path, default=None, help="a datalist whose items are the validation")
    parser.add_argument(
        "--pixel_spacing",
        "--pixel-spacing",
        dest="pixel_spacing",
        type=_spacing_option,
        default=None,
        help="mm per pixel for every item ('0.05' or '0.05,0.06'; 'none' removes the CSV's or preset's value)",
    )
    parser.add_argument("--allow-missing", action="store_true", help="write the datalist without the rows that failed")
    parser.add_argument("--absolute", action="store_true", help="write absolute paths")
    return parser


def _collect(args, relative_to) -> tuple[list[dict], list[str], list[str]]:
    items: list[dict] = []
    skipped: list[str] = []
    notes: list[str] = []
    if args.dicom_dir is not None:
        items, skipped = items_from_dicom_dir(args.dicom_dir, relative_to)
    elif args.folder is not None:
        items, skipped = items_from_folder(args.folder, relative_to)
    else:
        mask_dir = args.mask_dir or Path(os.path.abspath(args.out)).parent / "merged_masks"
        for csv_file in args.csv:
            got, problems = items_from_csv(csv_file, args.root, relative_to, mask_dir, notes=notes)
            items += got
            skipped += problems
        items = _merge_duplicates(items, skipped)
    return items, skipped, notes


def _merge_duplicates(items: list[dict], skipped: list[str]) -> list[dict]:
    """One item per image across CSVs (VinDr-Mammo's breast-level and finding CSVs name the same images): labels
    OR-ed, boxes listed together (once each), the first CSV's fields kept; masks that differ for one class are a
    problem (the item keeps the first)."""
    by_image: dict[str, dict] = {}
    for item in items:
        first = by_image.setdefault(item["image"], item)
        if first is item:
            continue
        if first.get("label") is not None and item.get("label") is not None:
            first["label"] = [max(a, b) for a, b in zip(first["label"], item["label"])]
        else:
            first["label"] = first.get("label") if first.get("label") is not None else item.get("label")
        if item.get("boxes"):  # VinDr-Mammo: the finding CSV's boxes join the breast-level CSV's item
            first.setdefault("boxes", []).extend(item["boxes"])
        for key, value in item.items():
            if key.startswith("mask_") and first.get(key) not in (None, value):
                skipped.append(f"{item['image']}: two CSVs give different {key} ({first[key]}, {value}); first kept")
            first.setdefault(key, value)
    for item in by_image.values():
        if item.get("boxes"):
            item["boxes"] = unique_boxes(item["boxes"])
    return [{k: v for k, v in it.items() if v is not None} for it in by_image.values()]


def _apply_spacing(items: list[dict], spacing) -> None:
    for item in items:
        if spacing == "none":
            item.pop("pixel_spacing", None)
            item.pop("pixel_spacing_source", None)
        elif spacing is not None:
            item["pixel_spacing"] = list(spacing) if isinstance(spacing, tuple) else spacing
            item["pixel_spacing_source"] = "user:--pixel_spacing"


def _external_validation(path: Path, relative_to) -> list[dict]:
    """Every item of another datalist, its paths re-expressed for the new datalist's folder."""
    data = resolve_paths(load_datalist(path), Path(os.path.abspath(path)).parent)
    out = []
    for split in data:
        for item in data[split]:
            item = dict(item)
            for key in ("image", "mask_benign", "mask_malignant"):
                if isinstance(item.get(key), str):
                    item[key] = path_for_datalist(item[key], relative_to)
            out.append(item)
    return out


def _summary(datalist: dict, n_skipped: int) -> str:
    parts = []
    for split in SPLITS:
        items = datalist.get(split, [])
        parts.append(f"{split}: {len(items)} images / {len({patient_key(it) for it in items})} patients")
    every = [it for split in SPLITS for it in datalist.get(split, [])]
    labelled = sum(1 for it in every if it.get("label") is not None)
    masked = sum(1 for it in every if any(k.startswith("mask_") for k in it))
    line = f"{'; '.join(parts)}; {labelled} of {len(every)} labelled, {masked} with masks; {n_skipped} skipped"
    sources = sorted({str(it.get("pixel_spacing_source")) for it in every if "pixel_spacing" in it})
    if sources:
        n = sum(1 for it in every if "pixel_spacing" in it)
        line += f"; pixel_spacing on {n} items from {', '.join(sources)} (used where a file states none)"
    return line


def _check_out(out: Path) -> None:
    """``--out`` names a file that can be written: not a folder, in a folder (or one to create) that accepts a new
    file; else a ``DatalistError`` naming the flag. Checked before any file is searched or read."""
    path = Path(os.path.abspath(out))
    if path.is_dir():
        raise DatalistError(
            f"--out {out} is a folder: give the datalist's file name (e.g. --out {out / 'datalist.json'})"
        )
    try:
        probe_writable(path.parent)
    except OSError as err:
        raise DatalistError(
            f"--out {out} cannot be written ({err.strerror or err}): choose a file in a writable folder"
        ) from None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    relative_to = None if args.absolute else Path(os.path.abspath(args.out)).parent
    try:
        _check_out(args.out)
        fractions = normalise_fractions(args.fractions)
        items, skipped, notes = _collect(args, relative_to)
        for line in skipped:
            print(f"SKIPPED {line}", file=sys.stderr)
        if not items:
            raise DatalistError("no usable images found" + (f" ({len(skipped)} skipped)" if skipped else ""))
        if fractions["training"] > 0 and not any(it.get("label") is not None for it in items):
            raise DatalistError(
                "no item has a label, so there is nothing to train on: use --fractions 0 0 1 for an inference-only "
                "list, or give labels (--csv with a label column, --folder with normal/benign/malignant folders)"
            )
        _apply_spacing(items, args.pixel_spacing)
        external = None if args.val_datalist is None else _external_validation(args.val_datalist, relative_to)
        if external is not None:  # the validation comes from elsewhere: training and test share the rest
            rest = fractions["training"] + fractions["test"]
            fractions = {"training": fractions["training"] / rest, "validation": 0.0, "test": fractions["test"] / rest}
        datalist, split_notes = split_items(items, fractions, seed=args.seed, official=args.official_split)
        notes += split_notes
        if external is not None:
            datalist["validation"] = external
        problems = check_split_sizes(datalist, None if split_notes else fractions)
        if problems:
            n_patients = len({patient_key(it) for it in items})
            raise DatalistError(f"{'; '.join(problems)}; {split_choices(n_patients)}")
    except (DatalistError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    overlap = check_patient_splits(datalist)
    if overlap:  # only an external validation list can bring a patient in twice
        print(f"error: {'; '.join(overlap)}", file=sys.stderr)
        return 2
    for line in notes:
        print(f"note: {line}", file=sys.stderr)
    if skipped and not args.allow_missing:
        print(
            f"error: {len(skipped)} file(s) or row(s) could not be used (listed above); nothing written. Fix them, "
            "or pass --allow-missing to write the datalist without them",
            file=sys.stderr,
        )
        return 1
    try:
        save_datalist(datalist, args.out)
    except OSError as err:  # the disk filled, the folder went away since the check
        print(f"error: --out {args.out} cannot be written ({err.strerror or err}); nothing written", file=sys.stderr)
        return 1
    print(f"wrote {args.out} ({_summary(datalist, len(skipped))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
