#!/usr/bin/env bash
# Create (or reuse) Kiln's Python virtual environment from tools/pins.txt.
#
#   VENV=$(tools/setup_env.sh)          # the LAST line of stdout is the venv path
#   "$VENV/bin/python" -m pytest        # everything else went to stderr
#
# Environment:
#   KILN_VENV    venv directory. Default: $HOME/.cache/kiln/venv-<first 12 hex
#                digits of sha256(tools/pins.txt)>, so a pin change gets a new
#                venv and an unchanged one is shared by every clone on the machine.
#   KILN_PYTHON  interpreter to build the venv from (default: python3; 3.10-3.14).
#   KILN_VENV_BOOTSTRAP  auto (default) | venv | apt | virtualenv | nopip: force
#                one way of creating the venv (for testing the fallbacks).
#   PIP_* variables (PIP_CACHE_DIR, PIP_INDEX_URL, ...) reach pip as usual; pip's
#   download/wheel cache is used, so a second install downloads nothing.
#
# Idempotent: a stamp is written only after a complete install that imports, so
# a second run is a no-op, and a run that was interrupted leaves no stamp and is
# completed by the next one. A venv this script created is rebuilt from scratch
# when the pins or the interpreter change; a venv it did not create (KILN_VENV
# pointing at your own) is only installed into, never deleted. Concurrent runs
# for the same venv serialize on a lock file beside it.
set -euo pipefail

exec 3>&1 1>&2 # all output to stderr; fd 3 carries the single result line

log() { printf 'setup_env: %s\n' "$*"; }
die() {
  printf 'setup_env: error: %s\n' "$*"
  exit 1
}

STAMP_FORMAT=1 # bump when this script changes what a finished venv contains

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)
pins="$root/tools/pins.txt"
[[ -f $pins ]] || die "missing $pins"
python=${KILN_PYTHON:-python3}
command -v "$python" >/dev/null ||
  die "'$python' not found: install Python 3.10-3.14 (Debian: apt-get install python3) or set KILN_PYTHON"

