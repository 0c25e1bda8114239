"""Step ``synthetic_inputs`` of tools/package_bundle.py, run with only the unzipped bundle on the path: two
synthetic mammograms from the bundle's own generator, and a random tiny checkpoint when no weights are shipped.
Arguments: work folder, height, width, 1 for the tiny checkpoint."""

import shutil
import sys
from pathlib import Path

import torch

from scripts.data.synthetic import make_synthetic_dataset
from scripts.enums import Stage
from scripts.networks import GLAMSaliencyNet

work, h, w, tiny = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
make_synthetic_dataset(work / "synthetic", 2, size=(h, w), seed=11, fmt="png")
inputs = work / "inputs"
inputs.mkdir()
for f in sorted((work / "synthetic" / "images").iterdir())[:2]:
    shutil.copy(f, inputs / f.name)
if tiny:
    torch.manual_seed(0)
    torch.save(
        GLAMSaliencyNet(stage=Stage.JOINT, patch_size=64, local_depth=18, local_width=4).state_dict(),
        work / "tiny_model.pt",
    )
print(len(list(inputs.iterdir())), "images")
