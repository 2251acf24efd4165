"""Re-snapshot requests the lake needs, kept durably until the parser has them.

A DDL whose effect on existing values the lake cannot reproduce (Spark casting where the
source converts, an expression DEFAULT, rows a partition statement removed, a column's
precision, length, members or charset changed) asks the parser to read the table again.
The request is a row of `<catalog>._binlake.resnapshots`, written before the DDL's own
commit to the table (its marker passes the DDL only with that commit), so a loader killed
anywhere after it still has the request when it starts again.

The id comes from the table and the DDL's place in the binlog: a redelivered DDL writes the
same row (a MERGE, no second row), and filing it twice creates the same KV key, whose second
create fails and counts as done. `filed` turns true once the parser's request key exists.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from pyspark.sql import SparkSession

from services.loader.iceberg import Iceberg
from services.loader.naming import BOOK_NAMESPACE, RESNAPSHOTS_TABLE, quote, sql_string

COLUMNS = {"id": "string", "db": "string", "tbl": "string", "why": "string", "filed": "boolean"}


@dataclass(frozen=True)
class Request:
    id: str
    db: str
    table: str
    why: str


def request_id(db: str, table: str, order: tuple[int, int]) -> str:
    """The id of the re-snapshot the DDL at `order` (scn, seq) needs for `db.table`."""
    digest = hashlib.sha256(f"{db}\0{table}\0{order[0]}\0{order[1]}".encode()).hexdigest()[:16]
    return f"lake-{digest}"


@dataclass
class Resnapshots:
    spark: SparkSession
    catalog: str

    @property
    def ident(self) -> str:
        return f"{quote(self.catalog)}.{quote(BOOK_NAMESPACE)}.{quote(RESNAPSHOTS_TABLE)}"

    def open(self, ice: Iceberg) -> list[Request]:
        """The requests not filed yet (the namespace exists)."""
        ice.create(self.ident, COLUMNS, {})
        rows = self.spark.sql(f"SELECT id, db, tbl, why FROM {self.ident} WHERE NOT filed ORDER BY id").collect()
        return [Request(str(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in rows]

    def add(self, req: Request) -> None:
        values = ", ".join(sql_string(v) for v in (req.id, req.db, req.table, req.why))
        self.spark.sql(f"MERGE INTO {self.ident} t USING (SELECT * FROM VALUES ({values}, false) "
                       f"AS s(id, db, tbl, why, filed)) s ON t.id = s.id WHEN NOT MATCHED THEN INSERT *")

    def filed(self, req: Request) -> None:
        self.spark.sql(f"UPDATE {self.ident} SET filed = true WHERE id = {sql_string(req.id)}")

