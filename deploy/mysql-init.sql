-- The least privileges binlake needs: read the binlog (REPLICATION SLAVE), see positions
-- (REPLICATION CLIENT) and read tables for snapshots (SELECT).
CREATE USER IF NOT EXISTS 'binlake'@'%' IDENTIFIED BY 'binlake';
GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO 'binlake'@'%';
CREATE DATABASE IF NOT EXISTS shop;
