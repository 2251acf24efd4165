/* app */ ALTER TABLE t ADD c INT /* x, y */ NOT NULL -- note, z
, DROP d # bye