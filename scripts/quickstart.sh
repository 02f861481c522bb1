#!/usr/bin/env bash
# The quickstart: install everything, then run the main job on the embedded default (a
# local directory bucket with sample data): mount it, read it twice, print cold vs warm
# throughput and the hit ratio, unmount.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/python -m scripts.quickstart "$@"
