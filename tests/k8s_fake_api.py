"""A local HTTP server on 127.0.0.1 that stands in for a Kubernetes API server.

It keeps objects in memory by path (create, read, replace, merge-patch,
delete; a replace naming a resourceVersion other than the stored one is 409
Conflict, and every write moves the version on), lists and deletes pods by label selector, records every request the
official `kubernetes` client sends (verb, path, query, headers, JSON body),
and can be told to fail the next requests (503, 429, a dropped connection) to
test retries. It answers API discovery (GET /apis/GROUP/VERSION) for the
group versions in `served` (default: every one in GROUP_VERSIONS), and a GET
of a collection lists its objects (labelSelector applied). It checks nothing that a real server would check about the
objects: the render tests do that against the real schemas.
"""
from __future__ import annotations

import copy
import json
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Optional
from urllib.parse import parse_qs, urlsplit

import yaml

KUBE_TOKEN = "kube-bearer-token"


@dataclass
class Request:
    method: str
    path: str
    query: Dict[str, str]
    headers: Dict[str, str]
    body: Optional[dict]


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message, "code": code}


def _merge(into: dict, patch: dict) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _next_version(metadata: dict) -> str:
    return str(int(metadata.get("resourceVersion") or 0) + 1)


def _matches(labels: dict, selector: str) -> bool:
    wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
    return all(labels.get(key) == value for key, value in wanted.items())


# What API discovery lists, by group version: the operators' and Kueue's kinds trialkit uses.
GROUP_VERSIONS = {
    "kubeflow.org/v1": ["pytorchjobs", "tfjobs"],
    "trainer.kubeflow.org/v1alpha1": ["trainjobs", "trainingruntimes", "clustertrainingruntimes"],
    "frameworkcontroller.microsoft.com/v1": ["frameworks"],
    "adaptdl.petuum.com/v1": ["adaptdljobs"],
    "kueue.x-k8s.io/v1beta2": ["workloads", "localqueues", "clusterqueues", "workloadpriorityclasses"],
}


class FakeApiServer:
    def __init__(self):
        self.served = set(GROUP_VERSIONS)  # the group versions discovery lists: a cluster's installed operators
        self.requests: List[Request] = []
        self.objects: Dict[str, dict] = {}
        self.pods: List[dict] = []
        self.faults: List[str] = []  # for the next requests, in order: "503", "500", "429", "403", "drop"
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _handle(self):
                fake._serve(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "FakeApiServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def kubeconfig(self, directory: Path) -> Path:
        path = directory / "kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": KUBE_TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
            "current-context": "fake",
        }))
        return path

    def calls(self) -> List[tuple]:
        """(verb, path) of every request, in order."""
        return [(r.method, r.path) for r in self.requests]

    # --- serving ---------------------------------------------------------

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        parts = urlsplit(handler.path)
        request = Request(
            method=handler.command,
            path=parts.path,
            query={k: v[-1] for k, v in parse_qs(parts.query).items()},
            headers={k.lower(): v for k, v in handler.headers.items()},
            body=json.loads(raw) if raw else None,
        )
        with self._lock:
            self.requests.append(request)
            fault = self.faults.pop(0) if self.faults else None
            if fault == "drop":
                handler.close_connection = True  # no answer at all: the client sees the connection end
                return
            if fault:
                code = int(fault)
                headers = {"Retry-After": "0"} if code == 429 else {}
                return self._answer(handler, code, _status(code, "Injected", f"injected {code}"), headers)
            code, body = self._route(request)
        self._answer(handler, code, body)

    @staticmethod
    def _answer(handler, code: int, body: dict, headers: Optional[dict] = None) -> None:
        data = json.dumps(body).encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(data)

    def _route(self, request: Request):
        path, method = request.path, request.method
        if path.endswith("/pods"):
            selector = request.query.get("labelSelector", "")
            chosen = [p for p in self.pods if _matches(p["metadata"].get("labels", {}), selector)]
            if method == "DELETE":
                self.pods = [p for p in self.pods if p not in chosen]
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": chosen}
        if method == "POST":
            body = copy.deepcopy(request.body)
            target = f"{path}/{body['metadata']['name']}"
            if target in self.objects:
                return 409, _status(409, "AlreadyExists", f"{body['kind']} {body['metadata']['name']!r} already exists")
            body["metadata"].update(uid=str(uuid.uuid4()), resourceVersion="1", creationTimestamp="2025-01-01T00:00:00Z")
            self.objects[target] = body
            return 201, body
        parts = path.strip("/").split("/")
        if method == "GET" and len(parts) == 3 and parts[0] == "apis":
            group_version = f"{parts[1]}/{parts[2]}"
            if group_version not in self.served:
                return 404, _status(404, "NotFound", "the server could not find the requested resource")
            return 200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
                         "resources": [{"name": plural, "namespaced": True, "kind": plural, "verbs": ["get"]}
                                       for plural in GROUP_VERSIONS[group_version]]}
        if method == "GET" and path not in self.objects:
            selector = request.query.get("labelSelector", "")
            items = [obj for key, obj in self.objects.items() if key.rsplit("/", 1)[0] == path
                     and _matches(obj["metadata"].get("labels", {}), selector)]
            # A collection: /api/v1/namespaces/NS/PLURAL, /apis/G/V/namespaces/NS/PLURAL, /apis/G/V/PLURAL.
            if len(parts) == (5 if parts[0] == "api" else 6 if "namespaces" in parts else 4):
                return 200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}
        if path not in self.objects:
            return 404, _status(404, "NotFound", f"{path.rsplit('/', 1)[-1]!r} not found")
        if method == "GET":
            return 200, self.objects[path]
        if method == "PUT":
            body = copy.deepcopy(request.body)
            stored = self.objects[path]["metadata"]
            # A write that names a resourceVersion is taken only over that version (optimistic concurrency).
            if body["metadata"].get("resourceVersion") not in (None, stored.get("resourceVersion")):
                return 409, _status(409, "Conflict", f"the object has been modified: {path.rsplit('/', 1)[-1]!r}")
            body["metadata"].update(uid=stored["uid"], resourceVersion=_next_version(stored))
            self.objects[path] = body
            return 200, body
        if method == "PATCH":
            _merge(self.objects[path], request.body)
            self.objects[path]["metadata"]["resourceVersion"] = _next_version(self.objects[path]["metadata"])
            return 200, self.objects[path]
        if method == "DELETE":
            return 200, self.objects.pop(path)
        return 405, _status(405, "MethodNotAllowed", method)
