#!/usr/bin/env python
"""Build a datalist ({"training", "validation", "test"}, split by patient) from a DICOM folder or CSV file(s).

Examples:
    # inference-only list from a folder of DICOMs (labels unknown: items have no "label")
    python scripts/make_datalist.py --dicom-dir /data/exams --out /data/exams/datalist.json --fractions 0 0 1
    # CBIS-DDSM description CSVs (one row per abnormality; several ROI masks of an image are merged)
    python scripts/make_datalist.py --csv mass_case_description_train_set.csv calc_case_description_train_set.csv \
        --root /data/CBIS-DDSM --out /data/CBIS-DDSM/datalist.json
    # VinDr-Mammo (labels from BI-RADS, see docs/data.md)
    python scripts/make_datalist.py --csv finding_annotations.csv --root /data/vindr --out /data/vindr/datalist.json

Paths in the datalist are relative to its folder (MONAI's base_dir convention) unless --absolute.
Exit status: 0 on success, 1 when files or rows were skipped (all listed; the datalist is still written), 2 on
bad arguments or when nothing usable was found.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bundle"))

from scripts.data.datalist import (  # noqa: E402
    DatalistError,
    check_patient_splits,
    items_from_csv,
    items_from_dicom_dir,
    save_datalist,
    split_by_patient,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--dicom-dir", type=Path, help="folder searched recursively for DICOM mammograms")
    source.add_argument("--csv", type=Path, nargs="+", help="CBIS-DDSM-like, VinDr-Mammo-like or generic CSV(s)")
    parser.add_argument("--out", type=Path, required=True, help="datalist JSON to write")
    parser.add_argument("--root", type=Path, default=None, help="root of the CSV's file paths (default: its folder)")
    parser.add_argument("--mask-dir", type=Path, default=None, help="where merged masks go (default: OUT's folder)")
    parser.add_argument("--fractions", type=float, nargs=3, default=(0.7, 0.15, 0.15), metavar=("TRAIN", "VAL", "TEST"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--absolute", action="store_true", help="write absolute paths")
    args = parser.parse_args(argv)

    relative_to = None if args.absolute else args.out.resolve().parent
    items: list[dict] = []
    skipped: list[str] = []
    try:
        if args.dicom_dir is not None:
            items, skipped = items_from_dicom_dir(args.dicom_dir, relative_to)
        else:
            mask_dir = args.mask_dir or args.out.resolve().parent / "merged_masks"
            for csv_file in args.csv:
                got, problems = items_from_csv(csv_file, args.root, relative_to, mask_dir)
                items += got
                skipped += problems
        if not items:
            raise DatalistError("no usable images found" + (f" ({len(skipped)} skipped)" if skipped else ""))
        datalist = split_by_patient(items, fractions=args.fractions, seed=args.seed)
    except (DatalistError, ValueError) as err:
        for line in skipped:
            print(f"SKIPPED {line}", file=sys.stderr)
        print(f"error: {err}", file=sys.stderr)
        return 2
    overlap = check_patient_splits(datalist)
    assert not overlap, overlap  # split_by_patient guarantees it; a failure here is a bug, not bad input
    save_datalist(datalist, args.out)
    for line in skipped:
        print(f"SKIPPED {line}", file=sys.stderr)
    counts = ", ".join(f"{k}: {len(v)}" for k, v in datalist.items())
    labelled = sum(1 for it in items if it.get("label") is not None)
    print(f"wrote {args.out} ({counts}; {labelled} of {len(items)} labelled; {len(skipped)} skipped)")
    return 1 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
