#!/usr/bin/env bash
# Serve GLAM saliency maps to MONAI Label clients (3D Slicer) — see docs/monailabel.md.
#
#   scripts/start_label_server.sh --studies DIR [--port 8000] [--host 127.0.0.1] [--model model.pt]
#       [--preset configs/quickstart.yaml] [--device cpu|cuda] [--setup-only]
#
# 1. Creates the MONAI Label virtual environment when missing: requirements-label.txt plus monailabel (no deps),
#    cached outside the repository in ${GLAM_LABEL_ENV_ROOT:-~/.cache/glam-monailabel}/<hash>, keyed by the hash of
#    requirements-label.txt and the monailabel pin, so a machine builds it once (built in a temporary folder and
#    moved into place: an interrupted build is never used).
# 2. Ingests DICOM files of the studies folder as NRRD beside them (label_app/ingest.py; geometry kept).
# 3. Starts the server in the foreground on HOST:PORT (127.0.0.1 unless told otherwise) with label_app/ and the
#    bundle (bundle/). The default weights are the shipped bundle/models/model.pt (a demonstration model trained
#    on synthetic 736x480 images, not for real mammograms); --model for others. A checkpoint records the settings
#    it was trained with and the app builds the network and the window from them, so no preset is needed;
#    --preset only for checkpoints written before the bundle recorded settings.
#
# --setup-only stops after step 1 and prints the environment's python (tests use it).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MONAILABEL_SPEC="monailabel==0.8.5"
REQUIREMENTS="$REPO/requirements-label.txt"

studies="" port=8000 host=127.0.0.1 model="" preset="" device="" setup_only=0
usage() { sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --studies) studies="${2:?--studies needs a folder}"; shift 2 ;;
    --port) port="${2:?--port needs a number}"; shift 2 ;;
    --host) host="${2:?--host needs an address}"; shift 2 ;;
    --model) model="${2:?--model needs a file}"; shift 2 ;;
    --preset) preset="${2:?--preset needs a file}"; shift 2 ;;
    --device) device="${2:?--device needs cpu or cuda}"; shift 2 ;;
    --setup-only) setup_only=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "start_label_server: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done

key="$( (cat "$REQUIREMENTS"; echo "$MONAILABEL_SPEC") | sha256sum | cut -c1-16)"
root="${GLAM_LABEL_ENV_ROOT:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/glam-monailabel}"
env_dir="$root/$key"
mkdir -p "$root"
(
  flock 9  # one build at a time; a second caller waits and then finds the environment ready
  if [[ ! -x "$env_dir/bin/python" ]]; then
    echo "start_label_server: creating the MONAI Label environment $env_dir (once per machine)" >&2
    build="$root/.build-$key-$$"
    rm -rf "$build"
    python3 -m venv "$build"
    # only `python -m` is used from this environment, so it works after the move (console scripts would not)
    "$build/bin/python" -m pip install --quiet -r "$REQUIREMENTS" >&2
    "$build/bin/python" -m pip install --quiet --no-deps "$MONAILABEL_SPEC" >&2
    "$build/bin/python" -c "import monailabel.interfaces.app, monailabel.tasks.infer.basic_infer, nrrd, monai" >&2
    mv "$build" "$env_dir"
  fi
) 9>"$root/.lock"
python="$env_dir/bin/python"
if [[ $setup_only == 1 ]]; then
  echo "$python"
  exit 0
fi

[[ -n "$studies" ]] || { echo "start_label_server: --studies DIR is required" >&2; usage >&2; exit 2; }
[[ -d "$studies" ]] || { echo "start_label_server: --studies $studies: not a folder" >&2; exit 2; }
[[ "$port" =~ ^[0-9]+$ ]] || { echo "start_label_server: --port $port: not a number" >&2; exit 2; }
model="${model:-$REPO/bundle/models/model.pt}"
[[ -f "$model" ]] || {
  echo "start_label_server: no weights at $model: pass --model (the repository ships bundle/models/model.pt)" >&2
  exit 2
}
conf=(--conf bundle "$REPO/bundle" --conf model "$(realpath "$model")")
if [[ -n "$preset" ]]; then
  [[ -f "$preset" ]] || { echo "start_label_server: --preset $preset: no such file" >&2; exit 2; }
  conf+=(--conf preset "$(realpath "$preset")")
fi
[[ -n "$device" ]] && conf+=(--conf device "$device")

"$python" "$REPO/label_app/ingest.py" "$studies" --bundle "$REPO/bundle"
# exec: the server is this process, so a signal to the script (Ctrl+C, a test's terminate) stops it
exec "$python" -m monailabel.main start_server --app "$REPO/label_app" --studies "$(realpath "$studies")" \
  --host "$host" --port "$port" "${conf[@]}"
