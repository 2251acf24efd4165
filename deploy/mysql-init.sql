-- The least privileges binlake needs: read the binlog (REPLICATION SLAVE), see positions
-- (REPLICATION CLIENT), read tables for snapshots (SELECT) and write the snapshot
-- watermarks into its own schema (`binlake`.`watermarks`, see BINLAKE_WATERMARK_TABLE).
-- The user itself comes from MYSQL_USER / MYSQL_PASSWORD (the compose file, deploy/.env).
GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO 'binlake'@'%';
GRANT CREATE, INSERT, UPDATE ON `binlake`.* TO 'binlake'@'%';
CREATE DATABASE IF NOT EXISTS shop;
