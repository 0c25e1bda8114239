#!/usr/bin/env python
"""Write a GLAM checkpoint with the model settings it was trained with recorded in it.

    python tools/record_model_settings.py OLD.pt NEW.pt --config_file "['bundle/configs/train.yaml','PRESET.yaml']"
    python tools/record_model_settings.py OLD.pt NEW.pt --config_file ... --set pixel_spacing=0.4

For checkpoints written before the bundle recorded settings (they load, but inference then needs the preset they
were trained with): the network is built from ``network_def`` of the given configs (train.yaml and the preset, with
``--set id=value`` overrides, values parsed as YAML), the old weights are loaded into it strictly, and its state dict,
which carries the settings record, is written atomically to NEW.pt. A checkpoint that already records settings is
checked against the configs: settings that differ stop the tool with their names.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bundle"))

import yaml  # noqa: E402
from monai.bundle import ConfigParser  # noqa: E402

from scripts.enums import Stage  # noqa: E402
from scripts.networks.settings import SETTINGS_KEY, decode_settings  # noqa: E402
from scripts.networks.weights import load_weights, save_atomic  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="the checkpoint (a plain state dict)")
    parser.add_argument("output", type=Path, help="where to write the checkpoint with its settings")
    parser.add_argument(
        "--config_file", required=True, help="a config file, or a Python list of them, as for monai.bundle run"
    )
    parser.add_argument("--set", action="append", default=[], metavar="ID=VALUE", help="override a config id")
    args = parser.parse_args(argv)
    if not args.source.is_file():
        parser.error(f"source checkpoint {args.source} does not exist")
    files = ast.literal_eval(args.config_file) if args.config_file.lstrip().startswith("[") else [args.config_file]
    for file in files:
        if not Path(file).is_file():
            parser.error(f"config file {file} does not exist")
    config = ConfigParser()
    config.read_config(files)
    # train.yaml's 'all' is not a network stage, and the stage is not a recorded setting
    config["stage"] = Stage.JOINT.value
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--set {item!r}: expected ID=VALUE")
        config[key] = yaml.safe_load(value)
    try:
        network = load_weights(config.get_parsed_content("network_def"), args.source)
    except ValueError as err:
        print(f"{args.source}: {err}", file=sys.stderr)
        return 1
    state = network.state_dict()
    save_atomic(state, args.output)
    settings = decode_settings(state[SETTINGS_KEY])
    print("\n".join(f"{name}: {value}" for name, value in sorted(settings.items())))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
