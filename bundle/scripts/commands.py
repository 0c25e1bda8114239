"""The ``python -m monai.bundle run ...`` command line, as training, evaluation and inference read it.

MONAI reads the command line once (Python Fire parses it into the arguments of ``monai.bundle.scripts.run``), reads
the config files once (its ``ConfigWorkflow``'s ``ConfigParser``, with the overrides merged in) and evaluates the
run id on that parser. The bundle reads neither again: it takes what MONAI parsed.

- :func:`command_line`: the arguments MONAI's ``run`` was called with (the run arguments and the overrides, as Fire
  parsed them), read from that call; None in a process that is not that command (the Python API, a test);
- :func:`running_parser`: the ``ConfigParser`` evaluating the config entry that calls it (train.yaml's
  ``training`` runs the stages on it: :func:`scripts.training.workflow.run_training`).

MONAI merges every ``--key`` into the configuration, whether or not the configuration has such a key, and evaluates
expressions only when something needs them: a typo (``--epoch 1``) was ignored, and a problem of the user's (a missing
folder, a read-only checkpoint folder) surfaced as a 60-line traceback ending in MONAI's "Failed to evaluate
ConfigExpression". Hence:

- :func:`check_command_line`: every ``--key`` names an id of the config files, or a new argument of one of their
  components; an unknown one is refused with the closest known id (``difflib``). (The Python API may add ids.)
  MONAI's parser holds the files with the overrides already merged, which no longer tells an override of an id of
  the files from a new id: this check is the one reader of the files besides MONAI (only their ids are used);
- :func:`check_writable`: a folder option accepts a new file.

``--key None`` (or ``null``, YAML's spelling) sets ``key`` to None, whatever the option: Fire parses ``None`` into
Python's None and MONAI drops overrides whose value is None before it builds the configuration (its
``update_kwargs``), so the run would silently keep the file's value. :func:`check_command_line` sets them on the
running configuration and logs them below MONAI's input summary, which lists only the others (:func:`given_none`).

Errors the user can fix are :class:`UsageError` (or another exception raised with a message by the bundle's own
code); :func:`install_excepthook` prints them as ``error: <message>`` without the traceback (exit status 1). Set
``GLAM_TRACEBACK=1`` for the full traceback. The training's own checks (per-stage values, earlier runs) are in
:mod:`scripts.training.preflight`.
"""

from __future__ import annotations

import difflib
import errno
import inspect
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from monai.bundle import ConfigParser

from .atomic import NO_ROOM_ERRNOS, disk_full

__all__ = [
    "RUN_ARGUMENTS",
    "TRACKING_IDS",
    "UsageError",
    "user_error",
    "install_excepthook",
    "disk_full_message",
    "command_line",
    "running_parser",
    "command_line_config",
    "check_overrides",
    "check_writable",
    "check_command_line",
    "check_tracking",
    "given_none",
]

#: arguments of ``monai.bundle run`` itself, and the ids MONAI's ``--tracking`` adds: never config ids of ours
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
    }
)
TRACKING_IDS = frozenset(
    {"output_dir", "tracking_uri", "experiment_name", "run_name", "save_execute_config", "is_not_rank0"}
)
#: the strings that stand for None on the command line (YAML's spellings of null; Fire parses ``None`` into None)
_NONE_SPELLINGS = frozenset({"null", "Null", "NULL"})
#: the bundle's own source folder: exceptions raised from here carry messages written for users
_SCRIPTS_DIR = str(Path(__file__).resolve().parents[1])


class UsageError(ValueError):
    """A problem with the command, the configuration or the folders that the user can fix; its message says how."""


# -- errors as one line ---------------------------------------------------------------------------------------------
def _raised_by_bundle(err: BaseException) -> bool:
    """Whether ``err`` was raised by a line of the bundle's ``scripts`` package (its messages name the problem)."""
    tb = err.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    return last is not None and os.path.abspath(last.tb_frame.f_code.co_filename).startswith(_SCRIPTS_DIR)


