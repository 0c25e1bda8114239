"""Step ``load_configs`` of tools/package_bundle.py, run inside the unzipped bundle (``python -c`` with this
file's text, only the bundle folder on the path): proves ``scripts`` comes from there and nothing from the
repository is on the path, then reads every config and restricts what it can reach (``_target_`` and ``$import``
to ``scripts.``, MONAI, torch/ignite, numpy and the standard library). Argument: the repository's root."""

import ast
import sys
from pathlib import Path

from monai.bundle import ConfigParser
from monai.bundle.config_item import ComponentLocator

import scripts

repo = sys.argv[1]
here = Path.cwd().resolve()
assert Path(scripts.__file__).resolve().is_relative_to(here), f"scripts imported from {scripts.__file__}"
# the interpreter's own environment may live inside the repository (.venv): only its installed packages count
env = [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()]
bad = [
    p
    for p in sys.path
    if p
    and Path(p).resolve().is_relative_to(Path(repo))
    and not any(Path(p).resolve().is_relative_to(e) for e in [here, *env])
]
assert not bad, f"repository on sys.path: {bad}"
ALLOWED = {"scripts", "monai", "torch", "ignite", "numpy"} | set(sys.stdlib_module_names)
locator = ComponentLocator()
problems, n = [], 0


def walk(node, where):
    if isinstance(node, dict):
        t = node.get("_target_")
        if isinstance(t, str):
            top = t.split(".")[0]
            if "." in t and top not in ALLOWED:
                problems.append(f"{where}: _target_ {t}")
            elif "." not in t and locator.get_component_module_name(t) is None:
                problems.append(f"{where}: _target_ {t} is not a MONAI component")
        for k, v in node.items():
            walk(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            walk(v, f"{where}[{i}]")
    elif isinstance(node, str) and node.startswith("$") and ("import " in node):
        for stmt in ast.parse(node[1:]).body:
            names = [a.name for a in stmt.names] if isinstance(stmt, ast.Import) else [stmt.module or ""]
            problems.extend(f"{where}: imports {m}" for m in names if m.split(".")[0] not in ALLOWED)


files = [f for f in sorted(Path("configs").iterdir()) if f.suffix in (".yaml", ".yml", ".json")]
layered = []
for f in files:
    # an overlay (evaluate.yaml, multi_gpu_train.yaml, inference_reference.yaml) only loads over its base config, and
    # an overlay of the evaluation (multi_gpu_evaluate.yaml) over train.yaml and evaluate.yaml
    for base in [None, "train.yaml", "inference.yaml", "train.yaml + evaluate.yaml"]:
        parser = ConfigParser()
        try:
            parser.read_config([*(f"configs/{b}" for b in base.split(" + ")), str(f)] if base else str(f))
            parser.parse()
        except KeyError as e:
            err = e
            continue
        break
    else:
        sys.exit(f"{f}: does not load alone nor over train.yaml, inference.yaml or train.yaml + evaluate.yaml: {err}")
    if base:
        layered.append(f"{f.name} over {base}")
    walk(parser.get(), f.name)
    n += 1
if problems:
    sys.exit("configs reach outside scripts./MONAI/torch: " + "; ".join(problems))
print(f"{n} configs parsed" + (f" ({', '.join(layered)})" if layered else ""))
