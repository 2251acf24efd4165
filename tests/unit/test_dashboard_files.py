"""The Grafana dashboard, its provisioning, and Prometheus' configuration and alert rules parse and fit
together, and query only metrics the services register (tests/integration/test_dashboard.py checks the
same names against the services' real /metrics); `promtool` checks the PromQL where it is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "binlake.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS = DEPLOY / "grafana" / "provisioning" / "dashboards" / "binlake.yml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
RULES = DEPLOY / "prometheus" / "alerts.yml"
BINLAKE_JOBS = {"parser", "sink", "store", "meta", "loader"}
# Series Prometheus makes itself for every target, not exported by a service.
PROMETHEUS_SERIES = {"up"}
# What the issue asks the dashboard and the rules to show, by metric.
SHOWN = {"binlake_parser_lag_seconds", "binlake_parser_source_silence_seconds", "binlake_sink_partition_lag",
         "binlake_loader_lag_seconds", "binlake_parser_messages_total", "binlake_sink_events_out_total",
         "binlake_loader_rows_total", "binlake_sink_partition_halted", "binlake_sink_dead_letters_total",
         "binlake_loader_last_batch_seconds", "binlake_parser_snapshot_rows", "binlake_parser_snapshot_rows_estimated",
         "binlake_loader_tables_held"}
ALERTED = {"binlake_parser_lag_seconds", "binlake_loader_lag_seconds", "binlake_store_rows_total",
           "binlake_sink_partition_halted",
           "binlake_sink_stream_redefined_total", "binlake_store_stream_redefined_total",
           "binlake_sink_retention_gaps_total", "binlake_store_retention_gaps_total",
           "binlake_parser_source_silence_seconds", "binlake_loader_tables_held", "binlake_sink_dead_letters_total",
           "up"}

# -- PromQL: the metric names an expression queries ---------------------------------------------

_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
             "offset", "atan2", "inf", "nan"}
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPINGS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:$.])([A-Za-z_:][\w:]*)\s*(\(?)")


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects: identifiers outside strings, label matchers (`{...}`), ranges
    (`[...]`) and label lists (`by (...)` and the like) that no `(` follows (a function call) and that
    are no PromQL keyword. Grafana's variables (`$job`, `${x}`, `$__rate_interval`) are left out."""
    text = _STRINGS.sub('""', expr)
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)
    text = _GROUPINGS.sub(" ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)
    return {name for name, call in _IDENTIFIER.findall(text) if not call and name not in _KEYWORDS}


def test_metric_names_are_parsed_out_of_promql() -> None:
    assert metric_names('sum by (partition) (rate(binlake_sink_events_out_total{job=~"$job"}[$__rate_interval]))') \
        == {"binlake_sink_events_out_total"}
    assert metric_names("max(a_seconds * on(job, instance) group_left(table) b) > 300") == {"a_seconds", "b"}
    assert metric_names('(increase(c_total[15m]) > 0) or (c_total unless c_total offset 15m)') == {"c_total"}
    assert metric_names('time() - max(max_over_time((timestamp(changes(d{x="a}b"}[2m]) > 0))[6h:1m]))') == {"d"}
    assert metric_names('absent(up{job="sink"} == 1) and on() vector(1) > bool 2e3') == {"up"}
    assert metric_names('sum without(le, job) (e:recorded) / ignoring (x) f') == {"e:recorded", "f"}


# -- the files ------------------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    out: list[dict[str, Any]] = []
    for panel in doc.get("panels", []):
        out.append(panel)
        out += panel.get("panels", [])
    return out


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in panels(dashboard()) for t in p.get("targets", [])]


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def rule_exprs() -> list[str]:
    return [str(rule["expr"]) for rule in rules()]


def queried_metrics() -> set[str]:
    """Every metric name the dashboard's and the alert rules' expressions query."""
    return {name for expr in dashboard_exprs() + rule_exprs() for name in metric_names(expr)}


