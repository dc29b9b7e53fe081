"""A small in-memory stand-in for the Hugging Face Hub, for offline tests of pushing and loading checkpoints.

It answers the part of the Hub HTTP API that huggingface_hub (2.x) uses to create a repo, upload files in a commit and
download them back, for models and for Spaces (``spaces`` in place of ``models``, and ``/spaces`` before
``/{repo_id}/resolve``):

    POST /api/repos/create                                  create a repo (409 with its url if it exists); a Space
                                                            needs its SDK
    POST /api/validate-yaml                                 check a README's YAML metadata (yaml.safe_load)
    POST /api/models/{repo_id}/preupload/{revision}         "regular" upload mode for every file: no LFS, no Xet
    POST /api/models/{repo_id}/commit/{revision}            NDJSON commit: header line, then base64 "file" lines
    GET  /api/models/{repo_id}[/revision/{revision}]        repo info: commit sha and file list
    GET  /api/models/{repo_id}/tree/{revision}[/{path}]     file listing
    HEAD/GET /{repo_id}/resolve/{revision}/{filename}       file metadata (ETag, X-Repo-Commit, Content-Length), bytes

A repo is known by its URL path: ``user/name`` for a model, ``spaces/user/name`` for a Space (``hub.files`` and
``hub.repos`` take that key).

Every commit is an immutable snapshot of the repo: files are stored exactly as sent and served back byte for byte.
Writes need a bearer token; a private repo answers 404 to requests without one, as the Hub does. Anything else answers
404, so a test fails loudly if huggingface_hub starts using an endpoint this server does not implement. The server
runs in a daemon thread and shuts itself down after `lifetime_s` seconds if the test does not stop it first.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import yaml

REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"
REV = r"(?P<rev>[^/]+)"
API = r"/api/(?P<kind>models|spaces)"
FILES = r"(?:/(?P<kind>spaces))?"
ROUTES = [
    ("POST", re.compile(r"/api/repos/create"), "create_repo"),
    ("POST", re.compile(r"/api/validate-yaml"), "validate_yaml"),
    ("POST", re.compile(rf"{API}/{REPO}/preupload/{REV}"), "preupload"),
    ("POST", re.compile(rf"{API}/{REPO}/commit/{REV}"), "commit"),
    ("GET", re.compile(rf"{API}/{REPO}(?:/revision/{REV})?"), "repo_info"),
    ("GET", re.compile(rf"{API}/{REPO}/tree/{REV}(?:/(?P<path>.*))?"), "tree"),
    ("GET", re.compile(rf"{FILES}/{REPO}/resolve/{REV}/(?P<path>.+)"), "resolve"),
    ("HEAD", re.compile(rf"{FILES}/{REPO}/resolve/{REV}/(?P<path>.+)"), "resolve"),
]


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a file, which the Hub sends as the ETag of regular (non-LFS) files."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    private: bool
    head: str
    snapshots: dict[str, dict[str, bytes]]  # commit sha -> {path: bytes}
    messages: dict[str, str] = field(default_factory=dict)  # commit sha -> summary

    def resolve(self, revision: str) -> str | None:
        if revision == "main":
            return self.head
        return revision if revision in self.snapshots else None


class HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


class LocalHub:
    """``with LocalHub(token="hf_x") as hub:`` then point ``HF_ENDPOINT`` at ``hub.endpoint``."""

    def __init__(self, token: str, lifetime_s: float = 120.0):
        self.token = token
        self.lifetime_s = lifetime_s
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status), for debugging failed tests
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> LocalHub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # port 0: a free port
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        self._timer = threading.Timer(self.lifetime_s, self._server.shutdown)
        self._timer.daemon = True
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()
        self._server.shutdown()
        self._server.server_close()

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        repo = self.repos[repo_id]
        return dict(repo.snapshots[repo.resolve(revision)])

    # --- the API, called with the lock held; each returns (status, headers, body) -------------------------------------

    def create_repo(self, request: _Handler) -> tuple[int, dict, bytes]:
        self._check_token(request)
        payload = json.loads(request.body)
        repo_id = f"{payload['organization']}/{payload['name']}"
        kind = payload.get("type", "model")
        if kind not in ("model", "space"):
            raise HubError(400, None, "this test server only hosts models and Spaces")
        if kind == "space":
            if payload.get("sdk") not in ("gradio", "docker", "static"):
                raise HubError(
                    400, None, f"a Space needs its sdk (gradio, docker or static), not {payload.get('sdk')!r}"
                )
            repo_id = f"spaces/{repo_id}"
        url = f"{self.endpoint}/{repo_id}"
        if repo_id in self.repos:
            return _json(409, {"error": "You already created this model repo", "url": url})
        private = payload.get("visibility") == "private" or bool(payload.get("private"))
        sha = hashlib.sha1(f"initial commit of {repo_id}".encode()).hexdigest()
        self.repos[repo_id] = Repo(private=private, head=sha, snapshots={sha: {}}, messages={sha: "initial commit"})
        return _json(200, {"url": url, "name": repo_id})

    def validate_yaml(self, request: _Handler) -> tuple[int, dict, bytes]:
        content = json.loads(request.body)["content"]
        errors = []
        match = re.match(r"\A---\n(.*?)\n---\n", content, flags=re.S)
        try:
            if match is None or not isinstance(yaml.safe_load(match.group(1)), dict):
                errors.append({"message": "README.md does not start with a YAML mapping between '---' lines"})
        except yaml.YAMLError as error:
            errors.append({"message": f"invalid YAML: {error}"})
        return _json(400 if errors else 200, {"errors": errors, "warnings": []})

    def preupload(self, request: _Handler, repo: str, rev: str) -> tuple[int, dict, bytes]:
        self._check_token(request)
        self._repo(request, repo, rev)
        files = json.loads(request.body)["files"]
        modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
        return _json(200, {"files": modes})

    def commit(self, request: _Handler, repo: str, rev: str) -> tuple[int, dict, bytes]:
        self._check_token(request)
        repo_obj, sha = self._repo(request, repo, rev)
        if rev != "main":
            raise HubError(400, None, "this test server only commits to main")
        lines = [json.loads(line) for line in request.body.splitlines() if line.strip()]
        if not lines or lines[0]["key"] != "header":
            raise HubError(400, None, "the commit payload must start with a header line")
        files = dict(repo_obj.snapshots[sha])
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            if key == "file" and value.get("encoding") == "base64":
                files[value["path"]] = base64.b64decode(value["content"], validate=True)
            elif key == "deletedFile":
                files.pop(value["path"], None)
            else:
                raise HubError(400, None, f"unsupported commit operation {key!r} (only regular files)")
        header = lines[0]["value"]
        digest = hashlib.sha1(sha.encode() + header["summary"].encode())
        for path in sorted(files):
            digest.update(path.encode() + b"\0" + git_blob_sha1(files[path]).encode())
        new_sha = digest.hexdigest()
        repo_obj.snapshots[new_sha] = files
        repo_obj.messages[new_sha] = header["summary"]
        repo_obj.head = new_sha
        body = {"commitUrl": f"{self.endpoint}/{repo}/commit/{new_sha}", "commitOid": new_sha}
        return _json(200, {**body, "pullRequestUrl": None})

    def repo_info(self, request: _Handler, repo: str, rev: str | None) -> tuple[int, dict, bytes]:
        repo_obj, sha = self._repo(request, repo, rev or "main")
        siblings = [{"rfilename": path} for path in sorted(repo_obj.snapshots[sha])]
        repo = repo.removeprefix("spaces/")
        info = {"id": repo, "modelId": repo, "sha": sha, "private": repo_obj.private, "siblings": siblings}
        return _json(200, {**info, "tags": [], "library_name": "transformers"})

    def tree(self, request: _Handler, repo: str, rev: str, path: str | None) -> tuple[int, dict, bytes]:
        repo_obj, sha = self._repo(request, repo, rev)
        prefix = f"{path.strip('/')}/" if path else ""
        files = {p: data for p, data in repo_obj.snapshots[sha].items() if p.startswith(prefix)}
        if prefix and not files:
            raise HubError(404, "EntryNotFound", f"{path} does not exist on {rev}", commit=sha)
        entries = [
            {"type": "file", "oid": git_blob_sha1(d), "size": len(d), "path": p} for p, d in sorted(files.items())
        ]
        return _json(200, entries)

    def resolve(self, request: _Handler, repo: str, rev: str, path: str) -> tuple[int, dict, bytes]:
        repo_obj, sha = self._repo(request, repo, rev)
        data = repo_obj.snapshots[sha].get(path)
        if data is None:
            raise HubError(404, "EntryNotFound", f"{path} does not exist on {rev}", commit=sha)
        headers = {
            "Content-Type": "application/octet-stream",
            "ETag": f'"{git_blob_sha1(data)}"',
            "X-Repo-Commit": sha,
            "Accept-Ranges": "none",
        }
        return 200, headers, data

    # --- helpers ------------------------------------------------------------------------------------------------------

    def _check_token(self, request: _Handler) -> None:
        if request.headers.get("authorization") != f"Bearer {self.token}":
            raise HubError(401, None, "Invalid username or password.")

    def _repo(self, request: _Handler, repo_id: str, revision: str) -> tuple[Repo, str]:
        repo = self.repos.get(repo_id)
        authorized = request.headers.get("authorization") == f"Bearer {self.token}"
        if repo is None or (repo.private and not authorized):
            raise HubError(404, "RepoNotFound", f"Repository {repo_id} not found")
        sha = repo.resolve(revision)
        if sha is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return repo, sha


def _json(status: int, obj) -> tuple[int, dict, bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(obj).encode()


class _Handler(BaseHTTPRequestHandler):
    hub: LocalHub
    timeout = 30  # seconds a connection may stay silent: no test can hang on a half-sent request

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""
        path = urlsplit(self.path).path
        try:
            for route_method, pattern, name in ROUTES:
                match = pattern.fullmatch(path)
                if route_method == method and match:
                    args = {k: unquote(v) if v is not None else None for k, v in match.groupdict().items()}
                    if args.pop("kind", None) == "spaces":  # a Space is known by its URL path
                        args["repo"] = f"spaces/{args['repo']}"
                    with self.hub._lock:
                        status, headers, body = getattr(self.hub, name)(self, *args.values())
                    break
            else:
                raise HubError(404, None, f"{method} {path} is not implemented by this test server")
        except HubError as error:
            headers = {"Content-Type": "application/json"}
            if error.code:
                headers["X-Error-Code"] = error.code
            if error.commit:
                headers["X-Repo-Commit"] = error.commit
            status, body = error.status, json.dumps({"error": error.message}).encode()
        self.hub.requests.append((method, path, status))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # keep pytest output clean
        pass
