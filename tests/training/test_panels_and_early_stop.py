"""TensorBoard saliency panels and the early-stopping option of the training workflow."""

import numpy as np
import pytest
import torch
from conftest import TINY_CONFIG, TRAIN_CONFIG, tiny_overrides
from ignite.engine import Engine

from scripts.handlers.panels import SaliencyPanelWriter
from scripts.training.workflow import GLAMWorkflow
from scripts.visualize import CLASS_COLOURS, saliency_panel


def test_saliency_panel_layout_and_colours():
    image = np.zeros((8, 6), np.float32)
    image[0, 0] = 1.0
    maps = {"S_g": np.zeros((2, 8, 6)), "S_c": np.zeros((2, 8, 6))}
    maps["S_c"][1, 4, 3] = 1.0  # one fully salient malignant pixel
    masks = np.zeros((2, 8, 6))
    panel = saliency_panel(image, maps, boxes=[[2, 1, 4, 4]], masks=masks, separator=2)
    assert panel.shape == (8, 3 * 6 + 2 * 2, 3) and panel.dtype == np.uint8
    s_c = panel[:, 2 * 8 :]
    expected = 0.2 * 0 + 0.8 * np.array(CLASS_COLOURS[1])  # grey 0 blended 80 % towards red
    np.testing.assert_allclose(s_c[4, 3], expected.astype(np.uint8), atol=1)
    assert tuple(panel[2, 8 + 1]) == (40, 140, 255)  # the patch outline on the S_g panel
    with pytest.raises(ValueError, match="image's size"):
        saliency_panel(image, {"bad": np.zeros((2, 4, 4))})


def test_panel_writer_writes_images_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def step(engine, _):
        return [
            {
                "image": torch.rand(1, 16, 12),
                "lesion_mask": torch.zeros(2, 16, 12),
                "S_g": torch.rand(2, 16, 12),
                "S_l": torch.rand(2, 16, 12),
                "S_c": torch.rand(2, 16, 12),
                "patch_boxes": torch.tensor([[0, 0, 8, 8]]),
            }
        ]

    engine = Engine(step)
    SaliencyPanelWriter(tmp_path, num_images=2, stride=2).attach(engine)
    engine.run(range(3), max_epochs=2)
    events = EventAccumulator(str(tmp_path), size_guidance={"images": 0})
    events.Reload()
    assert sorted(events.Tags()["images"]) == ["validation/image0", "validation/image1"]
    shown = events.Images("validation/image0")
    assert [e.step for e in shown] == [1, 2]
    assert (shown[0].height, shown[0].width) == (8, 4 * 6 + 3 * 4)


def test_early_stopping_ends_a_stage_after_patience(tmp_path, tiny_datalist):
    # with a learning rate of zero the key metric never improves: patience 1 stops after the second validation
    wf = GLAMWorkflow(
        config_file=[str(TRAIN_CONFIG), str(TINY_CONFIG)],
        meta_file=str(TRAIN_CONFIG.parent / "metadata.json"),
        workflow_type="train",
        **tiny_overrides(
            tmp_path,
            tiny_datalist,
            stage="global",
            early_stop_patience=1,
            epochs={"global": 5, "local": 1, "joint": 1},
            learning_rate={"global": 0.0, "local": 0.0, "joint": 0.0},
        ),
    )
    wf.initialize()
    wf.run()
    last = torch.load(tmp_path / "models" / "global" / "last.pt", weights_only=True)
    assert last["trainer"]["iteration"] == 2 * last["trainer"]["epoch_length"]
