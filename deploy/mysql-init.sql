-- The least privileges binlake needs: read the binlog (REPLICATION SLAVE), see positions
-- (REPLICATION CLIENT), read tables for snapshots (SELECT) and write the snapshot
-- watermarks into its own schema (`binlake`.`watermarks`, see BINLAKE_WATERMARK_TABLE).
-- The user itself comes from MYSQL_USER / MYSQL_PASSWORD (the compose file, deploy/.env).
-- Runs once, on an empty data directory, on MySQL 8.4 and 9.7 alike (the privilege names are
-- the same in both; the default login, caching_sha2_password, needs no change here).
GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO 'binlake'@'%';
GRANT CREATE, INSERT, UPDATE ON `binlake`.* TO 'binlake'@'%';
CREATE DATABASE IF NOT EXISTS shop;