def user_error(err: BaseException) -> BaseException | None:
    """The exception in ``err``'s chain (``__cause__`` / ``__context__``) that is the user's to fix: a
    :class:`UsageError`, a ``SystemExit`` with a message, or a ``ValueError`` / ``OSError`` raised by the bundle's
    own code (its messages name the file or option). None for anything else (a bug: keep the traceback)."""
    full = disk_full(err)
    if full is not None:  # wherever it was raised: a checkpoint, a report, a map
        return full
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, UsageError):
            return current
        if isinstance(current, (ValueError, OSError)) and _raised_by_bundle(current):
            return current
        current = current.__cause__ or current.__context__
    return None


def _excepthook(previous):
    def hook(exc_type, exc, tb):
        found = None if os.environ.get("GLAM_TRACEBACK") else user_error(exc)
        if found is None:
            previous(exc_type, exc, tb)
            return
        if disk_full(found) is found:
            print(f"error: {disk_full_message(found)}", file=sys.stderr)
            print("(GLAM_TRACEBACK=1 shows the traceback)", file=sys.stderr)
            return
        message = str(found).strip()
        # the kind of problem for anything but a usage error (DataCheckError, FileNotFoundError...): it says where
        # to look (a datalist, a file)
        kind = "" if isinstance(found, UsageError) else f"{type(found).__name__}: "
        print(f"error: {kind}{message}", file=sys.stderr)
        print("(GLAM_TRACEBACK=1 shows the traceback)", file=sys.stderr)

    hook.glam = True  # type: ignore[attr-defined]
    return hook


def disk_full_message(err: OSError) -> str:
    """One line for a write that found no room (a full disk, a full quota, the file size limit:
    :func:`scripts.atomic.disk_full`): the file being written (every atomic write names it) and what is still there.
    A checkpoint (``.pt``): the last good checkpoint of its folder (``last.pt``, which ``--resume true`` continues
    from, else the file itself: an atomic write leaves the previous version whole, else the newest ``.pt``); another
    file: whether its previous version is unchanged."""
    what, fix = NO_ROOM_ERRNOS.get(err.errno, NO_ROOM_ERRNOS[errno.ENOSPC])  # also a quota, a file size limit
    if not err.filename:
        return f"{what} ({fix.replace('that disk', 'the output disk')}, then run again)"
    target = Path(os.path.abspath(err.filename))
    head = f"{what} writing {target}"
    if target.suffix != ".pt":
        kept = "its previous version is unchanged" if target.is_file() else "nothing was written to it"
        return f"{head}; {kept} ({fix}, then run again)"
    others = sorted(
        (p for p in target.parent.glob("*.pt") if p.is_file()), key=lambda p: p.stat().st_mtime, reverse=True
    )
    good = next((p for p in [target.parent / "last.pt", target, *others] if p.is_file()), None)
    kept = f"the last good checkpoint is {good}" if good else f"no checkpoint was written in {target.parent} yet"
    return f"{head}; {kept} ({fix}, then continue with --resume true)"


class _UserErrorTraceback(logging.Filter):
    """Keep the line of a log record whose exception is a user's error (:func:`user_error`) but drop its
    traceback: MONAI's ``StatsHandler`` logs every exception that stops an engine with its traceback before the
    exception hook prints the one line (``GLAM_TRACEBACK=1`` keeps it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and not os.environ.get("GLAM_TRACEBACK") and user_error(exc) is not None:
            record.exc_info, record.exc_text = None, None
        return True


#: the loggers that log an engine's exception with its traceback: MONAI's StatsHandler's (its own, not
#: propagated), and the root one (a StatsHandler given no logger in older MONAI versions)
_EXCEPTION_LOGGERS = ("monai.handlers.StatsHandler", "")


def install_excepthook() -> None:
    """Print a user's error (:func:`user_error`) that ends the program as ``error: <message>`` without the
    traceback (the exit status stays 1); every other exception goes to the previous hook, traceback and all. The
    engines' exception log lines keep their message without the traceback for the same errors. Idempotent; called
    by :func:`check_command_line`, the first check of every workflow."""
    if not getattr(sys.excepthook, "glam", False):
        sys.excepthook = _excepthook(sys.excepthook)
    for name in _EXCEPTION_LOGGERS:
        if name:
            from monai.apps import get_logger

            # MONAI's own set-up of that logger (its stdout handler), as StatsHandler makes it: a logger made here with
            # logging.getLogger would exist already, and MONAI would then give it no handler
            target = get_logger(name)
        else:
            target = logging.getLogger()
        if not any(isinstance(f, _UserErrorTraceback) for f in target.filters):
            target.addFilter(_UserErrorTraceback())


# -- what MONAI parsed ------------------------------------------------------------------------------------------
def _calling_frame(*functions: Any) -> Any:
    """The innermost frame on this thread's call stack that runs one of ``functions`` (None when none does)."""
    codes = {f.__code__ for f in functions}
    frame = inspect.currentframe()
    while frame is not None and frame.f_code not in codes:
        frame = frame.f_back
    return frame


