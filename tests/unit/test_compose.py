"""The compose file parses and describes a runnable stack (no Docker engine on test machines)."""

from __future__ import annotations

from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
BINLAKE_SERVICES = {"meta", "store", "parser", "sink", "loader"}


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def test_every_service_is_there_with_command_healthcheck_and_restart():
    services = compose()["services"]
    assert {"mysql", "nats", "nats-box"} | BINLAKE_SERVICES <= set(services)
    for name, svc in services.items():
        assert svc.get("command"), f"{name} has no command"
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        assert svc.get("restart") == "unless-stopped", f"{name} is not restarted"


def test_binlake_services_use_the_one_image_and_their_role():
    services = compose()["services"]
    for name in BINLAKE_SERVICES:
        svc = services[name]
        assert svc["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
        assert svc["command"] == [name]
        assert svc["environment"]["BINLAKE_NATS_URL"] == "nats://nats:4222"
        assert (DEPLOY.parent / svc["build"]["dockerfile"]).exists()


def test_dependencies_exist_and_wait_for_health():
    services = compose()["services"]
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            assert cond == {"condition": "service_healthy"}
    assert "mysql" in services["parser"]["depends_on"] and "nats" in services["parser"]["depends_on"]


def test_sink_can_be_scaled():
    sink = compose()["services"]["sink"]
    assert "container_name" not in sink and "ports" not in sink


def test_mysql_is_configured_for_binlake():
    flags = set(compose()["services"]["mysql"]["command"])
    assert {"--binlog-format=ROW", "--binlog-row-image=FULL", "--binlog-row-metadata=FULL",
            "--binlog-transaction-compression=OFF"} <= flags
    assert compose()["services"]["mysql"]["image"] == "mysql:8.4"
    init = (DEPLOY / "mysql-init.sql").read_text()
    assert "GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.*" in init


def test_dockerfile_installs_java_and_the_package():
    text = (DEPLOY / "Dockerfile").read_text()
    assert "openjdk-17-jre-headless" in text and 'pip install --no-cache-dir ".[spark]"' in text
    assert 'ENTRYPOINT ["binlake"]' in text
