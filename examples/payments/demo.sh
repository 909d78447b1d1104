#!/usr/bin/env bash
# demo.sh — a curl session against the idem example payments service:
# a first payment, its replay, the same key with a changed body (422), ten
# concurrent retries of a new payment while the handler sleeps (one 201, the
# rest 409 or the replay), and the account's payments (exactly one).
#
#   examples/payments/demo.sh                  # builds the service, runs it on a free port
#   examples/payments/demo.sh -store memory    # extra flags go to the service
#   BASE=http://127.0.0.1:8080 examples/payments/demo.sh
#                                              # use a service you started yourself
#                                              # (with -handler-delay 1s to see the 409s)
#
# Only loopback addresses are accepted. Needs curl and Go (to build).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BASE=${BASE:-}
tmp=$(mktemp -d)
pid=""
cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

if [ -z "$BASE" ]; then
	echo "# building the service"
	(cd "$here" && go build -o "$tmp/payments" .)
	# A fresh SQLite file unless the flags choose another store or a -dsn.
	store=${IDEM_STORE:-sqlite} dsn=()
	prev=""
	for a in "$@"; do
		case "$prev|$a" in
		-store\|* | --store\|*) store=$a ;;
		*\|-store=* | *\|--store=*) store=${a#*=} ;;
		esac
		case "$a" in -dsn | --dsn | -dsn=* | --dsn=*) store=custom ;; esac
		prev=$a
	done
	[ "$store" = sqlite ] && [ -z "${IDEM_DSN:-}" ] && dsn=(-dsn "$tmp/demo.db")
	# The service has no default fingerprint key; a demo on a fresh
	# database can use a fresh one.
	export IDEM_FINGERPRINT_KEY=${IDEM_FINGERPRINT_KEY:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
	"$tmp/payments" -addr 127.0.0.1:0 "${dsn[@]}" -handler-delay 1s "$@" 2>"$tmp/server.log" &
	pid=$!
	for _ in $(seq 1 200); do
		addr=$(sed -n 's/.*msg="payments service listening" addr=\([^ ]*\).*/\1/p' "$tmp/server.log")
		[ -n "$addr" ] && break
		kill -0 "$pid" 2>/dev/null || { cat "$tmp/server.log" >&2; exit 1; }
		sleep 0.05
	done
	[ -n "$addr" ] || { echo "demo: the service did not start" >&2; cat "$tmp/server.log" >&2; exit 1; }
	BASE="http://$addr"
	grep 'payments service listening' "$tmp/server.log" | sed 's/^/# service: /'
else
	case "$BASE" in
	http://127.* | http://localhost[:/]* | http://localhost | "http://[::1]"*) ;;
	*) echo "demo: BASE must be a loopback address (http://127.0.0.1:PORT), got $BASE" >&2; exit 2 ;;
	esac
	BASE=${BASE%/}
fi
curl -fsS "$BASE/healthz" >/dev/null || { echo "demo: $BASE/healthz does not answer" >&2; exit 1; }

run=$(date +%s)-$RANDOM
# Fresh accounts each run, so "exactly one payment" holds on a reused database.
alice="alice-${run##*-}"
bob="bob-${run##*-}"
key1="order-$run"
key2="checkout-$run"
body='{"amount": 1250, "currency": "EUR", "description": "Order #1001"}'

# show prints the curl command, then the status line, the headers that
# matter here and the body.
show() {
	local a line='$ curl'
	for a in "$@"; do
		a=${a//$BASE/\$BASE}
		case "$a" in
		*[[:space:]\"\'\#\&\;\|\*\?]*) line+=" '${a//\'/\'\\\'\'}'" ;;
		*) line+=" $a" ;;
		esac
	done
	printf '\n%s\n' "$line"
	curl -sS -i "$@" | tr -d '\r' |
		grep -v -E '^(Date|Content-Length|Cache-Control|Www-Authenticate):' | sed '/^$/d'
}

echo
echo "## 1. A first payment: 201, the payment written in the idempotency transaction"
show -X POST "$BASE/payments" -H "Authorization: Bearer $alice" -H "Idempotency-Key: $key1" \
	-H 'Content-Type: application/json' -d "$body"

echo
echo "## 2. The client retries (same key, same body): the stored response, Idempotent-Replayed: true"
show -X POST "$BASE/payments" -H "Authorization: Bearer $alice" -H "Idempotency-Key: $key1" \
	-H 'Content-Type: application/json' -d "$body"

echo
echo "## 3. The same key with another body: 422, nothing happens"
show -X POST "$BASE/payments" -H "Authorization: Bearer $alice" -H "Idempotency-Key: $key1" \
	-H 'Content-Type: application/json' -d '{"amount": 9900, "currency": "EUR"}'

echo
echo "## 4. Ten concurrent retries of a new payment while the handler sleeps (-handler-delay):"
echo "##    exactly one 201 runs the handler; the others get 409 (key in use) or, once it committed, the replay"
printf '$ for i in $(seq 1 10); do curl -X POST $BASE/payments -H '"'"'Authorization: Bearer %s'"'"' -H '"'"'Idempotency-Key: %s'"'"' ... & done; wait\n' "$bob" "$key2"
curls=()
for i in $(seq 1 10); do
	curl -sS -o "$tmp/c$i.body" -D "$tmp/c$i.head" -X POST "$BASE/payments" -H "Authorization: Bearer $bob" \
		-H "Idempotency-Key: $key2" -H 'Content-Type: application/json' \
		-d '{"amount": 4200, "currency": "EUR", "description": "Checkout"}' &
	curls+=($!)
done
wait "${curls[@]}"
for i in $(seq 1 10); do
	status=$(head -n 1 "$tmp/c$i.head" | tr -d '\r' | cut -d' ' -f2)
	extra=""
	grep -qi '^Idempotent-Replayed: true' "$tmp/c$i.head" && extra=" (Idempotent-Replayed: true)"
	ra=$(grep -i '^Retry-After:' "$tmp/c$i.head" | tr -d '\r' | cut -d' ' -f2 || true)
	[ -n "$ra" ] && extra=" (Retry-After: $ra)"
	echo "$status$extra"
done | sort | uniq -c

echo
echo "## 5. Once it has committed, a retry gets the stored 201"
show -X POST "$BASE/payments" -H "Authorization: Bearer $bob" -H "Idempotency-Key: $key2" \
	-H 'Content-Type: application/json' -d '{"amount": 4200, "currency": "EUR", "description": "Checkout"}'

echo
echo "## 6. $bob's payments: exactly one"
show "$BASE/payments" -H "Authorization: Bearer $bob"

echo
echo "## 7. No or a malformed bearer token: 401"
show "$BASE/payments"

if [ -n "$pid" ]; then
	echo
	echo "## The service's log: one line per idempotent request, with its outcome"
	grep 'msg=idempotency' "$tmp/server.log" | sed -E 's/^time=[^ ]+ //; s/ duration=[^ ]+//; s/ claim_latency=[^ ]+//'
fi