def command_line() -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(run arguments, overrides)`` of the ``python -m monai.bundle run ...`` (or ``run_workflow``) call this
    process is inside, as MONAI received them: Python Fire's parse of the command line, taken from the arguments
    of ``monai.bundle.scripts.run`` on the call stack (the command line is not parsed again). The run arguments are
    the given ones among :data:`RUN_ARGUMENTS` (``config_file``, ``meta_file``, ``tracking``, ``args_file``, the
    ids...), with an ``--args_file``'s defaults under the run arguments and the overrides. None outside that call
    (the Python API, a test).

    MONAI gives a config entry no handle on the command it runs, hence the call stack: ``run``'s signature is MONAI's
    public API (monai 1.6.1 is pinned; ``tests/training/test_one_reader.py`` pins the rule)."""
    from monai.bundle import scripts as bundle_scripts

    frame = _calling_frame(bundle_scripts.run, bundle_scripts.run_workflow)
    if frame is None:
        return None
    try:
        info = inspect.getargvalues(frame)
        given = {name: info.locals[name] for name in info.args}
        given.update(info.locals[info.keywords] if info.keywords else {})
    finally:
        del frame
    arguments = {k: v for k, v in given.items() if k in RUN_ARGUMENTS and v is not None}  # run's unset defaults
    overrides = {k: None if _means_none(v) else v for k, v in given.items() if k not in RUN_ARGUMENTS}
    if arguments.get("args_file"):
        defaults = ConfigParser.load_config_files(arguments.pop("args_file"))
        arguments = {**{k: v for k, v in defaults.items() if k in RUN_ARGUMENTS}, **arguments}
        overrides = {**{k: v for k, v in defaults.items() if k not in RUN_ARGUMENTS}, **overrides}
    return arguments, overrides


def running_parser() -> ConfigParser:
    """The ``ConfigParser`` whose ``get_parsed_content`` is evaluating the caller: for a config entry's component,
    the parser of the workflow running it (under ``python -m monai.bundle run``, the one MONAI built from the command
    line and the config files). MONAI passes a component its arguments only, hence the call stack.

    Raises:
        RuntimeError: the caller is not evaluated by a ``ConfigParser`` (called from plain Python)."""
    frame = _calling_frame(ConfigParser.get_parsed_content)
    if frame is None:
        raise RuntimeError("running_parser() is called by a config entry that a ConfigParser evaluates")
    try:
        return frame.f_locals["self"]
    finally:
        del frame


def command_line_config() -> dict[str, Any] | None:
    """The merged configuration the ``monai.bundle run`` command describes (its config files, metadata and
    overrides, as MONAI merges them, before its macros are resolved), or None outside that command."""
    given = command_line()
    if given is None:
        return None
    arguments, overrides = given
    config = _file_config(arguments)
    parser = ConfigParser(config)
    parser.update(pairs=overrides)
    return parser.get()


def _ids(config: Any, prefix: str = "") -> Iterable[str]:
    """Every id of a config (``a``, ``a#b``, ``a#0``...)."""
    items = config.items() if isinstance(config, Mapping) else enumerate(config) if isinstance(config, list) else ()
    for k, v in items:
        name = f"{prefix}{k}"
        yield name
        yield from _ids(v, name + "#")


def _lookup(config: Any, id_: str) -> Any:
    """The content of config id ``id_`` (``a#b#0``), or None when there is none."""
    for part in id_.split("#") if id_ else []:
        if isinstance(config, Mapping) and part in config:
            config = config[part]
        elif isinstance(config, list) and part.isdigit() and int(part) < len(config):
            config = config[int(part)]
        else:
            return None
    return config


def check_overrides(keys: Iterable[str], file_config: Mapping[str, Any], page: str = "docs/training.md") -> None:
    """Every override id in ``keys`` must name an id of ``file_config`` (the merged config files, before the
    overrides), a ``monai.bundle run`` argument or an id of MONAI's tracking, or add an argument to a component of
    the files (``--network#find_unused_parameters true``: MONAI passes it to the component, which refuses a name it
    does not take). An unknown id, or a new argument spelled like one the component has, is a :class:`UsageError`
    naming it and the closest known id (else ``--help`` and the workflow's ``page``)."""
    known = set(_ids(file_config))
    for key in keys:
        plain = key.lstrip("+")
        if plain in known or plain in RUN_ARGUMENTS or plain in TRACKING_IDS:
            continue
        parent, _, _ = plain.rpartition("#")
        pool = [k for k in known if k.rpartition("#")[0] == parent] + ([] if parent else sorted(TRACKING_IDS))
        close = difflib.get_close_matches(plain, pool, n=1, cutoff=0.6)
        component = _lookup(file_config, parent) if parent else None
        if isinstance(component, Mapping) and "_target_" in component:
            leaf = plain.rpartition("#")[2]
            arguments = [str(k) for k in component if not str(k).startswith("_")]
            typo = difflib.get_close_matches(leaf, arguments, n=1, cutoff=0.75)
            if not typo:
                continue
            close = [f"{parent}#{typo[0]}"]
        hint = f"; did you mean --{close[0]}?" if close else f" (--help lists the options, {page} describes them)"
        raise UsageError(f"unknown option --{key}: the configuration has no {plain!r}{hint}")


def _file_config(arguments: Mapping[str, Any]) -> dict[str, Any]:
    files = arguments.get("config_file")
    if files is None and arguments.get("args_file"):
        files = ConfigParser.load_config_files(arguments["args_file"]).get("config_file")
    if files is None:
        return {}
    parser = ConfigParser()
    parser.read_config(files)
    if arguments.get("meta_file"):
        parser.read_meta(arguments["meta_file"])
    return parser.get()


# -- --help ----------------------------------------------------------------------------------------------------------
#: each workflow's page, by its run id (``python -m monai.bundle run <id>``)
WORKFLOW_PAGES = {"training": "docs/training.md", "evaluating": "docs/evaluation.md", "inference": "docs/inference.md"}
#: what ``--help`` (or ``-h``) arrives as: Fire passes it to ``run`` as an override of value True
_HELP_KEYS = ("help", "h")


def _workflow(arguments: Mapping[str, Any], file_config: Mapping[str, Any]) -> str:
    """The run id the command runs: the one given, else MONAI's default ``run``, followed when it names another
    entry (``run: "%training"``)."""
    run_id = str(arguments.get("run_id") or "run")
    target = file_config.get(run_id)
    return target[1:] if isinstance(target, str) and target.startswith("%") else run_id


def _is_option(value: Any) -> bool:
    """Whether a top-level entry is a setting rather than a piece of the workflow: plain data, a path built from
    another setting (``$os.path...``) or another setting's value (``@input_dir``)."""
    if isinstance(value, str):
        return not value.startswith(("$", "%")) or value.startswith("$os.path.")
    if isinstance(value, Mapping):
        if "_target_" in value:
            return False
        return all(_is_option(v) for v in value.values())
    if isinstance(value, list):
        return all(_is_option(v) and not isinstance(v, Mapping) for v in value)
    return True


def workflow_help(arguments: Mapping[str, Any], file_config: Mapping[str, Any]) -> str:
    """What ``--help`` prints: the workflow's page and its options (the settings among the top-level entries of its
    config files, :func:`_is_option`, with their defaults as the files write them)."""
    workflow = _workflow(arguments, file_config)
    page = WORKFLOW_PAGES.get(workflow, "docs/training.md")
    lines = [f"python -m monai.bundle run {workflow} --config_file ... [--option value ...]: {page} describes it", ""]
    lines.append("options (--option value; the defaults of the config files given):")
    for key, value in file_config.items():
        if str(key).startswith("_") or not _is_option(value):
            continue
        text = str(value) if isinstance(value, str) and value else repr(value)
        lines.append(f"  --{key} {text if len(text) <= 80 else text[:77] + '...'}")
    lines += [
        "",
        "Any other id of the config files is set the same way (--id value, --id#key value); a value is read as Python",
        "(--id \"[1, 2]\", --id \"{'key': 1}\"), None or null sets None, '$expr' evaluates the expression expr.",
    ]
    return "\n".join(lines)


# -- folders ---------------------------------------------------------------------------------------------------------
def check_writable(**folders: str | os.PathLike) -> None:
    """Each folder accepts a new file (a folder that does not exist yet: its nearest existing parent, which must be
    a folder); else a :class:`UsageError` naming the option and the folder. Nothing is left behind."""
    from scripts.atomic import probe_writable

    for name, folder in folders.items():
        try:
            probe_writable(folder)
        except OSError as err:
            raise UsageError(
                f"{name} {os.path.abspath(folder)} cannot be written ({err.strerror or err}): choose a writable "
                f"folder (--{name} DIR)"
            ) from None


# -- experiment tracking ---------------------------------------------------------------------------------------------
#: what MONAI's ``--tracking mlflow`` imports: the client, and the SQLite store's (requirements-dev.txt)
TRACKING_PACKAGES = {"mlflow": "mlflow-skinny", "sqlalchemy": "sqlalchemy", "alembic": "alembic"}


def check_tracking(tracking: Any) -> None:
    """``--tracking mlflow`` needs MLflow and its SQLite store's packages (:data:`TRACKING_PACKAGES`): a
    :class:`UsageError` naming the missing ones and the ``pip install`` that brings them, before anything is built
    (MONAI's own error comes as a traceback of a hundred lines, once the first handler is built)."""
    import importlib.util

    if not (isinstance(tracking, str) and tracking.strip().lower() == "mlflow"):
        return
    missing = []
    for module, package in TRACKING_PACKAGES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken install, or a module whose spec is None
            found = False
        if not found:
            missing.append(package)
    if missing:
        raise UsageError(
            f"--tracking mlflow needs {', '.join(missing)}, not installed in this Python: pip install "
            f"{' '.join(missing)} (the versions requirements-dev.txt pins: pip install -r requirements-dev.txt), or "
            "leave --tracking out"
        )


# -- None on the command line ---------------------------------------------------------------------------------------
def _means_none(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value in _NONE_SPELLINGS)


def given_none(overrides: Mapping[str, Any], parser: ConfigParser | None = None) -> list[str]:
    """The overrides given as None (``--key None`` or ``--key null``), set to None in ``parser`` (the running
    configuration: MONAI left them out of it) and logged as ``> key: None`` under MONAI's input summary. Returns
    their ids.

    Raises:
        UsageError: ``--+key None`` (MONAI's ``+`` merges into a list or dict: there is nothing to merge)."""
    keys = [key for key, value in overrides.items() if _means_none(value)]
    if not keys:
        return []
    merged = [key for key in keys if key.startswith("+")]
    if merged:
        raise UsageError(f"--{merged[0]} None: '+' merges a list or a dict into the option; give --{merged[0][1:]}")
    for key in keys:
        if parser is not None:
            parser[key] = None
        logging.getLogger(__name__).info("> %s: None (given on the command line)", key)
    return keys


# -- the whole check -----------------------------------------------------------------------------------------------
def check_command_line(
    given: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None, parser: ConfigParser | None = None
) -> None:
    """:func:`install_excepthook`, then every override of the ``monai.bundle run`` command checked against the
    config files it names (:func:`check_overrides`), and the ones given as None set to None (:func:`given_none`);
    nothing to do outside that command. evaluate.yaml's and inference.yaml's first entry, and the start of
    :func:`~scripts.training.preflight.preflight_training`.

    Args:
        given: ``(run arguments, overrides)``, by default MONAI's (:func:`command_line`).
        parser: the running configuration; by default, for MONAI's command line, the one evaluating this call
            (:func:`running_parser`)."""
    install_excepthook()
    from_monai = given is None
    given = command_line() if given is None else given
    if given is not None:
        arguments, overrides = given
        file_config = _file_config(arguments)
        if any(overrides.get(key) is True for key in _HELP_KEYS):
            print(workflow_help(arguments, file_config))
            raise SystemExit(0)
        check_tracking(arguments.get("tracking"))
        page = WORKFLOW_PAGES.get(_workflow(arguments, file_config), "docs/training.md")
        check_overrides(list(overrides), file_config, page)
        if parser is None and from_monai and any(_means_none(v) for v in overrides.values()):
            parser = running_parser()
        given_none(overrides, parser)
