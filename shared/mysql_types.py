"""MySQL/MariaDB column type names, by family, as the envelope's schema spells them (DESIGN §4)."""

from __future__ import annotations

from typing import Final

INTEGERS: Final = ("tinyint", "smallint", "mediumint", "int", "bigint")
TEXTS: Final = ("char", "varchar", "tinytext", "text", "mediumtext", "longtext")
BINARIES: Final = ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob")
SPATIAL: Final = ("geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
                  "geometrycollection")
