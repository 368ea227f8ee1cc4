"""Vendor the page's JavaScript: ``npm ci`` from graphsvc/view/static/vendor/package-lock.json (pinned,
integrity-checked) in a temporary folder, then copy each shipped file and its licence next to the lock
and write their sha256s to MANIFEST.sha256 (tests/view/test_server.py checks the committed files against it).

Run from the checkout: ``python scripts/vendor_js.py``. Needs Node's npm; nothing is fetched at run time.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

VENDOR = Path(__file__).resolve().parent.parent / "graphsvc" / "view" / "static" / "vendor"
#: (file in node_modules, name it ships under)
FILES = [
    ("elkjs/lib/elk.bundled.js", "elk.bundled.js"),
    ("elkjs/LICENSE.md", "elk.LICENSE.md"),
]
MANIFEST = "MANIFEST.sha256"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("package.json", "package-lock.json"):
            shutil.copy(VENDOR / name, Path(tmp) / name)
        subprocess.run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=tmp, check=True)
        for source, target in FILES:
            shutil.copy(Path(tmp) / "node_modules" / source, VENDOR / target)
    lines = [f"{hashlib.sha256((VENDOR / target).read_bytes()).hexdigest()}  {target}" for _, target in FILES]
    (VENDOR / MANIFEST).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
