#!/usr/bin/env bash
# Builds the Pilotfish OCI image without a registry (pilotfish/devcluster/image.py): Debian 12
# root filesystem by mmdebstrap from packages.txt beside this script, the checkout's wheel and
# its pinned dependencies in a venv at /opt/pilotfish, user 65532, entrypoint `pilotfish`.
# Cached under $PILOTFISH_CACHE/image (default ~/.cache/pilotfish/image); prints the archive
# path and the image reference. Needs root. Extra arguments go to `pilotfish dev image`
# (--json: also the Python, Debian and PyPI versions inside).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
exec "${PILOTFISH:-$root/.venv/bin/pilotfish}" dev image "$@"
