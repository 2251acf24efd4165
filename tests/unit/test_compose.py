"""The compose file and Dockerfile keep the packaging rules (tests/compose runs them for real)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared import permissions

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BINLAKE_SERVICES = {"meta", "store", "parser", "sink", "loader"}


FILES = ["docker-compose.yml", "docker-compose.cluster.yml"]


def compose(file: str = "docker-compose.yml") -> dict[str, Any]:
    return dict(yaml.safe_load((DEPLOY / file).read_text()))


def default(value: str) -> str:
    """`${VAR:-default}` -> default."""
    found = re.fullmatch(r"\$\{\w+:-(.*)\}", value)
    return found[1] if found else value


def test_every_service_is_there_with_command_and_restart():
    services = compose()["services"]
    assert {"mysql", "nats", "nats-box"} | BINLAKE_SERVICES <= set(services)
    for name, svc in services.items():
        assert svc.get("command"), f"{name} has no command"
        if name == "ops":  # the operator's commands, run on demand (`run --rm ops status`)
            assert svc["profiles"] == ["ops"] and svc["restart"] == "no"
            continue
        if name == "init":  # defines the streams as admin, then exits; meta waits for it
            assert svc["restart"] == "on-failure" and svc["command"] == ["init"]
            assert services["meta"]["depends_on"]["init"]["condition"] == "service_completed_successfully"
            continue
        assert svc.get("restart") == "unless-stopped", f"{name} is not restarted"
        if name != "nats-box":  # nothing waits for the CLI box
            assert svc.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


@pytest.mark.parametrize("file", FILES)
def test_the_binlake_image_is_built_once_and_run_by_every_service(file: str) -> None:
    services = compose(file)["services"]
    builders = [n for n, s in services.items() if "build" in s]
    assert builders == ["meta"]
    assert services["meta"]["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    for name in BINLAKE_SERVICES:
        svc = services[name]
        assert default(svc["image"]) == "binlake:local"
        assert svc["command"] == [name]
        assert svc["environment"]["BINLAKE_NATS_URL"].startswith("nats://nats")
        if name != "meta":
            assert svc["pull_policy"] == "never", f"{name} would try to pull the local image"


@pytest.mark.parametrize("file", FILES)
def test_registry_images_are_pinned(file: str) -> None:
    services = compose(file)["services"]
    for name in [n for n in services if n == "mysql" or n.startswith("nats")]:
        image = default(services[name]["image"])
        tag = image.rsplit(":", 1)[-1]
        assert re.match(r"\d+\.\d+\.\d+", tag), f"{name}: {image} is not pinned to a release"
    # The plain nats image is `scratch`: the healthcheck's wget needs the alpine one.
    for name in [n for n in services if n.startswith("nats") and n != "nats-box"]:
        assert default(services[name]["image"]).endswith("-alpine")
        assert services[name]["healthcheck"]["test"][1] == "wget"


@pytest.mark.parametrize("file", FILES)
def test_host_ports_are_loopback_and_configurable(file: str) -> None:
    for name, svc in compose(file)["services"].items():
        for port in svc.get("ports", []):
            assert re.fullmatch(r"127\.0\.0\.1:\$\{BINLAKE_\w+_PORT:-\d+\}:\d+", port), f"{name}: {port}"
    assert "ports" not in compose(file)["services"]["sink"]


@pytest.mark.parametrize("file", FILES)
def test_only_named_volumes(file: str) -> None:
    doc = compose(file)
    for name, svc in doc["services"].items():
        for vol in svc.get("volumes", []):
            src = vol.split(":", 1)[0]
            assert src.startswith("./") or src in doc["volumes"], f"{name}: {vol}"
    assert "VOLUME" not in (DEPLOY / "Dockerfile").read_text()


@pytest.mark.parametrize("file", FILES)
def test_dependencies_exist_and_wait(file: str) -> None:
    services = compose(file)["services"]
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            assert cond["condition"] in ("service_healthy", "service_started", "service_completed_successfully")
    assert services["parser"]["depends_on"]["mysql"] == {"condition": "service_healthy"}
    assert "container_name" not in services["sink"]


@pytest.mark.parametrize("file", FILES)
def test_mysql_is_configured_for_binlake(file: str) -> None:
    flags = set(compose(file)["services"]["mysql"]["command"])
    assert {"--binlog-format=ROW", "--binlog-row-image=FULL", "--binlog-row-metadata=FULL",
            "--binlog-transaction-compression=OFF"} <= flags
    init = (DEPLOY / "mysql-init.sql").read_text()
    assert "GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.*" in init


def test_dockerfile_pins_a_base_with_java_and_runs_as_a_user():
    text = (DEPLOY / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.11-slim-bookworm" in text and "FROM ${BASE_IMAGE}" in text
    assert "openjdk-17-jre-headless" in text and '".[spark]"' in text
    assert re.search(r"^USER binlake$", text, re.M)
    assert 'ENTRYPOINT ["binlake"]' in text


def test_the_build_context_is_only_what_the_image_needs():
    lines = [ln for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == "*"
    assert {"!pyproject.toml", "!README.md", "!shared/", "!services/"} <= set(lines)


def test_the_cluster_file_has_three_nats_nodes_r3_and_a_spark_cluster():
    services = compose("docker-compose.cluster.yml")["services"]
    urls = "nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222"
    for name in BINLAKE_SERVICES:
        assert services[name]["environment"]["BINLAKE_NATS_URL"] == urls
        assert services[name]["environment"]["BINLAKE_REPLICAS"] == "3"
    for i in (1, 2, 3):  # routes log in (nats/cluster.conf), with the password from deploy/.env
        node = services[f"nats-{i}"]
        assert node["command"][:2] == ["-c", "/etc/nats/cluster.conf"]
        others = sorted(v for k, v in node["environment"].items() if k in ("BINLAKE_ROUTE_1", "BINLAKE_ROUTE_2"))
        assert others == [f"nats://route:${{BINLAKE_ROUTE_PASSWORD}}@nats-{j}:6222" for j in (1, 2, 3) if j != i]
    cluster_conf = (DEPLOY / "nats" / "cluster.conf").read_text()
    assert "authorization { user: route, password: $BINLAKE_ROUTE_PASSWORD }" in cluster_conf
    assert services["loader"]["environment"]["BINLAKE_MASTER"] == "spark://spark-master:7077"
    for worker in ("spark-worker-1", "spark-worker-2"):
        assert services[worker]["command"][:3] == ["spark", "worker", "spark://spark-master:7077"]
        assert "lake-data:/data" in services[worker]["volumes"]  # the same warehouse path as the driver
    assert "lake-data:/data" in services["loader"]["volumes"]


def test_the_cluster_files_spark_authenticates_with_a_secret_from_env_file_kept_off_command_lines():
    services = compose("docker-compose.cluster.yml")["services"]
    spark = {"spark-master", "spark-worker-1", "spark-worker-2"}
    for name in spark:
        # `binlake spark` writes it into a private properties file (services.launcher.spark_daemon)
        assert services[name]["environment"]["BINLAKE_SPARK_SECRET"] == \
            "${BINLAKE_SPARK_SECRET:?run deploy/make-env.sh first (see docs/docker.md)}", name
    assert services["loader"]["environment"]["BINLAKE_SPARK_SECRET"] == "${BINLAKE_SPARK_SECRET}"
    for name, svc in services.items():
        assert "secret" not in " ".join(map(str, svc.get("command", []))).lower(), name
        if name not in spark | {"loader"}:  # no other container gets it
            assert "BINLAKE_SPARK_SECRET" not in (svc.get("environment") or {}), name
    # The master's UI answers without a login: published on the host's loopback only, no worker UI.
    assert services["spark-master"]["ports"] == ["127.0.0.1:${BINLAKE_SPARK_UI_PORT:-8080}:8080"]
    assert "ports" not in services["spark-worker-1"] and "ports" not in services["spark-worker-2"]


@pytest.mark.parametrize("file", FILES)
def test_auth_is_on_and_each_service_has_its_own_user(file: str) -> None:
    raw = (ROOT / "deploy" / file).read_text()
    services = compose(file)["services"]
    for name in (*BINLAKE_SERVICES, "ops", "init"):
        env = services[name]["environment"]
        role = "admin" if name in ("ops", "init") else name
        # compose reads `$$` as `$`
        assert {k: env[k].replace("$$", "$") for k in permissions.login_env(role)} == permissions.login_env(role), name
        assert env["BINLAKE_NATS_PASSWORD"] == f"${{BINLAKE_{role.upper()}_PASSWORD}}"
        assert ("BINLAKE_SOURCE_URL" in env) == (name in ("parser", "loader")), name
    for name, svc in services.items():
        if name.startswith("nats") and name != "nats-box":
            conf = svc["command"][1]
            assert svc["command"][0] == "-c" and conf in ("/etc/nats/server.conf", "/etc/nats/cluster.conf")
            assert "./nats/permissions.conf:/etc/nats/permissions.conf:ro" in svc["volumes"]
            # Monitoring (its /jsz names every consumer) on the container's loopback only.
            assert "-m" not in svc["command"]
            assert 'http: "127.0.0.1:8222"' in (DEPLOY / conf.replace("/etc/", "")).read_text()
    # No password has a default: without deploy/.env compose stops and names the script.
    monitoring = ("BINLAKE_GRAFANA_PASSWORD",) if "grafana" in services else ()
    for var in ("MYSQL_ROOT_PASSWORD", "BINLAKE_SOURCE_PASSWORD", "BINLAKE_ADMIN_PASSWORD", *monitoring):
        assert f"${{{var}:?run deploy/make-env.sh first" in raw
    assert "IDENTIFIED BY" not in (ROOT / "deploy" / "mysql-init.sql").read_text()
