"""A local stand-in for the Hugging Face Hub's revision API, shared by the download tests: ``GET
/api/models/<owner>/<name>/revision/<revision>`` answers the commit :func:`fake_commit` derives when the fake hub's
folder holds ``<owner>__<name>/``; everything else is a 404."""

import hashlib
import http.server
import json
from pathlib import Path


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
