"""Fetch one archive the manager keeps for this trial, check its digest, unpack it.

    python3 fetch.py SHA256 DEST

run.sh runs it in the pod before the keeper starts, with any python3 the
image has: it imports the standard library only, never trialkit (the image
may not hold it: this is how trialkit's trial side arrives). It reads the
manager's URL, the trial's id and token from the environment the platform
set (TRIALKIT_MANAGER_URL, TRIALKIT_TRIAL_ID, TRIALKIT_TOKEN), GETs
/api/v1/trials/<id>/archives/<SHA256> with the token, refuses bytes whose
sha256 is not SHA256, and unpacks them into DEST through a sibling temporary
directory renamed into place, so DEST is whole or absent. A DEST that exists
is the cache of an earlier start of this pod: nothing is fetched. Failures
are one line on stderr and exit 1; a manager that does not answer is tried
again for up to RETRY_SECONDS (it may be restarting).
"""
import hashlib
import io
import os
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request

RETRY_SECONDS = 60.0
TIMEOUT_SECONDS = 30.0


def fail(message):
    sys.stderr.write(f"fetch.py: {message}\n")
    sys.exit(1)


def download(url, token):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    deadline, pause = time.monotonic() + RETRY_SECONDS, 0.5
    while True:
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as answer:
                return answer.read()
        except urllib.error.HTTPError as err:
            if err.code < 500 or time.monotonic() > deadline:
                fail(f"{url}: the manager answered {err.code}: {err.read(500).decode('utf-8', 'replace')}")
        except (OSError, urllib.error.URLError) as err:
            if time.monotonic() > deadline:
                fail(f"{url}: the manager could not be reached for {RETRY_SECONDS:g} s: {err}")
        time.sleep(pause)
        pause = min(pause * 2, 5.0)


def unpack(data, dest):
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    partial = tempfile.mkdtemp(prefix=".fetch-", dir=parent)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(partial, filter="data")
            else:  # a Python before the filters: refuse what would land outside
                for member in tar.getmembers():
                    if member.name.startswith("/") or ".." in member.name.split("/") or member.islnk() \
                            or member.isdev():
                        fail(f"the archive holds {member.name!r}, which would land outside {dest}")
                tar.extractall(partial)
        os.rename(partial, dest)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not os.path.isdir(dest):  # else another container of the pod unpacked it first
            raise
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def main(argv):
    if len(argv) != 3:
        fail("usage: fetch.py SHA256 DEST")
    digest, dest = argv[1], argv[2]
    if os.path.isdir(dest):
        return 0
    missing = [name for name in ("TRIALKIT_MANAGER_URL", "TRIALKIT_TRIAL_ID", "TRIALKIT_TOKEN")
               if not os.environ.get(name)]
    if missing:
        fail(f"{', '.join(missing)} not set: the platform sets them for a trial")
    url = "{}/api/v1/trials/{}/archives/{}".format(
        os.environ["TRIALKIT_MANAGER_URL"].rstrip("/"), urllib.request.quote(os.environ["TRIALKIT_TRIAL_ID"]), digest)
    data = download(url, os.environ["TRIALKIT_TOKEN"])
    found = hashlib.sha256(data).hexdigest()
    if found != digest:
        fail(f"{url}: the archive's sha256 is {found}, not {digest}: refused")
    try:
        unpack(data, dest)
    except (OSError, tarfile.TarError) as err:
        fail(f"cannot unpack the archive into {dest}: {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
