"""An object store of checkpoints (S3 and S3-compatible, GCS, Azure Blob) through obstore.

    store = ObjectStore(spec)                      # spec: trialkit.checkpoints.store_spec(...)
    ckpt = store.upload(local_dir, experiment, trial, uuid, run, metadata)   # files, then the manifest
    store.checkpoints(experiment[, trial])         # whole ones only (those with a manifest), oldest first
    store.download(ckpt, dest)                     # every file, sizes checked, renamed into place
    store.delete(ckpt)                             # the manifest first: never half listed
    store.copy_latest(experiment, source, trial)   # another trial's latest made this one's (PBT's exploit)

obstore wraps the Rust object_store crate: one wheel without dependencies for
the three clouds, each read with its own credential chain (S3: AWS_* variables,
web identity as IRSA gives it, ECS and EC2 instance metadata; GCS:
GOOGLE_APPLICATION_CREDENTIALS, the metadata server; Azure: AZURE_STORAGE_*
variables, managed identity), and large files go up in concurrent multipart
parts. Credentials never pass through trialkit: the library reads them itself.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid as uuids
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import obstore
from obstore.exceptions import NotFoundError

from trialkit.checkpoints import MANIFEST_SUFFIX, Checkpoint, dir_files, from_manifest, steps_of, store_url

FILES_AT_ONCE = 8  # files moved concurrently (a big file is itself cut into concurrent parts)
CHUNK = 8 << 20
# A request (one part of a big file) that stalls ends with an error and is retried by obstore, rather than
# hold an upload, and so a stopping trial's keeper, to its TRIALKIT_CHECKPOINT_TRANSFER_SECONDS.
CLIENT = {"connect_timeout": "10s", "read_timeout": "60s"}
# The check at an experiment's start: one listing, one retry, a few seconds at most (a store that does not
# answer is said at once, rather than after obstore's three minutes of retries).
CHECK_CLIENT = {"connect_timeout": "3s", "timeout": "5s"}
CHECK_RETRY = {"max_retries": 1, "retry_timeout": timedelta(seconds=5),
               "backoff": {"init_backoff": timedelta(milliseconds=200), "max_backoff": timedelta(seconds=1), "base": 2}}
# Where each cloud's credential chain ends when nothing in the environment names one: its metadata service.
METADATA_HOSTS = ("169.254.169.254", "metadata.google.internal", "169.254.170.2")
NO_CREDENTIALS = {
    "s3": "no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run "
          "where an instance role or web identity gives them)",
    "gcs": "no Google Cloud credentials found (set GOOGLE_APPLICATION_CREDENTIALS to a service account's key "
           "file, or run where the metadata server gives them)",
    "azure": "no Azure credentials found (set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY, or "
             "AZURE_STORAGE_SAS_TOKEN, or run where a managed identity gives them)",
}


REFUSED_FIX = "check the endpoint's host and port, and that the store runs there"


class StoreError(Exception):
    """The store refused or could not be reached: one line saying which store and why, and how to fix it
    where the error alone tells (a refused connection); else the caller's words say that."""

    def __init__(self, what: str, fix: Optional[str] = None):
        self.what, self.fix = what, fix
        super().__init__(f"{what} ({fix})" if fix else what)


def _store(spec: Mapping[str, str], quick: bool = False) -> Any:
    """obstore's store for spec; `quick`: with the check's short time limits."""
    from obstore.store import AzureStore, GCSStore, S3Store

    client = CHECK_CLIENT if quick else CLIENT
    retry = {"retry_config": CHECK_RETRY} if quick else {}
    prefix = spec.get("prefix", "").strip("/") or None
    kind = spec["type"]
    if kind == "s3":
        config: Dict[str, str] = {}
        if spec.get("endpoint_url"):
            config["endpoint"] = spec["endpoint_url"]
        if spec.get("region"):
            config["region"] = spec["region"]
        http = spec.get("endpoint_url", "").startswith("http://")  # an S3-compatible store on a plain address
        return S3Store(spec["bucket"], prefix=prefix, config=config or None,
                       client_options={**client, "allow_http": True} if http else client, **retry)
    if kind == "gcs":
        return GCSStore(spec["bucket"], prefix=prefix, client_options=client, **retry)
    config = {"account_name": _azure_account(spec["account_url"])} if spec.get("account_url") else None
    return AzureStore(spec["container"], prefix=prefix, config=config, client_options=client, **retry)


def _azure_account(url: str) -> str:
    """The account of `https://ACCOUNT.blob.core.windows.net`."""
    host = url.split("://", 1)[-1].split("/", 1)[0]
    return host.split(".", 1)[0]


