"""A local stand-in for the Hugging Face Hub, shared by the download tests: a fake ``hf`` CLI that copies repos out of
a folder (:data:`FAKE_HF`) and the revision API, ``GET /api/models/<owner>/<name>/revision/<revision>``, which answers
the commit :func:`fake_commit` derives when the fake hub's folder holds ``<owner>__<name>/`` (everything else is a
404); :func:`fake_hub_env` starts both."""

import contextlib
import hashlib
import http.server
import json
import os
import threading
from pathlib import Path
from typing import Dict, Iterator

# fake `hf download REPO --revision REV --local-dir DIR [--include GLOB]...`: copies what the globs match in
# $FAKE_HUB/<owner>__<name>/ (everything without one), keeping relative paths, at any revision; every call is logged
# for the tests to check
FAKE_HF = r"""#!/usr/bin/env bash
echo "$*" >> "$FAKE_HUB/calls.log"
[ "$1" = download ] || exit 1
repo=$2; shift 2; dir=; includes=()
while [ $# -gt 0 ]; do
  case $1 in --local-dir) dir=$2; shift 2 ;; --include) includes+=("$2"); shift 2 ;; *) shift ;; esac
done
src="$FAKE_HUB/${repo//\//__}"
[ -d "$src" ] || { echo "404: $repo" >&2; exit 1; }
mkdir -p "$dir"
if [ ${#includes[@]} -eq 0 ]; then cp -r "$src/." "$dir/"; exit 0; fi
for pattern in "${includes[@]}"; do
  for f in "$src"/$pattern; do
    [ -e "$f" ] || continue
    rel=${f#"$src"/}; mkdir -p "$dir/$(dirname "$rel")"; cp -rT "$f" "$dir/$rel"
  done
done
exit 0
"""


def fake_commit(repo: str, revision: str) -> str:
    """The commit the fake hub serves for ``repo`` at ``revision``."""
    return hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()


class QuietHubHandler(http.server.BaseHTTPRequestHandler):
    hub: Path = None  # the fake hub's folder: a repo exists when <owner>__<name>/ does

    def do_HEAD(self):  # noqa: N802 - http.server's naming
        self.send_response(404)
        self.end_headers()

    def do_GET(self):  # noqa: N802 - /api/models/<owner>/<name>/revision/<revision>: the model info of a revision
        parts = self.path.split("?")[0].split("/")
        if len(parts) == 7 and parts[1:3] == ["api", "models"] and parts[5] == "revision":
            repo = f"{parts[3]}/{parts[4]}"
            if (self.hub / repo.replace("/", "__")).is_dir():
                body = json.dumps({"id": repo, "sha": fake_commit(repo, parts[6])}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def fake_hub_env(hub: Path, bin_dir: Path) -> Iterator[Dict[str, str]]:
    """The environment of a ``download_weights.sh`` run against ``hub``: :data:`FAKE_HF` first on ``PATH`` (written to
    ``bin_dir``) and ``HF_ENDPOINT`` at a local revision API, served until the block ends."""
    bin_dir.mkdir(parents=True)
    (bin_dir / "hf").write_text(FAKE_HF)
    (bin_dir / "hf").chmod(0o755)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (QuietHubHandler,), {"hub": hub}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_HUB": str(hub),
               "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}"}
    finally:
        server.shutdown()
