"""Spot-instance termination notices from the instance metadata service (IMDS).

EC2 posts `spot/instance-action` about two minutes before it reclaims a spot
instance; until then the path answers 404. IMDSv2 wants a session token from
a PUT first. Where the token cannot be had (IMDSv2 off, or a container behind
a hop limit of 1 that never sees the PUT's answer) the GET works without one
(v1), so the watcher falls back to that. Off EC2 nothing answers at all: after
a few unanswered polls the watcher says so and stops.
"""
from __future__ import annotations

import os
import time
from typing import Dict, Optional

import requests

from trialkit import env

DEFAULT_URL = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
NOTICE_PATH = "/latest/meta-data/spot/instance-action"
TOKEN_TTL_SECONDS = 21600  # the longest IMDS grants
V1_RETRY_SECONDS = 300.0  # after the token failed, how long to poll with v1 before trying v2 again
REQUEST_TIMEOUT = 1.0  # a link-local service answers in milliseconds
GIVE_UP_AFTER = 3  # polls nobody answered, before any answer: not on EC2
POLL_SECONDS = 1.0  # notices come ~120 s ahead; a second's delay leaves the checkpoint its time


class Unreachable(Exception):
    """The metadata service never answered: this node is not an EC2 instance."""


def node_url() -> str:
    """This node's IMDS: TRIALKIT_IMDS_URL where the node sets it, else EC2's."""
    return (os.environ.get(env.IMDS_URL) or DEFAULT_URL).rstrip("/")


class SpotWatcher:
    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")
        self._token: Optional[str] = None
        self._token_until = 0.0  # monotonic; until then use _token (None: v1)
        self._answered = False
        self._unanswered = 0

    def check(self) -> Optional[Dict[str, str]]:
        """The notice ({"action": "terminate", "time": ...}) if one is posted, else None.

        Raises Unreachable when the service has never answered GIVE_UP_AFTER polls in a row.
        """
        try:
            answer = requests.get(self.base_url + NOTICE_PATH, headers=self._headers(), timeout=REQUEST_TIMEOUT)
        except requests.RequestException:
            self._unanswered += 1
            if not self._answered and self._unanswered >= GIVE_UP_AFTER:
                raise Unreachable(f"no instance metadata service answers at {self.base_url}") from None
            return None
        self._answered, self._unanswered = True, 0
        if answer.status_code == 401:
            self._token_until = 0.0  # the token expired early: get a new one next time
            return None
        if answer.status_code != 200:
            return None
        try:
            notice = answer.json()
        except ValueError:
            notice = {"action": answer.text.strip()}
        return notice if isinstance(notice, dict) else {"action": str(notice)}

    def _headers(self) -> Dict[str, str]:
        if time.monotonic() >= self._token_until:
            self._token = self._fetch_token()
        return {"X-aws-ec2-metadata-token": self._token} if self._token else {}

    def _fetch_token(self) -> Optional[str]:
        try:
            answer = requests.put(self.base_url + TOKEN_PATH, timeout=REQUEST_TIMEOUT,
                                  headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_SECONDS)})
            if answer.status_code == 200 and answer.text:
                self._token_until = time.monotonic() + TOKEN_TTL_SECONDS - 60
                return answer.text
        except requests.RequestException:
            pass
        self._token_until = time.monotonic() + V1_RETRY_SECONDS
        return None
