"""Names and values checked as the cluster will check them, before anything is rendered or submitted.

An object the API server refuses (a storage class `BAD CLASS`), or one it takes but the kubelet cannot run
(an image named with a space: InvalidImageName), would fail every trial at submission; refused here, it is
one line naming the config's key. Every Kubernetes platform's config goes through these checks
(config.py's shared parsers), and the renderer checks the image each pod runs, whatever gave it. The
rules are Kubernetes' own (k8s.io/apimachinery validation, distribution/reference for images).
"""
from __future__ import annotations

import re
from typing import Any

from trialkit import schema
from trialkit.errors import UserError

# RFC 1123: a label (namespaces, hostnames) and a subdomain (most object names: storage and priority
# classes, service accounts, Secrets).
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_LABEL_MAX = 63
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_SUBDOMAIN_MAX = 253
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1  # a PriorityClass's value

# distribution/reference's grammar (what the kubelet parses an image with): [host[:port]/]path[:tag][@digest].
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_HOST_PART}(?:\.{_HOST_PART})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_NAME = rf"(?:{_HOST}/)?{_PATH_PART}(?:/{_PATH_PART})*"
IMAGE = re.compile(rf"(?P<name>{_NAME})(?::[\w][\w.-]{{0,127}})?"
                   r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?")
IMAGE_NAME_MAX = 255


def dns_label(value: str, where: str, what: str) -> str:
    """A name that must be a DNS label (a namespace): lowercase letters, digits and '-', at most 63."""
    if len(value) > DNS_LABEL_MAX or not DNS_LABEL.fullmatch(value):
        raise UserError(f"{schema.show(value)} is not a {what} name: the cluster takes a DNS label", where,
                        f"use lowercase letters, digits and '-', starting and ending with a letter or digit, "
                        f"at most {DNS_LABEL_MAX} characters")
    return value


def dns_subdomain(value: str, where: str, what: str) -> str:
    """An object's name that must be a DNS subdomain (a StorageClass, a PriorityClass, a ServiceAccount, a
    Secret): lowercase DNS labels joined by dots, at most 253 characters."""
    if len(value) > DNS_SUBDOMAIN_MAX or not DNS_SUBDOMAIN.fullmatch(value):
        raise UserError(f"{schema.show(value)} is not a {what} name: the cluster takes a DNS subdomain", where,
                        f"use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, "
                        f"at most {DNS_SUBDOMAIN_MAX} characters")
    return value


def image(value: str, where: str) -> str:
    """A container image reference the kubelet can pull: [registry[:port]/]repository[:tag][@digest], the
    repository in lowercase."""
    found = IMAGE.fullmatch(value)
    if found is None or len(found.group("name")) > IMAGE_NAME_MAX:
        problem = ("holds whitespace" if any(c.isspace() for c in value)
                   else "names its repository in uppercase" if found is None and value.lower() != value
                   and IMAGE.fullmatch(value.lower()) else "is not an image reference")
        raise UserError(f"image {schema.show(value)} {problem}", where,
                        "write [REGISTRY[:PORT]/]REPOSITORY[:TAG][@sha256:DIGEST], like "
                        "registry.example.com/team/train:1.0, the repository in lowercase")
    return value


def priority(value: Any, where: str) -> int:
    """A priority a PriorityClass can hold: a whole number (YAML's, or a JSON key's text) within int32."""
    if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,30}\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{schema.show(value)} is not a whole number", where, "give priorities as whole numbers")
    if not INT32_MIN <= value <= INT32_MAX:
        raise UserError(f"priority {schema.show(value)} is outside the cluster's priorities", where,
                        f"give a priority from {INT32_MIN} to {INT32_MAX} : a PriorityClass's value is 32 bits")
    return value
