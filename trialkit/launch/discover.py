"""Finding node 0 where the platform names no chief address: AdaptDL's supervisor.

AdaptDL's scheduler gives a job's replicas no master address: each asks the
supervisor (ADAPTDL_SUPERVISOR_URL) for the pod addresses of its restart
group, by rank, as AdaptDL's own init_process_group does. The supervisor holds
the request until every replica of the group has an address and answers 408
when its own wait runs out; then we ask again.
"""
from __future__ import annotations

import json
import time
from typing import Mapping

from trialkit import env
from trialkit.errors import UserError

ANSWER_SECONDS = 90  # longer than the supervisor's own long poll (30 s by default)
ATTEMPTS = 5  # a supervisor that does not answer at all: tries, a second apart


def with_chief(environ: Mapping[str, str]) -> Mapping[str, str]:
    """`environ`, with TRIALKIT_CHIEF_ADDR from AdaptDL's supervisor where only it knows node 0."""
    names = env.ADAPTDL
    url = environ.get(names["supervisor_url"], "")
    replicas = environ.get(names["num_replicas"], "")
    if not url or environ.get(env.CHIEF_ADDR) or environ.get(names["master_addr"]) \
            or not replicas.isdigit() or int(replicas) < 2:
        return environ
    job, group = environ.get(names["job_id"], ""), environ.get(names["restart_count"], "0")
    return {**environ, env.CHIEF_ADDR: rank_zero_address(f"{url.rstrip('/')}/discover/{job}/{group}")}


def rank_zero_address(url: str) -> str:
    """The first address the supervisor lists at `url` (AdaptDL 0.2 answers a list; later ones
    {"pod_ip_list": [...]})."""
    import urllib.error
    import urllib.request

    failures = 0
    while True:
        try:
            with urllib.request.urlopen(url, timeout=ANSWER_SECONDS) as answer:
                listed = json.loads(answer.read())
            break
        except urllib.error.HTTPError as err:
            if err.code != 408:  # 408: not every replica has an address yet
                raise UserError(f"AdaptDL's supervisor answered {err.code} at {url}", env.ADAPTDL["supervisor_url"],
                                "check that the job's AdaptDL scheduler runs") from None
        except (OSError, ValueError) as err:
            failures += 1
            if failures == ATTEMPTS:
                raise UserError(f"cannot ask AdaptDL's supervisor at {url}: {err}", env.ADAPTDL["supervisor_url"],
                                "check that the job's AdaptDL scheduler runs") from None
            time.sleep(1)
    addresses = listed.get("pod_ip_list") if isinstance(listed, dict) else listed
    if not isinstance(addresses, list) or not addresses or not isinstance(addresses[0], str):
        raise UserError(f"AdaptDL's supervisor at {url} named no address: {str(listed)[:200]}",
                        env.ADAPTDL["supervisor_url"], "check that the job's AdaptDL scheduler runs")
    return addresses[0]

