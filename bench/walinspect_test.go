package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// walRecords is what pg_walinspect reads between two LSNs for the benchmark
// tables only: every record with a block in a relation of Schema (heap,
// index, TOAST), and every record of a transaction that wrote one (its
// commit). Other databases and other sessions on a shared server write WAL
// in the same range; this filter leaves them out, so the figures repeat
// exactly where the raw LSN difference does not.
const walRecords = `WITH rels AS (
	SELECT pg_catalog.pg_relation_filenode(c.oid)::text AS f
	FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = $3 AND pg_catalog.pg_relation_filenode(c.oid) IS NOT NULL
	UNION
	SELECT pg_catalog.pg_relation_filenode(c.reltoastrelid)::text
	FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = $3 AND c.reltoastrelid <> 0
	UNION
	SELECT pg_catalog.pg_relation_filenode(i.indexrelid)::text
	FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	JOIN pg_catalog.pg_index i ON i.indrelid = c.reltoastrelid
	WHERE n.nspname = $3
), r AS (
	SELECT * FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)
), own AS (
	SELECT r.start_lsn, r.xid FROM r
	WHERE EXISTS (SELECT 1 FROM rels WHERE r.block_ref ~ ('rel \d+/\d+/' || rels.f || '( |,|$)'))
)
SELECT resource_manager || '/' || split_part(record_type, ' ', 1), count(*), sum(record_length), sum(fpi_length),
	count(*) FILTER (WHERE r.xid <> 0)
FROM r
WHERE r.start_lsn IN (SELECT start_lsn FROM own)
	OR (r.xid <> 0 AND r.xid IN (SELECT xid FROM own WHERE xid <> 0))
GROUP BY 1 ORDER BY 3 DESC`

// walStat is one row of walBreakdown: a record type, how many records of it
// and their bytes (record_length, full-page images included).
type walStat struct {
	kind         string
	count, bytes int64
	fpi          int64
	withXID      int64 // records of a transaction that has a transaction id
}

// walBreakdown reads, with pg_walinspect, the WAL the benchmark tables got
// between start and end (LSNs as text). It creates the extension if needed,
// which takes a superuser (the default DSN's postgres).
func walBreakdown(ctx context.Context, admin *pgxpool.Pool, start, end string) ([]walStat, error) {
	if _, err := admin.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_walinspect"); err != nil {
		return nil, fmt.Errorf("pg_walinspect: %w", err)
	}
	if start == end {
		return nil, nil // pg_walinspect refuses an empty range
	}
	// pg_walinspect reads only flushed WAL, and a claim commits without
	// waiting for the flush: wait (at most 5 s) for the WAL writer.
	for i := 0; ; i++ {
		var flushed bool
		if err := admin.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn", end).Scan(&flushed); err != nil {
			return nil, fmt.Errorf("pg_walinspect: %w", err)
		}
		if flushed {
			break
		}
		if i == 50 {
			return nil, fmt.Errorf("pg_walinspect: WAL up to %s not flushed after 5 s", end)
		}
		time.Sleep(100 * time.Millisecond)
	}
	rows, err := admin.Query(ctx, walRecords, start, end, Schema)
	if err != nil {
		return nil, fmt.Errorf("pg_walinspect %s..%s: %w", start, end, err)
	}
	defer rows.Close()
	var out []walStat
	for rows.Next() {
		var s walStat
		if err := rows.Scan(&s.kind, &s.count, &s.bytes, &s.fpi, &s.withXID); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		var flush string
		_ = admin.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn()::text").Scan(&flush)
		return nil, fmt.Errorf("pg_walinspect %s..%s (flushed to %s): %w", start, end, flush, err)
	}
	return out, nil
}

// formatBreakdown renders stats per request (n requests) as a table.
func formatBreakdown(stats []walStat, n int) string {
	var b strings.Builder
	var total int64
	fmt.Fprintf(&b, "| record | per request | bytes per request | of which full-page images |\n|---|---:|---:|---:|\n")
	for _, s := range stats {
		total += s.bytes
		fmt.Fprintf(&b, "| %s | %.2f | %.1f | %.1f |\n", s.kind, float64(s.count)/float64(n), float64(s.bytes)/float64(n), float64(s.fpi)/float64(n))
	}
	fmt.Fprintf(&b, "| total | | %.1f | |\n", float64(total)/float64(n))
	return b.String()
}

// walTransactional is how many records of stats belong to a transaction
// with a transaction id: a statement that wrote (or locked) a row. A page
// prune a read triggers has none.
func walTransactional(stats []walStat) int64 {
	var n int64
	for _, s := range stats {
		n += s.withXID
	}
	return n
}

// walTotal is the bytes of stats.
func walTotal(stats []walStat) int64 {
	var t int64
	for _, s := range stats {
		t += s.bytes
	}
	return t
}
