"""GLAM's command line: training, evaluation and inference as one MONAI workflow class.

Run from the repository root (MONAI locates the class before it puts the bundle on ``sys.path``)::

    PYTHONPATH=bundle python -m monai.bundle run_workflow scripts.GLAMWorkflow --run_id training \\
        --config_file "['bundle/configs/train.yaml','configs/quickstart.yaml']" \\
        --meta_file bundle/configs/metadata.json --epochs 1
"""

from __future__ import annotations

import copy
import difflib
import logging
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ignite.distributed as idist
from monai.bundle import ConfigParser, ConfigWorkflow
from monai.utils import str2bool

from ..errors import UsageError, error_line, user_error
from .distributed import disable_on_other_ranks
from .stage import stages_to_run
from .tracking import track_stage

logger = logging.getLogger(__name__)

#: arguments of ``monai.bundle run`` / ``run_workflow`` and of ``ConfigWorkflow``: never config ids
RUN_ARGUMENTS = frozenset(
    {
        "run_id",
        "init_id",
        "final_id",
        "meta_file",
        "config_file",
        "logging_file",
        "tracking",
        "args_file",
        "workflow_name",
        "workflow_type",
        "properties_path",
    }
)
#: the ids MONAI's ``--tracking`` adds to the configuration
TRACKING_IDS = frozenset(
    {"output_dir", "tracking_uri", "experiment_name", "run_name", "save_execute_config", "is_not_rank0"}
)
#: each workflow's page, by its run id
WORKFLOW_PAGES = {"training": "docs/training.md", "evaluating": "docs/evaluation.md", "inference": "docs/inference.md"}
#: the command a user types, by run id, for ``--help`` and the plain-run refusal
COMMAND = "PYTHONPATH=bundle python -m monai.bundle run_workflow scripts.GLAMWorkflow --run_id {}"
#: YAML's spellings of null, which reach the class as text (Fire parses ``None`` into None, which MONAI drops)
_NONE_SPELLINGS = frozenset({"null", "Null", "NULL"})
#: YAML's spellings of the booleans, which Fire leaves as text (``--amp false`` would be a true string otherwise)
_BOOLEAN_SPELLINGS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
#: what ``--help`` (or ``-h``) arrives as: an override of value True
_HELP_KEYS = ("help", "h")


def _ids(config: Any, prefix: str = "") -> Iterable[str]:
    """Every id of a config (``a``, ``a#b``, ``a#0``...)."""
    items = config.items() if isinstance(config, Mapping) else enumerate(config) if isinstance(config, list) else ()
    for k, v in items:
        name = f"{prefix}{k}"
        yield name
        yield from _ids(v, name + "#")


def check_overrides(keys: Iterable[str], file_config: Mapping[str, Any], page: str = "docs/training.md") -> None:
    """Check that every override id in ``keys`` is known to ``file_config``, the run or MONAI's tracking.

    Raises:
        UsageError: an unknown id, naming the closest known one (MONAI merges any key, so a typo would be ignored).
    """
    known = set(_ids(file_config))
    files = ConfigParser(file_config)
    for key in keys:
        plain = key.lstrip("+")
        if plain in known or plain in RUN_ARGUMENTS or plain in TRACKING_IDS:
            continue
        parent, _, _ = plain.rpartition("#")
        pool = [k for k in known if k.rpartition("#")[0] == parent] + ([] if parent else sorted(TRACKING_IDS))
        close = difflib.get_close_matches(plain, pool, n=1, cutoff=0.6)
        component = files.get(parent) if parent else None
        if isinstance(component, Mapping) and "_target_" in component:
            leaf = plain.rpartition("#")[2]
            arguments = [str(k) for k in component if not str(k).startswith("_")]
            typo = difflib.get_close_matches(leaf, arguments, n=1, cutoff=0.75)
            if not typo:
                continue  # a new argument of the component, which refuses a name it does not take
            close = [f"{parent}#{typo[0]}"]
        hint = f"; did you mean --{close[0]}?" if close else f" (--help lists the options, {page} describes them)"
        raise UsageError(f"unknown option --{key}: the configuration has no {plain!r}{hint}")


def _file_config(config_file: Any, meta_file: Any) -> dict[str, Any]:
    """The config files and metadata merged as MONAI merges them, before the overrides."""
    parser = ConfigParser()
    parser.read_config(config_file)
    if meta_file:
        parser.read_meta(meta_file)
    return parser.get()


def _yaml_boolean(value: Any) -> Any:
    """``true`` / ``false`` (as YAML spells them) as booleans; any other value as given."""
    return _BOOLEAN_SPELLINGS.get(value, value) if isinstance(value, str) else value


def _means_none(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value in _NONE_SPELLINGS)


def given_none(overrides: Mapping[str, Any], parser: ConfigParser) -> list[str]:
    """Set the overrides given as None (``--key null``) to None in ``parser``, log them and return their ids.

    Raises:
        UsageError: ``--+key null`` (there is nothing to merge).
    """
    keys = [key for key, value in overrides.items() if _means_none(value)]
    for key in keys:
        if key.startswith("+"):
            raise UsageError(f"--{key} None: '+' merges a list or a dict into the option; give --{key[1:]}")
        parser[key] = None
        logger.info("> %s: None (given on the command line)", key)
    return keys


