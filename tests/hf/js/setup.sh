#!/usr/bin/env bash
# Installs the pinned Hugging Face JavaScript packages of tests/hf/js (the
# tokenizer and chat-template oracles) and prints the folder their .mjs
# scripts run from: scripts/npm-cache.sh does the work.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
exec "$HERE/../../../scripts/npm-cache.sh" "$HERE" hf
