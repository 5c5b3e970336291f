"""The manager in the cluster's monitoring: GET /metrics in Prometheus' text format.

    meter = metrics.install(server, store, tokens=[page_token, scrape_token])   # before server.start()

What it says (prometheus_client, the `metrics` extra; without it the route answers 503 saying so):
    trialkit_trials{status="RUNNING"}         trials by status, read from the store at each scrape
    trialkit_queue_depth                       trials waiting for a slot in the experiment's job queue
    trialkit_records_received_total            records in the batches keepers sent (a batch sent again counts again)
    trialkit_records_stored_total              records stored (each once)
    trialkit_ack_seconds                       a batch's acknowledgement latency: from its body read to its answer,
                                               its commit included (a histogram)
    trialkit_keepers_connected                 keepers that delivered a batch in the last KEEPER_WINDOW seconds
    trialkit_manager_connections               connections open now (keepers, the page, scrapers)
On the keepers' path it costs a batch three additions, a bisect (its latency's bucket) and a dict write
(the keeper's last delivery): everything else is read when Prometheus asks, and prometheus_client loads then. The route is behind a token,
checked on the headers: the page's, the admin token, or a scrape token of its own (TRIALKIT_METRICS_TOKEN
in the manager's environment, for Prometheus' `authorization: {credentials_file: ...}`).
"""
from __future__ import annotations

import bisect
import hmac
import importlib.util
import itertools
import time
from typing import Any, Dict, Optional, Sequence, Tuple

from trialkit.manager.routes import HttpError, Raw, Request
from trialkit.manager.server import ManagerServer
from trialkit.manager.store import Store

KEEPER_WINDOW = 60.0  # a keeper ships at least its status and logs within this while its trial runs
# Acknowledgement latencies seen here: under a millisecond alone, tens with a thousand keepers and disk waits.
ACK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
EXTRA = "pip install 'trialkit[metrics]' (prometheus_client)"


class Meter:
    """The counters the keepers' route moves, and the collector that reads them and the rest at a scrape.

    The counters are plain numbers, handed to prometheus_client as metric families at a scrape: it loads then,
    not at the manager's start (~20 ms of a control plane's way to its first trial)."""

    def __init__(self, server: ManagerServer, store: Store):
        self._server, self._store = server, store
        self._last: Dict[str, float] = {}  # trial -> when its keeper last delivered (monotonic)
        self.received = self.stored = 0
        self._acks = [0] * (len(ACK_BUCKETS) + 1)  # batches by the first bucket their latency fits, +Inf last
        self._ack_sum = 0.0
        self._registry: Any = None

    def batch(self, trial_id: str, received: int, stored: int, started: float) -> None:
        """A batch answered: from the keepers' route (the server's loop, the only writer)."""
        now = time.monotonic()
        self.received += received
        self.stored += stored
        self._acks[bisect.bisect_left(ACK_BUCKETS, now - started)] += 1  # a bucket counts latencies <= its bound
        self._ack_sum += now - started
        self._last[trial_id] = now

    def collect(self) -> Any:
        """What is read at a scrape (prometheus_client's collector protocol)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
        from prometheus_client.utils import floatToGoString  # the bounds as its Histogram names them (le="1.0")

        yield CounterMetricFamily("trialkit_records_received", "Records in the batches keepers sent",
                                  value=self.received)
        yield CounterMetricFamily("trialkit_records_stored", "Records stored, each once", value=self.stored)
        acks, total = list(self._acks), self._ack_sum  # C-level copies: the loop's writes cannot tear them
        bounds = [*map(floatToGoString, ACK_BUCKETS), "+Inf"]
        yield HistogramMetricFamily("trialkit_ack_seconds", "A batch's acknowledgement latency, its commit included",
                                    buckets=list(zip(bounds, itertools.accumulate(acks))), sum_value=total)
        by_status, queued = self._store.counts()
        trials = GaugeMetricFamily("trialkit_trials", "Trials by status", labels=["status"])
        for status, count in sorted(by_status.items()):
            trials.add_metric([status], count)
        yield trials
        yield GaugeMetricFamily("trialkit_queue_depth", "Trials waiting for a slot in the job queue", value=queued)
        since = time.monotonic() - KEEPER_WINDOW
        last = dict(self._last)
        yield GaugeMetricFamily("trialkit_keepers_connected", f"Keepers that delivered in the last {KEEPER_WINDOW:g} s",
                                value=sum(1 for when in last.values() if when >= since))
        yield GaugeMetricFamily("trialkit_manager_connections", "Connections open now", value=self._server.connections)

    def describe(self) -> Sequence[Any]:
        return ()  # collected anew at each scrape: nothing to register ahead

    def exposition(self) -> Tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        if self._registry is None:  # scrapes run on the server's pool: two first ones may both make one, alike
            registry = CollectorRegistry()
            registry.register(self)
            self._registry = registry
        return generate_latest(self._registry), CONTENT_TYPE_LATEST


def install(server: ManagerServer, store: Store, tokens: Sequence[Optional[str]]) -> Optional[Meter]:
    """GET /metrics behind any of `tokens`; the meter the keepers' route moves, None without prometheus_client."""
    allowed = [token for token in tokens if token]
    meter = Meter(server, store) if importlib.util.find_spec("prometheus_client") is not None else None

    def check(request: Request) -> None:
        given = request.bearer()
        if given is None:
            raise HttpError(401, "no bearer token: give the page's token or TRIALKIT_METRICS_TOKEN")
        if not any(hmac.compare_digest(given.encode(), token.encode()) for token in allowed):
            raise HttpError(403, "wrong token for /metrics")

    def serve(request: Request) -> Tuple[int, Any]:
        if meter is None:
            raise HttpError(503, f"/metrics needs prometheus_client: {EXTRA}")
        body, content_type = meter.exposition()
        return 200, Raw(body, content_type)

    server.router.add("GET", "/metrics", serve, check)
    server.meter = meter
    return meter