def _on_command_line(argv: list[str]) -> bool:
    """Whether this process is ``python -m monai.bundle ...`` (MONAI's ``bundle/__main__.py``)."""
    return Path(argv[0] if argv else "").parts[-2:] == ("bundle", "__main__.py")


def _none_on_command_line(argv: list[str]) -> dict[str, None]:
    """The ``--key None`` of a ``python -m monai.bundle`` command line, which MONAI would drop."""
    if not _on_command_line(argv):
        return {}
    found: dict[str, None] = {}
    for i, word in enumerate(argv):
        key, eq, value = word.partition("=")
        value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if key.startswith("--") and len(key) > 2 and value == "None":
            found[key[2:]] = None
    return found


def _is_option(value: Any) -> bool:
    """Whether a top-level entry is a setting rather than a piece of the workflow."""
    if isinstance(value, str):
        return not value.startswith(("$", "%")) or value.startswith("$os.path.")
    if isinstance(value, Mapping):
        return "_target_" not in value and all(_is_option(v) for v in value.values())
    if isinstance(value, list):
        return all(_is_option(v) and not isinstance(v, Mapping) for v in value)
    return True


def workflow_help(run_id: str, file_config: Mapping[str, Any]) -> str:
    """What ``--help`` prints: the command, the workflow's page and its options with their defaults."""
    page = WORKFLOW_PAGES.get(run_id, "docs/training.md")
    lines = [f"{COMMAND.format(run_id)} --config_file ... [--option value ...]: {page} describes it", ""]
    lines.append("options (--option value; the defaults of the config files given):")
    for key, value in file_config.items():
        if str(key).startswith("_") or not _is_option(value):
            continue
        text = str(value) if isinstance(value, str) and value else repr(value)
        lines.append(f"  --{key} {text if len(text) <= 80 else text[:77] + '...'}")
    lines += [
        "",
        "Any other id of the config files is set the same way (--id value, --id#key value); a value is read as Python",
        "(--id \"[1, 2]\", --id \"{'key': 1}\"), None or null sets None, true / false as in YAML, '$expr' evaluates",
        "the expression expr.",
    ]
    return "\n".join(lines)


#: what MONAI's ``--tracking mlflow`` imports: the client, and the SQLite store's (requirements-dev.txt)
TRACKING_PACKAGES = {"mlflow": "mlflow-skinny", "sqlalchemy": "sqlalchemy", "alembic": "alembic"}


def check_tracking(tracking: Any) -> None:
    """Check that ``--tracking mlflow`` has MLflow and its store's packages (:data:`TRACKING_PACKAGES`).

    Raises:
        UsageError: naming the missing packages and their ``pip install``.
    """
    import importlib.util

    if not (isinstance(tracking, str) and tracking.strip().lower() == "mlflow"):
        return
    missing = []
    for module, package in TRACKING_PACKAGES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(package)
    if missing:
        raise UsageError(
            f"--tracking mlflow needs {', '.join(missing)}, not installed in this Python: pip install "
            f"{' '.join(missing)} (the versions requirements-dev.txt pins: pip install -r requirements-dev.txt), or "
            "leave --tracking out"
        )


def plain_run(run_id: str) -> None:
    """Refuse train.yaml's ``training`` under MONAI's plain ``run``, which gives a config entry no handle on its parser.

    Raises:
        UsageError: naming the command that trains.
    """
    raise UsageError(
        f"the {run_id} run needs the bundle's workflow class: {COMMAND.format(run_id)} --config_file ... "
        "(MONAI's plain `run run_stage --stage global` trains one stage without the checks)"
    )


