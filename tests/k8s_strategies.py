"""Hypothesis strategies for Kubernetes trainingService sections and trials.

Each strategy draws a section a user could write (NNI v2 spelling, keys in
camelCase or snake_case at random) together with the facts the tests check
the rendering against.
"""
from __future__ import annotations

import json
import re
import string

from hypothesis import strategies as st

MANAGER_PORT = 8081
TOKEN = "tok-3f9a1c0e7b2d"  # no rendered object may contain it


def snake(key: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def respell(value, style: str):
    """`value` with every mapping key in `style` ("camel" as written, or "snake")."""
    if isinstance(value, dict):
        return {(snake(k) if style == "snake" else k): respell(v, style) for k, v in value.items()}
    if isinstance(value, list):
        return [respell(v, style) for v in value]
    return value


ids = st.text(alphabet=string.ascii_letters + string.digits + "_-.", min_size=1, max_size=70)
# A user's command is a shell line of their own: quotes, $, ;, newlines, unicode.
commands = st.text(
    alphabet=st.one_of(st.characters(blacklist_categories=("Cs", "Cc")), st.sampled_from("\n\t'\"$`;&|\\")),
    min_size=1,
    max_size=120,
).filter(lambda s: s.strip())
images = st.from_regex(r"[a-z0-9]{1,12}(/[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?){0,2}:[0-9][0-9.]{0,6}", fullmatch=True)  # the reference grammar: a component neither starts nor ends with -
dns_labels = st.from_regex(r"[a-z]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
addresses = st.ip_addresses(v=4).filter(lambda a: not (a.is_loopback or a.is_unspecified or a.is_link_local)).map(str)
units = st.sampled_from(["", "k", "kb", "m", "mb", "Mi", "g", "gb", "Gi", "G", "t"])


@st.composite
def sizes(draw):
    """A size in NNI's spelling and its value in MiB, the way the renderer must read it."""
    if draw(st.booleans()):
        mib = draw(st.integers(1, 65536))
        return mib, mib
    number = draw(st.integers(1, 4096))
    unit = draw(units)
    factor = {"": 1024**2, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}[unit[:1].lower()]
    return f"{number}{unit}", -(-number * factor // (1024 * 1024))


@st.composite
def resources(draw):
    out, facts = {}, {}
    if draw(st.booleans()):
        out["cpuNumber"] = draw(st.one_of(st.integers(1, 64), st.sampled_from([0.1, 0.25, 0.5, 1.5, 2.5])))
    if draw(st.booleans()):
        out["gpuNumber"] = draw(st.integers(0, 8))
    if draw(st.booleans()):
        out["memorySize"], facts["memory_mib"] = draw(sizes())
    return out, facts


@st.composite
def common_options(draw):
    """The options every Kubernetes platform has, all valid."""
    out = {"managerAddress": draw(addresses), "dockerImage": draw(images)}
    if draw(st.booleans()):
        out["namespace"] = draw(dns_labels)
    grace = draw(st.sampled_from(["none", "keeper", "termination", "both"]))
    keeper = draw(st.integers(1, 600))
    if grace in ("keeper", "both"):
        out["keeperGraceSeconds"] = keeper
    if grace == "termination":
        out["terminationGracePeriodSeconds"] = keeper + 6
    if grace == "both":
        out["terminationGracePeriodSeconds"] = keeper + draw(st.integers(1, 120))
    if draw(st.booleans()):
        out["nfs"] = {
            "server": draw(addresses),
            "path": "/" + draw(st.from_regex(r"[a-z0-9/]{0,20}", fullmatch=True)),
            "containerMountPath": draw(st.sampled_from(["/nfs", "/data", "/mnt/shared", "/home/trial/data"])),
        }
    if draw(st.booleans()):
        out["serviceAccountName"] = draw(dns_labels)
    if draw(st.booleans()):
        out["imagePullSecrets"] = [{"name": n} for n in draw(st.lists(dns_labels, min_size=1, max_size=3, unique=True))]
    return out


@st.composite
def role(draw, count_key: str, count):
    out = {count_key: draw(count)}
    if draw(st.booleans()):
        out["command"] = draw(commands)
    if draw(st.booleans()):
        out["dockerImage"] = draw(images)
    res, _ = draw(resources())
    out.update(res)
    return out


@st.composite
def kubeflow_sections(draw):
    section = {"platform": "kubeflow", **draw(common_options())}
    operator = draw(st.sampled_from(["pytorch-operator", "tf-operator"]))
    section["operator"] = operator
    replicas = st.integers(1, 16)
    if operator == "pytorch-operator":
        section["master"] = draw(role("replicas", st.just(1)))
        if draw(st.booleans()):
            section["worker"] = draw(role("replicas", replicas))
    else:
        section["worker"] = draw(role("replicas", replicas))
        for optional, count in (("ps", replicas), ("master", st.just(1))):
            if draw(st.booleans()):
                section[optional] = draw(role("replicas", count))
    return respell(section, draw(st.sampled_from(["camel", "snake"])))


@st.composite
def task_roles(draw):
    names = draw(st.lists(st.from_regex(r"[a-z0-9]{1,12}", fullmatch=True), min_size=1, max_size=3, unique=True))
    roles = []
    for name in names:
        item = draw(role("taskNumber", st.integers(1, 20)))
        item["name"] = name
        count = item["taskNumber"]
        if draw(st.booleans()):
            item["frameworkAttemptCompletionPolicy"] = {
                "minFailedTaskCount": draw(st.one_of(st.just(-1), st.integers(1, count))),
                "minSucceededTaskCount": draw(st.one_of(st.just(-1), st.integers(1, count))),
            }
        roles.append(item)
    return roles


@st.composite
def frameworkcontroller_sections(draw):
    section = {"platform": "frameworkcontroller", **draw(common_options()), "taskRoles": draw(task_roles())}
    return respell(section, draw(st.sampled_from(["camel", "snake"])))


@st.composite
def adaptdl_sections(draw):
    section = {"platform": draw(st.sampled_from(["adaptdl", "adl"])), **draw(common_options())}
    section["image"] = section.pop("dockerImage")
    res, _ = draw(resources())
    section.update(res)
    if draw(st.booleans()):
        section["command"] = draw(commands)
    if draw(st.booleans()):
        section["adaptive"] = draw(st.booleans())
    low = draw(st.one_of(st.none(), st.integers(0, 8)))
    high = draw(st.one_of(st.none(), st.integers(max(1, low or 0), 16)))
    if low is not None:
        section["minReplicas"] = low
    if high is not None:
        section["maxReplicas"] = high
    if draw(st.booleans()):
        checkpoint = {}
        if draw(st.booleans()):
            checkpoint["storageClass"] = draw(dns_labels)
        if draw(st.booleans()):
            checkpoint["storageSize"] = draw(sizes())[0]
        section["checkpoint"] = checkpoint
    return respell(section, draw(st.sampled_from(["camel", "snake"])))


@st.composite
def trial_specs(draw):
    """A TrialSpec as the control plane makes one, with host paths the pods must not see."""
    from trialkit.platforms.base import TrialSpec

    parameters = draw(st.dictionaries(st.text(min_size=1, max_size=8), st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=10)), max_size=4))
    sequence = draw(st.integers(0, 10**6))
    spec = TrialSpec(
        experiment_id=draw(ids),
        trial_id=draw(ids),
        sequence=sequence,
        command=draw(commands),
        env={
            "TRIALKIT_TOKEN": TOKEN,
            "TRIALKIT_MANAGER_URL": f"http://127.0.0.1:{MANAGER_PORT}/api/v1",
            "TRIALKIT_PARAMETERS": json.dumps(parameters),
            "TRIALKIT_TRIAL_DIR": "/home/me/experiments/e1/trials/t1",
            "TRIALKIT_CHECKPOINT_DIR": "/home/me/experiments/e1/trials/t1/checkpoint",
            "TRIALKIT_RESTART_COUNT": "0",
        },
    )
    return spec
