"""Performance measurements of the product, each run as ``python -m glam_benchmark.performance.<name>``:
``model`` (full-size inference speed), ``training`` (a training step per stage, memory, scaling, DDP, the input
pipeline), ``inference`` (a folder's inference against its unavoidable work) and ``vs_reference`` (against the
authors' code, same weights). Figures and commands: docs/performance.md."""