class GLAMWorkflow(ConfigWorkflow):
    """GLAM's training, evaluation and inference as one MONAI workflow class (``run_workflow`` builds it).

    Under ``python -m monai.bundle`` a user's mistake (:func:`user_error`) ends the process with one ``error:`` line.

    Args:
        config_file, meta_file, logging_file, init_id, run_id, final_id, tracking, workflow_type, properties_path:
            ``ConfigWorkflow``'s.
        override: the ``--key value`` pairs, as MONAI passes them.
    """

    def __init__(
        self,
        config_file: str | list[str],
        meta_file: str | list[str] | None = None,
        logging_file: str | bool | None = None,
        init_id: str = "initialize",
        run_id: str = "run",
        final_id: str = "finalize",
        tracking: str | dict | None = None,
        workflow_type: str | None = None,
        properties_path: str | None = None,
        **override: Any,
    ) -> None:
        overrides = {**_none_on_command_line(sys.argv), **{k: _yaml_boolean(v) for k, v in override.items()}}
        super().__init__(
            config_file=config_file,
            meta_file=meta_file,
            logging_file=logging_file,
            init_id=init_id,
            run_id=run_id,
            final_id=final_id,
            tracking=tracking,
            workflow_type=workflow_type,
            properties_path=properties_path,
            **{k: v for k, v in overrides.items() if not _means_none(v)},
        )
        self.config_file, self.tracking = config_file, tracking
        for key, given in override.items():
            if overrides[key] is not given and isinstance(overrides[key], bool):  # MONAI's input summary shows the text
                logger.info("> %s: %s (the command line's %r, read as a boolean)", key, overrides[key], given)
        #: the ``--key value`` overrides, as MONAI handed them over (``null`` and ``None`` read as None)
        self.overrides: dict[str, Any] = {k: None if _means_none(v) else v for k, v in overrides.items()}
        target = self.parser.get(run_id)  # MONAI's default run id names another: `run: "%training"`
        #: the run id this workflow runs, after MONAI's default ``run`` is followed to the entry it names
        self.workflow = target[1:] if isinstance(target, str) and target.startswith("%") else run_id
        self._joined_group = False

    def _one_line(self, step: Any) -> Any:
        try:
            return step()
        except Exception as err:
            found = user_error(err) if _on_command_line(sys.argv) else None
            if found is None:
                raise
            print(error_line(found), file=sys.stderr)
            raise SystemExit(1) from found

    def _distributed(self) -> bool:
        return self.workflow == "training" and str2bool(str(self.parser.get("distributed", False)))

    def _check(self) -> None:
        file_config = _file_config(self.config_file, self.meta_file)
        if any(self.overrides.get(key) is True for key in _HELP_KEYS):
            print(workflow_help(self.workflow, file_config))
            raise SystemExit(0)
        check_tracking(self.tracking)
        check_overrides(list(self.overrides), file_config, WORKFLOW_PAGES.get(self.workflow, "docs/training.md"))
        given_none(self.overrides, self.parser)
        if self.tracking is not None and self.workflow == "evaluating" and os.environ.get("RANK", "0") == "0":
            from .tracking import save_config  # the tracked run's artifact: this run's merged configuration

            self.parser["save_execute_config"] = save_config(
                self.parser.get_parsed_content("eval_dir"), self.parser.get()
            )

    def initialize(self) -> Any:
        """Check the overrides, then ``ConfigWorkflow.initialize``."""

        def step() -> Any:
            self._check()
            result = super(GLAMWorkflow, self).initialize()
            if self._distributed() and not self._joined_group:
                from ..distributed import init_distributed, quiet_other_ranks

                init_distributed(
                    backend=self.parser.get_parsed_content("dist_backend"),
                    timeout_s=self.parser.get_parsed_content("dist_timeout_s"),
                )
                quiet_other_ranks(self.parser.get_parsed_content("log_level_other_ranks"))
                self._joined_group = True
            return result

        return self._one_line(step)

    def run(self) -> Any:
        """The training's stages (run id ``training``), else ``ConfigWorkflow.run``."""
        if self.workflow != "training":
            return self._one_line(super().run)
        return self._one_line(lambda: [self._train()])

    def _train(self) -> list[Any]:
        from .distributed import rank_zero_first
        from .preflight import preflight_training, unlock_run

        lock, started = None, False
        try:
            lock = preflight_training(self.parser)
            if self._distributed():
                rank_zero_first(self.parser, self.parser.get("rank_zero_first", ["datalist"]))
            if "check_datalist" in self.parser:
                self.parser.get_parsed_content("check_datalist")
            started = True
            return run_stages(self.parser, str(self.parser.get_parsed_content("stage")))
        finally:
            unlock_run(lock, started)

    def finalize(self) -> Any:
        """``ConfigWorkflow.finalize``, then leave the process group this workflow joined."""
        try:
            return self._one_line(super().finalize)
        finally:
            if self._joined_group:
                from ..distributed import destroy_distributed

                destroy_distributed()
                self._joined_group = False


def run_stages(parser: ConfigParser, stage: str, stage_run_id: str = "run_stage") -> list[Any]:
    """Run one stage or all three, each from a deep copy of ``parser``'s merged config with ``stage`` set.

    On ranks other than 0 the copy's ``rank_zero_only`` handlers are disabled before anything is built.

    Args:
        parser: the bundle's parser (never modified).
        stage: ``"all"``, ``"global"``, ``"local"`` or ``"joint"``.
        stage_run_id: the config id that runs one stage.

    Returns:
        per stage, what the last entry of its ``stage_run_id`` list evaluated to.
    """
    names = stages_to_run(stage)  # a bad stage name fails before anything is built
    this_rank = idist.get_rank()
    rank_zero_only: Sequence[str] = ()
    if "rank_zero_only" in parser and this_rank != 0:
        rank_zero_only = parser.get_parsed_content("rank_zero_only")
    results = []
    for name in names:
        logger.info("GLAM training: stage %s", name)
        config = copy.deepcopy(parser.get())
        disable_on_other_ranks(config, rank_zero_only, rank_=this_rank)
        stage_parser = ConfigParser(config, globals=dict(parser.globals))
        stage_parser["stage"] = name
        track_stage(stage_parser, name)
        result = stage_parser.get_parsed_content(stage_run_id)
        results.append(result[-1] if isinstance(result, list) and result else result)
    return results
