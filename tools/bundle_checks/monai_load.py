"""Step ``monai_load`` of tools/package_bundle.py, run with only the unzipped bundle on the path and from another
folder, as a user of the zoo's API would: ``monai.bundle.load`` must return the network of configs/inference.json
holding exactly the shipped tensors. Arguments: the folder holding the bundle, its name, height, width."""

import json
import sys
from pathlib import Path

import torch
from monai.bundle import load

bundle_dir, name, h, w = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
root = (bundle_dir / name).resolve()
net = load(name, bundle_dir=str(bundle_dir), workflow_type="inference", device="cpu")
if not isinstance(net, torch.nn.Module):
    sys.exit(f"monai.bundle.load returned a {type(net).__name__}, not a network")
source = Path(sys.modules[type(net).__module__].__file__).resolve()
assert source.is_relative_to(root), f"the network class comes from {source}, not from {root}"
from scripts.networks.settings import SETTINGS_KEY, decode_settings, settings_differences  # noqa: E402 (load imports the bundle first)

shipped = torch.load(root / "models" / "model.pt", map_location="cpu", weights_only=True)
state = net.state_dict()
# load() copies only the tensors whose names and shapes match, silently: compare every one
tensors = set(shipped) - {SETTINGS_KEY}
assert tensors == set(state) - {SETTINGS_KEY}, f"names differ: {sorted(tensors ^ (set(state) - {SETTINGS_KEY}))[:10]}"
differ = [k for k in sorted(tensors) if not torch.equal(state[k], shipped[k])]
assert not differ, f"{len(differ)} tensors differ from models/model.pt, e.g. {differ[:5]}"
# the network keeps its own settings record (bundle version included): it must say what the shipped one says
if SETTINGS_KEY in shipped:
    diffs = settings_differences(decode_settings(shipped[SETTINGS_KEY]), decode_settings(state[SETTINGS_KEY]))
    assert not diffs, f"the network was built with other settings than the weights record: {diffs}"
meta = json.loads((root / "configs" / "metadata.json").read_text(encoding="utf-8"))
channels = meta["network_data_format"]["outputs"]["pred"]["num_channels"]
with torch.no_grad():
    out = net.eval()(torch.rand(1, 1, h, w))
assert tuple(out.shape) == (1, channels, h // 4, w // 4), f"S_c of shape {tuple(out.shape)} for a {h}x{w} input"
print(f"loaded: {type(net).__name__} with the {len(tensors)} tensors of models/model.pt; S_c {tuple(out.shape)}")
