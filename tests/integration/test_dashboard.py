"""The Grafana dashboard (deploy/grafana/binlake.json) and the alert rules (deploy/prometheus/alerts.yml)
query only metrics the services really export: parser, sink, meta, store and loader run as processes,
each /metrics is scraped, and every metric name in the dashboard's and the rules' PromQL is among them.

Names are taken from the `# TYPE` lines: `shared.metrics.Registry` prints HELP and TYPE for every
metric a service registered, while a labelled series (a partition's dead letters, a table's snapshot
rows) has no sample line until its first event. So no event has to happen; the services only have to
reach the state where they register everything (the parser's pipeline, the sink's partitions, the
loader's lake), which the test waits for."""

from __future__ import annotations

import re
import urllib.error
from collections.abc import Callable
from pathlib import Path

from services.launcher.processes import ServiceProcess
from tests.integration.conftest import ParserFactory
from tests.integration.lake_stack import Stack, services_answer
from tests.integration.support import http_get, wait_until
from tests.servers import MariaDB, free_port
from tests.unit.test_dashboard_files import PROMETHEUS_SERIES, queried_metrics

ServiceFactory = Callable[..., ServiceProcess]
_TYPE = re.compile(r"^# TYPE (\S+) (\w+)$", re.M)


def declared(port: int) -> dict[str, str]:
    """The metrics the service on `port` declares, with their kind (empty while it does not answer)."""
    try:
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    except (urllib.error.URLError, OSError):
        return {}
    return dict(_TYPE.findall(body)) if status == 200 else {}


def test_every_metric_the_dashboard_and_the_rules_query_is_exported(
        source: MariaDB, database: str, nats_url: str, parser_factory: ParserFactory,
        sink_factory: ServiceFactory, service_factory: ServiceFactory, tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("parser", "sink", "meta", "store", "loader")}
    procs = {"parser": parser_factory(BINLAKE_METRICS_PORT=str(ports["parser"])),
             "sink": sink_factory("sink", BINLAKE_METRICS_PORT=str(ports["sink"])),
             "meta": service_factory("services.meta", "meta", BINLAKE_METRICS_PORT=str(ports["meta"])),
             "store": service_factory("services.store", "store", BINLAKE_METRICS_PORT=str(ports["store"]))}
    wait_until(lambda: services_answer(nats_url), 60, "meta and store to answer", interval=0.5)
    stack = Stack(source, database, nats_url, tmp_path / "data", service_factory,
                  env_extra={"BINLAKE_METRICS_PORT": str(ports["loader"])})
    procs["loader"] = stack.start_loader()

    wanted = queried_metrics() - PROMETHEUS_SERIES
    assert len(wanted) > 20, "no metric names were parsed out of the dashboard and the rules"
    exported: dict[str, dict[str, str]] = {}

    def all_declared() -> bool:
        for name, proc in procs.items():
            assert proc.running, f"{name} died:\n{proc.output[-5000:]}"
            exported[name] = declared(ports[name])
        return wanted <= {m for names in exported.values() for m in names}

    try:
        wait_until(all_declared, 240, "the services to declare every metric the dashboard and the rules query",
                   interval=1)
    except AssertionError as exc:
        found = {m for names in exported.values() for m in names}
        raise AssertionError(f"{exc}: no service exports {sorted(wanted - found)} "
                             f"(declared: {({k: sorted(v) for k, v in exported.items()})})") from None

    kinds = {m: kind for names in exported.values() for m, kind in names.items()}
    for name in sorted(wanted):
        assert name.startswith("binlake_"), name
        # rate() and increase() are only meaningful on counters, and counters end in _total.
        assert (kinds[name] == "counter") == name.endswith("_total"), f"{name} is a {kinds[name]}"
