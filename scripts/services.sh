#!/usr/bin/env bash
# services.sh makes sure the servers the tests use are up on 127.0.0.1:
# PostgreSQL :5432 (trust auth, databases test/root/postgres), MariaDB :3306
# (root, empty password, database test), Redis :6379 and a three-node Redis
# Cluster on :7001-7003 (IDEM_REDIS_CLUSTER_PORTS), and NATS with JetStream
# :4222 (the examples/ledger consumer). For each one it
# checks the port, starts the server when it is installed but down, installs
# it with apt-get when it is missing, and exits non-zero with a clear message
# when none of that works. Tests never skip a missing service: they fail.
set -euo pipefail

log() { printf 'services: %s\n' "$*" >&2; }
die() { printf 'services: FATAL: %s\n' "$*" >&2; exit 1; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() { # port name seconds
	local i
	for ((i = 0; i < $3 * 4; i++)); do
		port_open "$1" && return 0
		sleep 0.25
	done
	return 1
}

apt_updated=""
apt_install() {
	command -v apt-get >/dev/null || die "$* missing and apt-get is not available: install it by hand"
	[ "$(id -u)" = 0 ] || die "$* missing and not running as root: cannot apt-get install"
	if [ -z "$apt_updated" ]; then
		log "apt-get update"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || die "apt-get update failed"
		apt_updated=1
	fi
	log "apt-get install $*"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2 || die "apt-get install $* failed"
}

PG_MAX_CONNECTIONS=${PG_MAX_CONNECTIONS:-400}

ensure_postgres() {
	if ! port_open 5432; then
		if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
			apt_install postgresql postgresql-client
		fi
		local ver
		ver=$(ls /etc/postgresql | sort -V | tail -n 1)
		local hba="/etc/postgresql/$ver/main/pg_hba.conf"
		if ! grep -Eq '^host[[:space:]]+all[[:space:]]+all[[:space:]]+127\.0\.0\.1/32[[:space:]]+trust' "$hba"; then
			log "PostgreSQL: trusting local TCP connections (test machine only)"
			sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
		fi
		log "starting PostgreSQL $ver"
		pg_ctlcluster --skip-systemctl-redirect "$ver" main start >&2 || pg_ctlcluster "$ver" main start >&2 || true
		wait_port 5432 PostgreSQL 30 || die "PostgreSQL did not come up on 127.0.0.1:5432"
	fi
	command -v psql >/dev/null || apt_install postgresql-client
	# The PostgreSQL stores' tests also start servers of their own
	# (stores/internal/pgsql/pgsqltest), from the server's binaries.
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || apt_install postgresql
	local db
	for db in test root postgres; do
		if ! psql -h 127.0.0.1 -U postgres -d postgres -tAc "select 1 from pg_database where datname='$db'" | grep -q 1; then
			psql -h 127.0.0.1 -U postgres -d postgres -qc "create database \"$db\"" >&2
		fi
	done
	psql -h 127.0.0.1 -U postgres -d postgres -tAc "select 1 from pg_roles where rolname='root'" | grep -q 1 ||
		psql -h 127.0.0.1 -U postgres -d postgres -qc "create role root superuser login" >&2
	psql -h 127.0.0.1 -U postgres -d test -tAc 'select 1' >/dev/null || die "cannot connect to PostgreSQL database test as postgres"
	# make test runs three modules at a time, each with pools and
	# concurrent tests of its own: PostgreSQL's default of 100 connections
	# runs out ("too many clients already").
	local maxconn
	maxconn=$(psql -h 127.0.0.1 -U postgres -d postgres -tAc 'show max_connections')
	if [ "$maxconn" -lt "$PG_MAX_CONNECTIONS" ]; then
		ver=$(ls /etc/postgresql | sort -V | tail -n 1)
		log "PostgreSQL: max_connections $maxconn -> $PG_MAX_CONNECTIONS (restarting the cluster)"
		psql -h 127.0.0.1 -U postgres -d postgres -qc "alter system set max_connections = $PG_MAX_CONNECTIONS" >&2
		pg_ctlcluster --skip-systemctl-redirect "$ver" main restart >&2 || pg_ctlcluster "$ver" main restart >&2 ||
			die "could not restart PostgreSQL $ver to raise max_connections"
		wait_port 5432 PostgreSQL 30 || die "PostgreSQL did not come back on 127.0.0.1:5432"
		maxconn=$(psql -h 127.0.0.1 -U postgres -d postgres -tAc 'show max_connections')
		[ "$maxconn" -ge "$PG_MAX_CONNECTIONS" ] || die "PostgreSQL max_connections is $maxconn after the restart, want $PG_MAX_CONNECTIONS"
	fi
	log "PostgreSQL ok"
}

ensure_mariadb() {
	if ! port_open 3306; then
		if ! command -v mariadbd >/dev/null && [ ! -x /usr/sbin/mariadbd ]; then
			apt_install mariadb-server mariadb-client
		fi
		log "starting MariaDB"
		mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
		start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql --bind-address=127.0.0.1 >&2
		wait_port 3306 MariaDB 60 || die "MariaDB did not come up on 127.0.0.1:3306"
	fi
	command -v mariadb >/dev/null || apt_install mariadb-client
	if ! mariadb -h 127.0.0.1 -uroot -e 'select 1' >/dev/null 2>&1; then
		log "MariaDB: allowing root with an empty password over TCP (test machine only)"
		mariadb -uroot -e "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
			GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
			ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('');
			FLUSH PRIVILEGES;" >&2 || die "cannot configure MariaDB root access through the local socket"
	fi
	mariadb -h 127.0.0.1 -uroot -e 'CREATE DATABASE IF NOT EXISTS test' || die "cannot connect to MariaDB as root"
	log "MariaDB ok"
}

ensure_redis() {
	if ! port_open 6379; then
		command -v redis-server >/dev/null || apt_install redis-server
		log "starting Redis"
		mkdir -p /var/lib/redis /var/log/redis
		redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
			--dir /var/lib/redis --logfile /var/log/redis/ci.log >&2
		wait_port 6379 Redis 20 || die "Redis did not come up on 127.0.0.1:6379"
	fi
	log "Redis ok"
}

# The Redis Cluster the idemredis tests use: three primaries, no replicas, no
# persistence, started from the installed redis-server. It is left alone when
# it is up and healthy; a cluster that is up but not (or no longer) formed is
# reset and created again; a node that is down is started afresh (it kept no
# data). Anything else is fatal.
cluster_ports=(${IDEM_REDIS_CLUSTER_PORTS:-7001 7002 7003})

cluster_healthy() {
	local p info
	for p in "${cluster_ports[@]}"; do
		info=$(redis-cli -h 127.0.0.1 -p "$p" cluster info 2>/dev/null) || return 1
		grep -q '^cluster_state:ok' <<<"$info" || return 1
		grep -q '^cluster_slots_assigned:16384' <<<"$info" || return 1
		grep -q "^cluster_known_nodes:${#cluster_ports[@]}" <<<"$info" || return 1
	done
}

ensure_redis_cluster() {
	command -v redis-server >/dev/null && command -v redis-cli >/dev/null || apt_install redis-server redis-tools
	if cluster_healthy; then
		log "Redis Cluster ok (${cluster_ports[*]})"
		return
	fi
	local p dir started=""
	for p in "${cluster_ports[@]}"; do
		port_open "$p" && continue
		dir=/var/lib/redis-cluster/$p
		rm -rf "$dir" && mkdir -p "$dir" /var/log/redis
		log "starting Redis Cluster node :$p"
		redis-server --daemonize yes --bind 127.0.0.1 --port "$p" --cluster-enabled yes \
			--cluster-config-file "$dir/nodes.conf" --cluster-node-timeout 5000 \
			--save "" --appendonly no --dir "$dir" --logfile "/var/log/redis/cluster-$p.log" >&2
		started=1
	done
	for p in "${cluster_ports[@]}"; do
		wait_port "$p" "Redis Cluster node" 20 || die "Redis Cluster node did not come up on 127.0.0.1:$p (see /var/log/redis/cluster-$p.log)"
		redis-cli -h 127.0.0.1 -p "$p" cluster info >/dev/null 2>&1 ||
			die "127.0.0.1:$p answers but is not a cluster-enabled Redis: stop whatever listens there, or set IDEM_REDIS_CLUSTER_PORTS"
	done
	# Up but not formed, or formed wrongly (a node restarted empty): the
	# nodes keep no data, so reset them all and form the cluster anew.
	local addrs=()
	for p in "${cluster_ports[@]}"; do
		[ -n "$started" ] || log "Redis Cluster unhealthy: resetting node :$p"
		redis-cli -h 127.0.0.1 -p "$p" flushall >/dev/null 2>&1 || true
		redis-cli -h 127.0.0.1 -p "$p" cluster reset hard >/dev/null || die "cannot reset Redis Cluster node :$p"
		addrs+=("127.0.0.1:$p")
	done
	log "creating Redis Cluster ${addrs[*]}"
	redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >&2 ||
		die "redis-cli --cluster create ${addrs[*]} failed"
	local i
	for ((i = 0; i < 80; i++)); do
		cluster_healthy && { log "Redis Cluster ok (${cluster_ports[*]})"; return; }
		sleep 0.25
	done
	die "Redis Cluster on ${cluster_ports[*]} did not reach cluster_state:ok"
}

# NATS with JetStream, for examples/ledger. apt's nats-server package
# (Debian 12: 2.9) has JetStream; its store lives under /var/lib/nats-server.
ensure_nats() {
	if ! port_open 4222; then
		command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || apt_install nats-server
		local bin
		bin=$(command -v nats-server || echo /usr/sbin/nats-server)
		log "starting NATS (JetStream)"
		mkdir -p /var/lib/nats-server /var/log/nats-server
		start-stop-daemon --start --oknodo --background --exec "$bin" -- \
			-a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server/ci.log >&2
		wait_port 4222 NATS 20 || die "NATS did not come up on 127.0.0.1:4222"
	fi
	log "NATS ok"
}

# promtool checks and unit-tests examples/payments/alerts.yml. Debian ships
# it in the prometheus package (which also installs a server we do not start).
ensure_promtool() {
	if ! command -v promtool >/dev/null; then
		apt_install prometheus
		command -v promtool >/dev/null || die "promtool still missing after installing prometheus"
	fi
	log "promtool ok"
}

ensure_postgres
ensure_mariadb
ensure_redis
ensure_redis_cluster
ensure_nats
ensure_promtool
