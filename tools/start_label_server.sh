#!/usr/bin/env bash
# Serve GLAM saliency maps to MONAI Label clients (3D Slicer) — see docs/monailabel.md.
#
#   tools/start_label_server.sh --studies DIR [--port 8000] [--host 127.0.0.1] [--model model.pt]
#       [--preset configs/quickstart.yaml] [--device cpu|cuda] [--cors-origin URL ...] [--auth-realm URI]
#       [--insecure-no-auth] [--max-upload-mb 256] [--setup-only]
#
# 1. Creates the MONAI Label virtual environment when missing: requirements-label.txt plus monailabel (no deps),
#    cached outside the repository in ${GLAM_LABEL_ENV_ROOT:-~/.cache/glam-monailabel}/<hash>, keyed by the hash of
#    requirements-label.txt and the monailabel pin, so a machine builds it once (built in a temporary folder and
#    moved into place: an interrupted build is never used).
# 2. Ingests DICOM files of the studies folder: a copy for the viewers, <file name>.nrrd, beside each, with the
#    pixel spacing the DICOM states or none (label_app/ingest.py); inference reads the DICOM itself.
# 3. Starts the server in the foreground on HOST:PORT (127.0.0.1 unless told otherwise) with label_app/ and the
#    bundle (bundle/). The default weights are the shipped bundle/models/model.pt (a demonstration model trained
#    on synthetic 736x480 images, not for real mammograms); --model for others. A checkpoint records the settings
#    it was trained with and the app builds the network and the window from them, so no preset is needed;
#    --preset only for checkpoints written before the bundle recorded settings. The server is MONAI Label's app as
#    label_app/glam_server.py configures it: no web origin is granted access unless --cors-origin lists it
#    (repeatable, e.g. http://localhost:3000), requests are confined to the studies folder.
#
# Authentication: --auth-realm URI turns MONAI Label's token check on (a Keycloak realm, e.g.
# https://sso.example.org/realms/monailabel; same as MONAI_LABEL_AUTH_ENABLE=true MONAI_LABEL_AUTH_REALM_URI=URI).
# A --host other than a loopback address (127.0.0.0/8, ::1, localhost; a name is not resolved, so a name that only
# begins with 127. is not one) is refused without it, unless --insecure-no-auth says so explicitly.
# --max-upload-mb N: the largest request body (an upload) the server reads, in MiB (default 256, or
# GLAM_LABEL_MAX_UPLOAD_MB); a larger one is answered 413 before it is read. The model's limits (GLAM_LABEL_MAX_*)
# and the inputs' (GLAM_LABEL_MAX_IMAGE_PIXELS) are in docs/monailabel.md, Limits.
# --setup-only stops after step 1 and prints the environment's python (tests use it).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MONAILABEL_SPEC="monailabel==0.8.5"
REQUIREMENTS="$REPO/requirements-label.txt"

studies="" port=8000 host=127.0.0.1 model="" preset="" device="" setup_only=0 auth_realm="" insecure_no_auth=0
max_upload_mb="${GLAM_LABEL_MAX_UPLOAD_MB:-}"
cors=()
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --studies) studies="${2:?--studies needs a folder}"; shift 2 ;;
    --port) port="${2:?--port needs a number}"; shift 2 ;;
    --host) host="${2:?--host needs an address}"; shift 2 ;;
    --model) model="${2:?--model needs a file}"; shift 2 ;;
    --preset) preset="${2:?--preset needs a file}"; shift 2 ;;
    --device) device="${2:?--device needs cpu or cuda}"; shift 2 ;;
    --cors-origin) cors+=("${2:?--cors-origin needs a URL such as http://localhost:3000}"); shift 2 ;;
    --auth-realm) auth_realm="${2:?--auth-realm needs the realm URI}"; shift 2 ;;
    --insecure-no-auth) insecure_no_auth=1; shift ;;
    --max-upload-mb) max_upload_mb="${2:?--max-upload-mb needs a number of MiB}"; shift 2 ;;
    --setup-only) setup_only=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "start_label_server: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done