# One interpreter call gives the pin hash and the interpreter's identity.
mapfile -t info < <("$python" -c '
import hashlib, os, sys
print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())
print("%d.%d.%d" % sys.version_info[:3])
print("%d.%d" % sys.version_info[:2])
print(os.path.realpath(sys.executable))
print(int((3, 10) <= sys.version_info[:2] < (3, 15)))
' "$pins") || die "'$python' does not run"
[[ ${#info[@]} -eq 5 ]] || die "could not query '$python'"
pins_sha=${info[0]} py_ver=${info[1]} py_mm=${info[2]} py_exe=${info[3]}
case ${KILN_VENV_BOOTSTRAP:=auto} in
auto | venv | apt | virtualenv | nopip) ;;
*) die "KILN_VENV_BOOTSTRAP must be auto, venv, apt, virtualenv or nopip" ;;
esac
[[ ${info[4]} == 1 ]] ||
  die "$py_exe is Python $py_ver; executorch 1.5.1 needs 3.10-3.14 (set KILN_PYTHON)"

venv=${KILN_VENV:-${HOME:?HOME is not set; set KILN_VENV}/.cache/kiln/venv-${pins_sha:0:12}}
[[ $venv == /* ]] || venv="$PWD/$venv"
venv=${venv%/}
[[ -n $venv && $venv != "$HOME" ]] || die "refusing KILN_VENV='$venv'"
marker="$venv/.kiln-venv"  # "this script created the venv": records the interpreter
stamp="$venv/.kiln-stamp"  # "the install finished": records pins + interpreter
py_id="python=$py_ver $py_exe"
expected="format=$STAMP_FORMAT pins=$pins_sha $py_id"

stamp_ok() { [[ -x $venv/bin/python && -f $stamp && "$(<"$stamp")" == "$expected" ]]; }

mkdir -p "$(dirname "$venv")"
if command -v flock >/dev/null; then
  exec 9>"$venv.lock"
  if ! flock -n 9; then
    log "another setup_env.sh is working on $venv; waiting for it"
    flock 9
  fi
fi

if stamp_ok; then
  printf '%s\n' "$venv" >&3
  exit 0
fi

start=$SECONDS
log "setting up $venv (pins sha256 ${pins_sha:0:12}, Python $py_ver at $py_exe)"

# --- decide whether an existing directory can be reused ----------------------
if [[ -e $venv ]]; then
  if [[ -f $marker ]]; then
    reason=""
    if [[ "$(<"$marker")" != "$py_id" ]]; then
      reason="it was built from another interpreter ($(<"$marker"))"
    elif [[ -f $stamp ]]; then
      reason="tools/pins.txt changed since it was built"
    elif ! "$venv/bin/python" -c '' 2>/dev/null; then
      reason="its interpreter does not run (interrupted creation?)"
    fi
    if [[ -n $reason ]]; then
      log "recreating $venv: $reason"
      rm -rf -- "$venv"
    else
      log "resuming an unfinished install in $venv"
    fi
  elif [[ -f $venv/pyvenv.cfg ]]; then
    log "$venv is a virtual environment this script did not create: installing the pins into it (it is never deleted)"
  elif [[ -d $venv && -z "$(ls -A -- "$venv")" ]]; then
    : # empty directory: fine
  else
    die "$venv exists and is not a virtual environment; remove it or point KILN_VENV elsewhere"
  fi
fi

# --- create the venv ---------------------------------------------------------
pip_pin=$(sed -n 's/#.*//; s/[[:space:]]//g; /^pip==/p' "$pins" | head -n 1)

have_ensurepip() { "$python" -c 'import ensurepip, venv' 2>/dev/null; }

via_venv() { have_ensurepip && "$python" -m venv "$venv"; }

via_apt() {
  # Debian/Ubuntu split ensurepip out of the interpreter into pythonX.Y-venv
  # (what python3-venv pulls in). Only meaningful for the system interpreter.
  [[ $(id -u) == 0 && $py_exe == /usr/bin/* ]] && command -v apt-get >/dev/null || return 1
  log "ensurepip is missing: apt-get install python$py_mm-venv"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python$py_mm-venv" &&
    via_venv
}

via_virtualenv() {
  "$python" -m virtualenv --version >/dev/null 2>&1 || {
    "$python" -m pip --version >/dev/null 2>&1 || return 1
    log "ensurepip is missing: pip install --user virtualenv"
    # --user only; PEP 668 interpreters (Debian 12) refuse without the override.
    PIP_BREAK_SYSTEM_PACKAGES=1 "$python" -m pip install --user --disable-pip-version-check \
      --progress-bar off 'virtualenv>=20.26' || return 1
  }
  "$python" -m virtualenv --no-periodic-update "$venv"
}

via_nopip() {
  # Needs nothing but the standard library: a venv without pip, then the pinned
  # pip wheel fetched from the index (sha256 checked) and run from the wheel.
  [[ -n $pip_pin ]] || return 1
  log "bootstrapping ${pip_pin} from the package index into a venv created --without-pip"
  "$python" -m venv --without-pip "$venv" || return 1
  local tmp rc=0
  tmp=$(mktemp -d)
  "$venv/bin/python" - "${pip_pin#pip==}" "$tmp" <<'PY' || rc=$?
import hashlib, json, os, ssl, sys, urllib.request
version, tmp = sys.argv[1], sys.argv[2]
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
ctx = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)
req = urllib.request.Request(index + "/pip/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, context=ctx, timeout=120))["files"]
name = "pip-%s-py3-none-any.whl" % version
entry = next(f for f in files if f["filename"] == name)
data = urllib.request.urlopen(entry["url"], context=ctx, timeout=300).read()
if hashlib.sha256(data).hexdigest() != entry["hashes"]["sha256"]:
    sys.exit("sha256 mismatch for " + name)
with open(os.path.join(tmp, name), "wb") as f:
    f.write(data)
PY
  if [[ $rc == 0 ]]; then
    local whl=("$tmp"/pip-*.whl)
    "$venv/bin/python" "${whl[0]}/pip" install --no-index --disable-pip-version-check \
      --progress-bar off "${whl[0]}" || rc=$?
  fi
  rm -rf -- "$tmp"
  return "$rc"
}

if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  mkdir -p "$venv"
  printf '%s\n' "$py_id" >"$marker"
  if [[ $KILN_VENV_BOOTSTRAP == auto ]]; then
    via_venv || via_apt || via_virtualenv || via_nopip ||
      die "could not create a venv with $py_exe. Install the venv module (Debian/Ubuntu: sudo apt-get install python$py_mm-venv) and re-run"
  else
    "via_$KILN_VENV_BOOTSTRAP" || die "KILN_VENV_BOOTSTRAP=$KILN_VENV_BOOTSTRAP failed"
  fi
fi
vpy="$venv/bin/python"
"$vpy" -m pip --version >/dev/null 2>&1 || die "the venv at $venv has no working pip"

# --- install -----------------------------------------------------------------
pip_args=(--disable-pip-version-check --no-input --progress-bar off)
if [[ -n $pip_pin ]]; then
  "$vpy" -m pip install "${pip_args[@]}" "$pip_pin"
else
  "$vpy" -m pip install "${pip_args[@]}" --upgrade pip
fi
log "pip install -r tools/pins.txt (torch and its CUDA wheels are ~3 GB on a cold cache)"
"$vpy" -m pip install "${pip_args[@]}" -r "$pins"

# --- verify, then stamp ------------------------------------------------------
# Importing the runtime extension proves torch and executorch were paired right
# (the extension NEEDs libtorch*.so and libexecutorch.so).
if grep -q '^executorch==' "$pins"; then
  "$vpy" -c '
import torch, executorch.exir
from executorch.runtime import Runtime
Runtime.get()
' || die "the installed torch and executorch do not import together; see docs/dependencies.md"
fi
"$vpy" -m pip check >/dev/null 2>&1 || {
  log "warning: pip check reports conflicts:"
  "$vpy" -m pip check || true
}

printf '%s\n' "$expected" >"$stamp.tmp"
mv -f -- "$stamp.tmp" "$stamp"
log "done in $((SECONDS - start)) s: $venv"
printf '%s\n' "$venv" >&3