def registered_metrics() -> set[str]:
    """The names the services register on their `shared.metrics.Registry` (its namespace `binlake_`
    before each), read from the source."""
    found = set()
    for path in [*(ROOT / "services").rglob("*.py"), *(ROOT / "shared").rglob("*.py")]:
        for name in re.findall(r"registry\.(?:counter|gauge)\(\s*[\"'](\w+)[\"']", path.read_text()):
            found.add(f"binlake_{name}")
    return found


def test_the_dashboard_is_grafana_json_on_a_prometheus_datasource_variable() -> None:
    doc = dashboard()
    assert doc["uid"] == "binlake" and doc["title"] and 36 <= doc["schemaVersion"] <= 41
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in panels(doc)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels(doc):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel.get("description"), panel["id"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"] and target["expr"].strip(), panel["title"]
    for name in ("job", "instance"):
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    # Every query selects the chosen jobs and instances.
    for expr in dashboard_exprs():
        for selector in re.findall(r"binlake_\w+(\{[^}]*\})?", expr):
            assert selector == '{job=~"$job", instance=~"$instance"}', expr


def test_panels_do_not_overlap() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in panels(dashboard()):
        g = panel["gridPos"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_the_dashboard_and_the_rules_show_what_an_operator_needs() -> None:
    shown = {n for expr in dashboard_exprs() for n in metric_names(expr)}
    assert shown >= SHOWN, f"the dashboard shows nothing of {sorted(SHOWN - shown)}"
    alerted = {n for expr in rule_exprs() for n in metric_names(expr)}
    assert alerted >= ALERTED, f"no rule on {sorted(ALERTED - alerted)}"


def test_every_queried_metric_is_registered_by_a_service() -> None:
    registered = registered_metrics()
    assert len(registered) > 30, "the registry calls were not found in the source"
    missing = queried_metrics() - registered - PROMETHEUS_SERIES
    assert not missing, f"queried but registered by no service: {sorted(missing)}"


def test_rules_have_a_severity_and_say_what_to_do() -> None:
    doc = yaml.safe_load(RULES.read_text())
    assert doc["groups"] and all(g["name"].startswith("binlake") for g in doc["groups"])
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names)), "alert names repeat"
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert len(rule["annotations"]["description"]) > 80, f"{rule['alert']}: say what to do"


def test_prometheus_scrapes_every_binlake_service_of_the_compose_file() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    assert config["rule_files"] == [RULES.name]
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    port = compose["x-binlake"]["environment"]["BINLAKE_METRICS_PORT"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) >= BINLAKE_JOBS
    for name in BINLAKE_JOBS:
        assert services[name]["command"] == [name]
        job = jobs[name]
        if "dns_sd_configs" in job:  # the scaled sink: every worker's address
            assert job["dns_sd_configs"] == [{"names": [name], "type": "A", "port": int(port),
                                              "refresh_interval": "30s"}]
        else:
            assert job["static_configs"] == [{"targets": [f"{name}:{port}"]}]
    for rule in rules():  # the rules' jobs are these
        for job in re.findall(r'job=~?"([^"]+)"', str(rule["expr"])):
            assert set(job.split("|")) <= BINLAKE_JOBS, rule["alert"]