# an address of 127.0.0.0/8 or ::1, or the name localhost: the server's own rule (label_app/glam_safety.py), which
# parses addresses (a host name that begins with "127." is a name like any other, and needs authentication)
is_loopback() {
  python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from glam_safety import is_loopback
sys.exit(0 if is_loopback(sys.argv[2]) else 1)' "$REPO/label_app" "$1"
}
for origin in "${cors[@]}"; do
  [[ "$origin" =~ ^https?://[^/?#*\"[:space:]]+/?$ ]] || {
    echo "start_label_server: --cors-origin $origin: expected scheme://host[:port], e.g. http://localhost:3000" >&2
    exit 2
  }
done
if [[ -n "$max_upload_mb" ]]; then
  [[ "$max_upload_mb" =~ ^[0-9]+$ && "$max_upload_mb" -ge 1 ]] || {
    echo "start_label_server: --max-upload-mb $max_upload_mb: expected a whole number of MiB, at least 1" >&2
    exit 2
  }
  export GLAM_LABEL_MAX_UPLOAD_MB="$max_upload_mb"
fi
if [[ -n "$auth_realm" ]]; then
  [[ "$auth_realm" =~ ^https?:// ]] || {
    echo "start_label_server: --auth-realm $auth_realm: not an http(s) URI" >&2
    exit 2
  }
  export MONAI_LABEL_AUTH_ENABLE=true MONAI_LABEL_AUTH_REALM_URI="$auth_realm"
fi
auth_on=0
[[ "${MONAI_LABEL_AUTH_ENABLE:-}" =~ ^([Tt][Rr][Uu][Ee]|1|[Yy][Ee][Ss]|[Oo][Nn])$ ]] && auth_on=1
if [[ $setup_only == 0 ]] && ! is_loopback "$host" && [[ $auth_on == 0 && $insecure_no_auth == 0 ]]; then
  echo "start_label_server: --host $host would let other machines use the server, and authentication is off." >&2
  echo "  Pass --auth-realm URI (MONAI Label's token check), or keep the default 127.0.0.1 behind a reverse proxy" >&2
  echo "  that authenticates (docs/monailabel.md, Security), or pass --insecure-no-auth to serve anyway." >&2
  exit 2
fi
if [[ $setup_only == 0 ]]; then  # checked before the environment is built: a mistake is told at once
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
  if [[ -n "$device" ]]; then conf+=(--conf device "$device"); fi
fi

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

if [[ ${#cors[@]} -gt 0 ]]; then  # label_app/glam_server.py grants these origins, no other
  GLAM_LABEL_CORS_ORIGINS="$(printf '%s,' "${cors[@]}")"
  export GLAM_LABEL_CORS_ORIGINS="${GLAM_LABEL_CORS_ORIGINS%,}"
fi
if ! is_loopback "$host"; then  # the names the server answers for (a Host header is checked: DNS rebinding)
  case "$host" in 0.0.0.0 | :: | "[::]") extra="*" ;; *) extra="$host" ;; esac
  export GLAM_LABEL_ALLOWED_HOSTS="${GLAM_LABEL_ALLOWED_HOSTS:+$GLAM_LABEL_ALLOWED_HOSTS,}$extra"
fi

"$python" "$REPO/label_app/ingest.py" "$studies" --bundle "$REPO/bundle"
# exec: the server is this process, so a signal to the script (Ctrl+C, a test's terminate) stops it. The app is
# MONAI Label's, configured by label_app/glam_server.py (--uvicorn_app), which the app's folder on PYTHONPATH finds
PYTHONPATH="$REPO/label_app${PYTHONPATH:+:$PYTHONPATH}" exec "$python" -m monailabel.main start_server \
  --app "$REPO/label_app" --studies "$(realpath "$studies")" --host "$host" --port "$port" \
  --uvicorn_app glam_server:app "${conf[@]}"
