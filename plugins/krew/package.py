"""Build the archive plugins/krew/pilotfish.yaml installs, byte for byte reproducibly.

The manifest's sha256 is the hash of this archive, so the archive is built with fixed
timestamps, owners and modes: the same launcher always gives the same bytes, and a test
rebuilds it to check the manifest's sha256 still matches.

  python plugins/krew/package.py [OUT]    (default dist/kubectl-pilotfish.tar.gz; prints sha256)
"""

from __future__ import annotations

import gzip
import hashlib
import io
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAUNCHER = HERE / "kubectl-pilotfish"


def archive() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        data = LAUNCHER.read_bytes()
        info = tarfile.TarInfo(LAUNCHER.name)
        info.size = len(data)
        info.mode = 0o755
        info.mtime = 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("dist/kubectl-pilotfish.tar.gz")
    out.parent.mkdir(parents=True, exist_ok=True)
    data = archive()
    out.write_bytes(data)
    print(f"{hashlib.sha256(data).hexdigest()}  {out}")


if __name__ == "__main__":
    main()