class ObjectStore:
    def __init__(self, spec: Mapping[str, str]):
        self.spec = dict(spec)
        self.url = store_url(spec)
        try:
            self._store = _store(spec)
        except Exception as err:  # noqa: BLE001 - obstore's configuration errors have no common type
            raise _failed(f"cannot open the checkpoint store {self.url}", err, self.spec) from None

    def check(self) -> None:
        """One listing within a few seconds: credentials found, the bucket there, the store reachable.
        StoreError saying which is not."""
        try:
            quick = _store(self.spec, quick=True)
            obstore.list_with_delimiter(quick, "")
        except Exception as err:  # noqa: BLE001 - obstore raises its own and the OS's errors
            raise _failed(f"the checkpoint store {self.url} cannot be used", err, self.spec) from None

    # -- where things are ------------------------------------------------------------------------
    @staticmethod
    def trial_key(experiment: str, trial: str) -> str:
        return f"{experiment}/{trial}"

    def where(self, experiment: str, trial: str, uuid: str) -> str:
        return f"{self.url}/{self.trial_key(experiment, trial)}/{uuid}"

    # -- writing ----------------------------------------------------------------------------------
    def upload(self, src: Path, experiment: str, trial: str, uuid: str, run: int, kind: str,
               metadata: Mapping[str, Any]) -> Checkpoint:
        """Every file under src, then the manifest that makes the checkpoint whole."""
        files = dir_files(src)
        base = f"{self.trial_key(experiment, trial)}/{uuid}"
        self._each(lambda rel: obstore.put(self._store, f"{base}/{rel}", src / rel, chunk_size=CHUNK), files)
        ckpt = Checkpoint(uuid=uuid, experiment=experiment, trial=trial, run=run, kind=kind, metadata=dict(metadata),
                          steps=steps_of(metadata), files=files, size=sum(files.values()), time=time.time(),
                          where=self.where(experiment, trial, uuid))
        self._call(obstore.put, f"{base}{MANIFEST_SUFFIX}", json.dumps(ckpt.manifest()).encode())
        return ckpt

    def copy_latest(self, experiment: str, source: str, trial: str) -> Optional[Checkpoint]:
        """The source trial's latest checkpoint copied, inside the store (no byte comes through here), as one of
        `trial` under a new uuid, manifest last: the checkpoint the trial's keeper restores before it starts.
        None when the source has none."""
        stored = self.checkpoints(experiment, source)
        if not stored:
            return None
        latest = stored[-1]
        src = f"{self.trial_key(experiment, source)}/{latest.uuid}"
        uuid = str(uuids.uuid4())
        base = f"{self.trial_key(experiment, trial)}/{uuid}"
        self._each(lambda rel: self._call(obstore.copy, f"{src}/{rel}", f"{base}/{rel}"), latest.files)
        ckpt = latest._replace(uuid=uuid, trial=trial, run=0, time=time.time(),
                               where=self.where(experiment, trial, uuid))
        self._call(obstore.put, f"{base}{MANIFEST_SUFFIX}", json.dumps(ckpt.manifest()).encode())
        return ckpt

    def delete(self, ckpt: Checkpoint) -> None:
        """The manifest first (from then on it is not a checkpoint), then its files."""
        base = f"{self.trial_key(ckpt.experiment, ckpt.trial)}/{ckpt.uuid}"
        self._call(obstore.delete, f"{base}{MANIFEST_SUFFIX}")
        paths = [meta["path"] for batch in self._call(obstore.list, base + "/") for meta in batch]
        if paths:
            self._call(obstore.delete, paths)

    # -- reading ----------------------------------------------------------------------------------
    def checkpoints(self, experiment: str, trial: Optional[str] = None) -> List[Checkpoint]:
        """The experiment's (or one trial's) whole checkpoints, oldest first."""
        if trial is None:
            listed = self._call(obstore.list_with_delimiter, experiment + "/")
            trials = [prefix.rstrip("/").rsplit("/", 1)[-1] for prefix in listed["common_prefixes"]]
        else:
            trials = [trial]
        manifests = []
        for name in trials:
            listed = self._call(obstore.list_with_delimiter, self.trial_key(experiment, name) + "/")
            manifests += [meta["path"] for meta in listed["objects"] if meta["path"].endswith(MANIFEST_SUFFIX)]
        found = []
        for path, data in zip(manifests, self._each(self._read_json, manifests)):
            uuid = path.rsplit("/", 1)[-1][:-len(MANIFEST_SUFFIX)]
            experiment_of, trial_of = path.split("/")[-3:-1]
            try:
                found.append(from_manifest(data, self.where(experiment_of, trial_of, uuid)))
            except (ValueError, TypeError, KeyError):
                continue  # not trialkit's: someone else's object under the prefix
        return sorted(found, key=lambda c: (c.time, c.uuid))

    def download(self, ckpt: Checkpoint, dest: Path) -> None:
        """Every file of the checkpoint into dest (fetched beside it, then moved into place): a copy cut short
        leaves dest as it was, and a file whose size differs from the manifest's is refused."""
        base = f"{self.trial_key(ckpt.experiment, ckpt.trial)}/{ckpt.uuid}"
        dest = Path(dest)
        tmp = dest.with_name(f".{dest.name}.part-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            self._each(lambda rel: self._get_file(f"{base}/{rel}", tmp / rel, ckpt.files[rel]), ckpt.files)
            place(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _get_file(self, key: str, path: Path, size: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        got = 0
        with open(path, "wb") as out:
            for chunk in self._call(obstore.get, key).stream(min_chunk_size=CHUNK):
                got += out.write(chunk)
        if got != size:
            raise StoreError(f"{self.url}/{key} holds {got} bytes, its manifest says {size}: the checkpoint was "
                             "changed after it was stored")

    def _read_json(self, key: str) -> Any:
        try:
            return json.loads(bytes(self._call(obstore.get, key).bytes()))
        except ValueError:
            return None

    # -- calls ---------------------------------------------------------------------------------
    def _each(self, call, items) -> List[Any]:
        items = list(items)
        if len(items) <= 1:
            return [call(item) for item in items]
        with ThreadPoolExecutor(min(FILES_AT_ONCE, len(items))) as pool:
            return list(pool.map(call, items))

    def _call(self, call, *args, **kwargs) -> Any:
        try:
            return call(self._store, *args, **kwargs)
        except NotFoundError as err:
            raise _failed(f"not found in the checkpoint store {self.url}", err, self.spec) from None
        except StoreError:
            raise
        except Exception as err:  # noqa: BLE001 - obstore raises its own and the OS's errors
            raise _failed(f"the checkpoint store {self.url} failed", err, self.spec) from None


def place(src: Path, dest: Path) -> None:
    """src's contents as dest: renamed into place, or, where dest is an empty dir (a volume's mount point,
    which cannot be replaced), moved into it entry by entry."""
    if dest.is_dir() and not any(dest.iterdir()):
        for entry in src.iterdir():
            os.replace(entry, dest / entry.name)
        return
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(src, dest)


def _failed(head: str, err: BaseException, spec: Mapping[str, str]) -> StoreError:
    """`head: why`. A refused connection is its endpoint's (a wrong endpoint_url, a store that is down), said
    in a few words: obstore's text for it is a paragraph of retries and a debug dump."""
    text = str(err)
    if "Connection refused" in text or "ConnectionRefused" in text:
        url = re.search(r"performing [A-Z]+ ([a-z]+://[^/\s]+)", text)
        endpoint = url.group(1) if url else spec.get("endpoint_url") or "its endpoint"
        return StoreError(f"{head}: {endpoint} refused the connection", REFUSED_FIX)
    return StoreError(f"{head}: {_why(err, spec)}")


def _why(err: BaseException, spec: Mapping[str, str]) -> str:
    """What went wrong, in one line: obstore's messages run to many lines (the store's XML answer, a debug dump)
    and name the cause last; a credential chain that found nothing ends at the cloud's metadata service."""
    text = str(err).strip()
    if any(f"//{host}" in text for host in METADATA_HOSTS):
        return NO_CREDENTIALS[spec["type"]]
    code = re.search(r"<Code>([^<]+)</Code>", text)
    if code is not None:
        if code.group(1) in ("NoSuchBucket", "ContainerNotFound"):
            return f"{'container' if spec['type'] == 'azure' else 'bucket'} " \
                   f"{spec.get('bucket') or spec.get('container')!r} does not exist"
        if code.group(1) in ("NoSuchKey", "BlobNotFound"):
            where = re.search(r"(?:location|performing [A-Z]+) (\S+)", text)
            return f"{where.group(1) if where else 'an object'} does not exist ({code.group(1)})"
        message = re.search(r"<Message>([^<]+)</Message>", text)
        return f"{code.group(1)}: {message.group(1) if message else 'refused'}"[:300]
    lines = text.splitlines()
    first = lines[0] if lines else type(err).__name__
    cause = re.search(r'message: "([^"]+)"', text) or re.search(r'ConnectError\(\s*"([^"]+)"', text)
    if cause is not None and cause.group(1) not in first:
        first = f"{first} ({cause.group(1)})"
    return first[:400]