def test_grafana_provisioning_finds_the_datasource_and_the_dashboard() -> None:
    sources = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    assert [(s["type"], s["url"], s["isDefault"]) for s in sources] == [("prometheus", "http://prometheus:9090", True)]
    providers = yaml.safe_load(DASHBOARD_PROVIDERS.read_text())["providers"]
    assert [p["type"] for p in providers] == ["file"]
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    grafana = compose["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    assert mounts[f"{providers[0]['options']['path']}/{DASHBOARD.name}"] == "./grafana/binlake.json"
    assert mounts["/etc/grafana/provisioning/datasources/prometheus.yml"] == \
        "./grafana/provisioning/datasources/prometheus.yml"
    assert mounts["/etc/grafana/provisioning/dashboards/binlake.yml"] == \
        "./grafana/provisioning/dashboards/binlake.yml"


def test_monitoring_is_an_opt_in_profile_with_pinned_images_and_mounted_files() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    for name in ("prometheus", "grafana"):
        svc = compose["services"][name]
        assert svc["profiles"] == ["monitoring"], name
        image = re.sub(r"^\$\{\w+:-(.*)\}$", r"\1", svc["image"])
        assert re.fullmatch(r"(prom/prometheus:v|grafana/grafana:)\d+\.\d+\.\d+", image), image
        for volume in svc["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DEPLOY / source).is_file(), f"{name} mounts the missing {source}"
    prometheus = compose["services"]["prometheus"]
    assert "./prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in prometheus["volumes"]
    assert "./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]


# -- promtool (Debian's package `prometheus`), where installed ------------------------------------------

def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian package `prometheus`): the PromQL is not checked here")
    return found


def run_promtool(*args: str | Path) -> str:
    done = subprocess.run([promtool(), *map(str, args)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_promtool_accepts_the_rules_and_the_config() -> None:
    assert f"SUCCESS: {len(rules())} rules found" in run_promtool("check", "rules", RULES)
    run_promtool("check", "config", PROMETHEUS)


def test_promtool_accepts_every_dashboard_query(tmp_path: Path) -> None:
    """Each query, its Grafana variables replaced, as a recording rule: promtool parses it."""
    exprs = [e.replace("$__rate_interval", "1m").replace("$job", ".*").replace("$instance", ".*")
             for e in dashboard_exprs()]
    file = tmp_path / "dashboard.yml"
    file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]}]}))
    assert f"SUCCESS: {len(exprs)} rules found" in run_promtool("check", "rules", file)


def test_the_rules_fire_as_meant(tmp_path: Path) -> None:
    """promtool's rule tests (annotations left out: their text is checked above): the first dead
    letter fires although its counter has no sample before it; a standby's stale lag does not; the
    store handing out rows that the loader does not commit does."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(doc))
    sink, parser = {"job": "sink", "instance": "sink-1"}, {"job": "parser", "instance": "parser-1"}

    def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return {"series": f"{name}{{{text}}}", "values": values}

    def expect(alert: str, at: str, *labels: dict[str, str]) -> dict[str, Any]:
        return {"alertname": alert, "eval_time": at, "exp_alerts": [{"exp_labels": dict(x)} for x in labels]}

    crit, warn = {"severity": "critical"}, {"severity": "warning"}
    tests = {"rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            series("binlake_sink_dead_letters_total", {**sink, "partition": "3"}, "_x20 1x40"),
            series("binlake_sink_partition_halted", {**sink, "partition": "3"}, "_x20 1x40"),
            series("binlake_parser_lag_seconds", parser, "400x30"),
            series("binlake_parser_leader", parser, "1x30"),
            series("binlake_parser_lag_seconds", {**parser, "instance": "parser-2"}, "9999x30"),
            series("binlake_parser_leader", {**parser, "instance": "parser-2"}, "0x30"),
            series("binlake_parser_messages_total", parser, "0+12x30"),
            series("binlake_store_rows_total", {"job": "store", "instance": "store-1"}, "0+100x60"),
            series("binlake_loader_rows_total", {"job": "loader", "instance": "loader-1"}, "0+100x10 1000x50"),
            series("up", sink, "1x60"),
            series("up", parser, "1x30 0x30"),
        ],
        "alert_rule_test": [
            expect("BinlakeDeadLetter", "25m", {**crit, **sink, "partition": "3"}),
            expect("BinlakeDeadLetter", "50m"),  # 15 minutes without another
            expect("BinlakeSinkPartitionHalted", "50m", {**crit, "partition": "3"}),
            expect("BinlakeSourceLagHigh", "10m", warn),
            expect("BinlakeParserNotPublishing", "20m"),
            expect("BinlakeNoSinkWorker", "20m"),
            expect("BinlakeLakeStalled", "15m"),
            expect("BinlakeLakeStalled", "40m", crit),
            expect("BinlakeServiceDown", "40m", {**crit, **parser}),
        ],
    }]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests))
    run_promtool("test", "rules", tmp_path / "test.yml")
