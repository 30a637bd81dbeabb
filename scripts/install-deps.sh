#!/usr/bin/env bash
# Installs, from Debian's packages, everything Myriad needs to build, test and
# run its demo. Idempotent: packages already present are not touched, and when
# nothing is missing no network or root access is needed.
set -euo pipefail

PACKAGES=(
  # build
  g++ cmake make pkg-config
  # libraries
  libopenblas-dev libopenblas0-openmp openmpi-bin libopenmpi-dev libsentencepiece-dev libtomlplusplus-dev
  # Hugging Face tokenizers: pre-tokenizer regexes (PCRE2) and Unicode normalization (utf8proc)
  libpcre2-dev libutf8proc-dev
  nlohmann-json3-dev libcli11-dev libxxhash-dev libgtest-dev libgmock-dev
  # serving: HTTP (Boost.Beast/Asio, header-only), the remote KV tier (client and the server the tests
  # start), the OpenAI SDK test
  libboost1.81-dev libhiredis-dev redis-server nodejs
  # golden reference and benchmark peer
  python3 python3-torch python3-numpy
  # chat templates: Python's Jinja, a reference renderer of the parity test
  python3-jinja2
  # pictures in the docs (post-training curves)
  gnuplot-nox
  # default corpus: English and Chinese text (code comes from Python's stdlib)
  fortunes fortunes-zh libpython3-stdlib
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || echo "install-deps: apt-get update failed; trying with the cached lists" >&2
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
