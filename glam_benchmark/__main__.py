"""The GLAM paper's Table-1 benchmark on synthetic mammograms: GLAM (three stages), CAM, GMIC and a fully
supervised U-Net, each tuned by the same random search, selected by validation Dice and evaluated on the test split.

    python -m glam_benchmark --preset glam_benchmark/configs/benchmark_cpu.yaml   # about 45 minutes on 2 CPU cores
    python -m glam_benchmark --preset glam_benchmark/configs/benchmark_full.yaml  # the paper's image size, for a GPU

What it does, in order (every step is a subprocess of the bundle's own workflows, ``python -m monai.bundle
run_workflow scripts.GLAMWorkflow --run_id training|evaluating`` with config lists and overrides, so nothing of
training or evaluation is re-implemented):

1. generates the preset's synthetic dataset (fixed seed, training/validation/test split by patient) under
   ``<work_dir>/data`` and checks it once;
2. per model, ``benchmark#trials`` trials with hyper-parameters drawn from
   ``glam_benchmark/configs/benchmark_search.yaml`` (the same number of trials and epochs for every model): each
   trains the model's one stage (GLAM: its global stage) with the workflow's checkpoint selection by validation
   Dice, then evaluates that checkpoint on the validation split (``metrics.json``); a model none of whose trials
   learnt to localise (validation pointing game above the no-learning map's) gets ``benchmark#extra_trials`` more,
   one after another until one does; the trial with the best validation Dice (mean over the two classes of the mean
   soft Dice of the model's map) among those that learnt, among all when none did, is kept;
3. GLAM: the local and joint stages train from the selected global module; the local-stage model (S_g, S_l and
   their average S_c-sep: the paper's Table 2) and the joint model (S_c) are evaluated on the test split;
   each baseline's selected checkpoint is evaluated on the test split (its map is the report's ``S_g`` row);
4. writes ``results.md`` (the paper's Table 1 and Table 2 layouts, relative gains over GMIC, the acceptance
   conditions, every trial, hardware, wall times, dataset settings), ``images/benchmark_dice_scatter.png``
   (per-image Dice of S_g vs S_l of the joint GLAM on the test split, from its ``metrics.csv``: the paper's
   Figure 4) and ``images/benchmark_examples.png`` (test images with lesions: input, ground truth, CAM, GMIC,
   GLAM S_c, each model run on them with the bundle's own preprocessing, network and postprocessing).

Resumable: a step whose output exists (a trial's ``validation/metrics.json``, a stage's ``*_trained.json``, a
test ``metrics.json``) is skipped, and an interrupted training continues from its ``last.pt``. A failed step is
reported and the steps that do not depend on it still run; the exit status is then 1. A full disk stops the run
instead, with one line saying so (every later step would fail the same way): free space and run the same command.

This file is the package's command line; its ``__init__`` lists the modules.
"""

from __future__ import annotations

import sys

from .driver import main

if __name__ == "__main__":
    sys.exit(main())
