"""Step ``synthetic_inputs`` of tools/package_bundle.py, run with only the unzipped bundle on the path: two
mammogram-shaped 16-bit PNGs (a textured half-ellipse against the chest wall, drawn here with numpy, since the
bundle ships no data generator), and a random tiny checkpoint when no weights are shipped.
Arguments: work folder, height, width, 1 for the tiny checkpoint."""

import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from scripts.enums import Stage
from scripts.networks import GLAMSaliencyNet

work, h, w, tiny = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
inputs = work / "inputs"
inputs.mkdir(parents=True)
rows, cols = np.mgrid[0:h, 0:w]
for i, name in enumerate(("0_L-CC.png", "0_R-CC.png")):
    rng = np.random.default_rng(11 + i)
    breast = ((rows - h / 2) / (0.45 * h)) ** 2 + (cols / (0.8 * w)) ** 2 <= 1  # chest wall at column 0
    texture = 1500 + 800 * rng.random((h // 8 + 1, w // 8 + 1)).repeat(8, 0).repeat(8, 1)[:h, :w]
    Image.fromarray(np.where(breast, texture, 0).astype(np.uint16)).save(inputs / name)
if tiny:
    torch.manual_seed(0)
    torch.save(
        GLAMSaliencyNet(stage=Stage.JOINT, patch_size=64, local_depth=18, local_width=4).state_dict(),
        work / "tiny_model.pt",
    )
print(len(list(inputs.iterdir())), "images")
