"""TLS to the source: the parser connects the way the URL says (the MySQL clients' ssl-mode),
a server that only accepts TLS gets it, and a wrong setting fails with one line naming the fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.integration.certs import Certs, make_certs
from tests.integration.conftest import ParserFactory
from tests.integration.support import read_stream_sync, row_changes, wait_until
from tests.servers import MariaDB


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return make_certs(tmp_path / "certs")


def tls_only_server(mariadb_factory: Callable[..., MariaDB], certs: Certs) -> MariaDB:
    server = mariadb_factory(extra_args=[f"--ssl-ca={certs.ca}", f"--ssl-cert={certs.server_cert}",
                                         f"--ssl-key={certs.server_key}"])
    server.execute("CREATE DATABASE shop", "CREATE TABLE shop.t (id INT PRIMARY KEY)",
                   "SET GLOBAL require_secure_transport = ON")  # after the start: its readiness probe is plain
    return server


@pytest.mark.parametrize("query", ["?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}", "?ssl-ca={ca}", "?ssl-mode=REQUIRED"],
                         ids=["verify-identity", "ca-alone-verifies", "required"])
def test_the_parser_reads_a_tls_only_source(mariadb_factory: Callable[..., MariaDB], parser_factory: ParserFactory,
                                            nats_url: str, certs: Certs, query: str) -> None:
    server = tls_only_server(mariadb_factory, certs)
    url = server.dsn() + "/" + query.format(ca=quote(str(certs.ca)))
    parser = parser_factory(wait_ready=False, BINLAKE_SOURCE_URL=url)
    wait_until(lambda: '"pipeline.start"' in parser.output or not parser.running, 60, "the parser to start")
    server.execute("INSERT INTO shop.t VALUES (1)", ssl={"ca": str(certs.ca)})
    wait_until(lambda: row_changes(read_stream_sync(nats_url), "shop") or not parser.running, 60, "the row")
    assert parser.running, parser.output
    assert [r["after"]["id"] for m in row_changes(read_stream_sync(nats_url), "shop") for r in m.env["rows"]] == [1]


def test_a_plain_connection_to_a_tls_only_source_names_the_setting(mariadb_factory: Callable[..., MariaDB],
                                                                   parser_factory: ParserFactory,
                                                                   certs: Certs) -> None:
    server = tls_only_server(mariadb_factory, certs)
    parser = parser_factory(wait_ready=False, BINLAKE_SOURCE_URL=server.dsn())  # no TLS unless the URL asks
    assert parser.wait(60) != 0, parser.output
    # MySQL names the cause (error 3159); MariaDB only says "access denied": the hint covers both.
    assert "require_secure_transport=ON" in parser.output and "ssl-mode=REQUIRED" in parser.output, parser.output


def test_tls_demanded_from_a_server_without_it_is_refused(mariadb: MariaDB, parser_factory: ParserFactory,
                                                          certs: Certs) -> None:
    parser = parser_factory(wait_ready=False, BINLAKE_SOURCE_URL=mariadb.dsn() + "/?ssl-mode=REQUIRED")
    assert parser.wait(60) == 2, parser.output
    assert "TLS with the source failed" in parser.output and "have_ssl" in parser.output, parser.output
    preferred = parser_factory(wait_ready=False, log_name="p3.log",
                               BINLAKE_SOURCE_URL=mariadb.dsn() + "/?ssl-mode=PREFERRED")
    assert preferred.wait(60) == 2 and "may fall back to plain text" in preferred.output, preferred.output
    wrong_ca = parser_factory(wait_ready=False, log_name="p2.log",
                              BINLAKE_SOURCE_URL=mariadb.dsn() + "/?ssl-mode=VERIFY_CA")
    assert wrong_ca.wait(60) == 2 and "needs ssl-ca=" in wrong_ca.output, wrong_ca.output
