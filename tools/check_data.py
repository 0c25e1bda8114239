#!/usr/bin/env python
"""Check a datalist: read every file once and report every unreadable or inconsistent item in one run.

Exit status: 0 when the datalist is usable, 1 when any problem was found (all are listed; a datalist with training
items but no validation items is one: training would select no model), 2 on bad arguments.

Examples:
    python tools/check_data.py data/synthetic/datalist.json
    python tools/check_data.py my_list.json --base-dir /data/cbis --list-ok
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bundle"))

from scripts.atomic import atomic_path  # noqa: E402
from scripts.data.checks import run_data_checks  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("datalist", type=Path, help="datalist JSON ({'training': [...], ...})")
    parser.add_argument("--base-dir", type=Path, default=None, help="root of relative paths (default: its folder)")
    parser.add_argument("--no-read", action="store_true", help="check structure, labels and splits only")
    parser.add_argument(
        "--lenient-masks", action="store_true", help="accept an empty mask under label 1 (breast-level labels)"
    )
    parser.add_argument("--list-ok", action="store_true", help="also list the items that passed")
    parser.add_argument("--json", type=Path, default=None, help="also write the problems as JSON here")
    args = parser.parse_args(argv)

    report = run_data_checks(
        args.datalist, args.base_dir, read_files=not args.no_read, strict_masks=not args.lenient_masks
    )
    print(report.format(list_ok=args.list_ok))
    if args.json is not None:
        payload = {
            "datalist": report.source,
            "n_items": report.n_items,
            "n_ok": len(report.ok_items),
            "problems": [
                {"split": p.split, "index": p.index, "key": p.key, "file": p.file, "message": p.message}
                for p in report.problems
            ],
            # image -> the (row, col) mm its file states, null when none (images that were read)
            "pixel_spacing": {image: None if v is None else list(v) for image, v in report.spacings.items()},
        }
        with atomic_path(args.json) as tmp:
            tmp.write_text(json.dumps(payload, indent=2) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
