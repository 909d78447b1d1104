package pgsql_test

import (
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/stores/internal/pgsql"
	"github.com/idemgo/idem/stores/internal/sqlguard"
)

func TestParseTable(t *testing.T) {
	for _, c := range []struct {
		in    string
		want  pgsql.Table
		ident string
	}{
		{"idempotency_keys", pgsql.Table{Name: "idempotency_keys"}, `"idempotency_keys"`},
		{"Billing.Keys_2", pgsql.Table{Schema: "Billing", Name: "Keys_2"}, `"Billing"."Keys_2"`},
		{"_a." + strings.Repeat("k", pgsql.MaxTableLen), pgsql.Table{Schema: "_a", Name: strings.Repeat("k", pgsql.MaxTableLen)}, ""},
		{strings.Repeat("s", 63) + ".t", pgsql.Table{Schema: strings.Repeat("s", 63), Name: "t"}, ""},
	} {
		got, err := pgsql.ParseTable(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseTable(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
		if c.ident != "" && got.Ident() != c.ident {
			t.Errorf("%q: Ident() = %s, want %s", c.in, got.Ident(), c.ident)
		}
	}
	for _, bad := range []string{"", "a.b.c", "1table", "my-table", `a"b`, "a b", ".t", "s.", "t;DROP",
		strings.Repeat("k", pgsql.MaxTableLen+1), strings.Repeat("s", 64) + ".t", "é"} {
		if got, err := pgsql.ParseTable(bad); err == nil {
			t.Errorf("ParseTable(%q) = %+v, want an error", bad, got)
		} else if !strings.HasPrefix(err.Error(), "table name ") {
			t.Errorf("ParseTable(%q): %v, want an error that starts with the name, without a package prefix", bad, err)
		}
	}
}

func TestSchemaSQL(t *testing.T) {
	raw, err := fs.ReadFile(pgsql.Migrations, pgsql.MigrationFile)
	if err != nil {
		t.Fatal(err)
	}
	def := pgsql.Table{Schema: "public", Name: pgsql.DefaultTable}.SchemaSQL()
	want := strings.NewReplacer("public.idempotency_keys", `"public"."idempotency_keys"`,
		"idempotency_keys_lease_expires_at_idx", `"idempotency_keys_lease_expires_at_idx"`,
		"idempotency_keys_expires_at_idx", `"idempotency_keys_expires_at_idx"`).Replace(string(raw))
	if def != want {
		t.Errorf("the default table's schema is not the migration file with its names quoted:\n%s", def)
	}
	for _, want := range []string{"PRIMARY KEY (principal, key)", "headers     bytea", "WHERE state = 'in_progress'"} {
		if !strings.Contains(def, want) {
			t.Errorf("the default table's schema lacks %q", want)
		}
	}
	// PostgreSQL parses each CHECK anew on every INSERT and UPDATE; Claim
	// holds the bounds instead (storetest's ClaimBounds).
	if strings.Contains(def, "CHECK (") {
		t.Error("the schema has a CHECK constraint")
	}
	ddl := pgsql.Table{Schema: "billing", Name: "keys"}.SchemaSQL()
	for _, want := range []string{`CREATE TABLE IF NOT EXISTS "billing"."keys" (`, `"keys_lease_expires_at_idx"`,
		`"keys_expires_at_idx"`, `ON "billing"."keys" (expires_at)`} {
		if !strings.Contains(ddl, want) {
			t.Errorf("schema for billing.keys lacks %s", want)
		}
	}
	if n := strings.Count(ddl, "CREATE "); n != 3 {
		t.Errorf("schema has %d CREATE statements, want 3", n)
	}
	// Only the file's comments still say idempotency_keys.
	for _, line := range strings.Split(ddl, "\n") {
		if strings.Contains(line, "idempotency_keys") && !strings.HasPrefix(strings.TrimSpace(line), "--") {
			t.Errorf("default name left in: %s", line)
		}
	}
}

func TestStatements(t *testing.T) {
	tb := pgsql.Table{Schema: "s", Name: "t"}
	bin := pgsql.New(tb, pgsql.Options{LockTimeout: 1500 * time.Microsecond, StatementTimeout: 7 * time.Second})
	text := pgsql.New(tb, pgsql.Options{LockTimeout: time.Second, StatementTimeout: time.Second, TextFormats: true})
	if !strings.Contains(bin.Prelude, "'lock_timeout', '2ms'") || !strings.Contains(bin.Prelude, "'statement_timeout', '7000ms'") {
		t.Errorf("timeouts not pinned, rounded up to milliseconds: %s", bin.Prelude)
	}
	if strings.Contains(bin.Prelude, "TimeZone") || !strings.Contains(text.Prelude, "'TimeZone', 'UTC'") ||
		!strings.Contains(text.Prelude, "'bytea_output', 'hex'") {
		t.Errorf("text formats pinned only with TextFormats:\n%s\n%s", bin.Prelude, text.Prelude)
	}
	// With SendTimes no statement returns a time as text: bytea_output is
	// the only format left to pin, and every time goes through
	// timestamptz_send.
	send := pgsql.New(tb, pgsql.Options{LockTimeout: time.Second, StatementTimeout: time.Second, TextFormats: true, SendTimes: true})
	if strings.Contains(send.Prelude, "TimeZone") || strings.Contains(send.Prelude, "DateStyle") ||
		strings.Contains(send.Prelude, "IntervalStyle") || !strings.Contains(send.Prelude, "'bytea_output', 'hex'") {
		t.Errorf("SendTimes pins bytea_output alone: %s", send.Prelude)
	}
	for name, q := range map[string]string{"ClaimRead": send.ClaimRead, "Takeover": send.Takeover, "Replace": send.Replace,
		"Reuse": send.Reuse, "Get": send.Get, "ListStale": send.ListStale} {
		if strings.Contains(q, pgsql.RecordCols) || strings.Count(q, "pg_catalog.timestamptz_send(") < 4 {
			t.Errorf("%s with SendTimes returns a time as it is:\n%s", name, q)
		}
	}
	for _, p := range []string{bin.ClaimPrelude, bin.DurablePrelude} {
		if !strings.HasPrefix(p, bin.Prelude) {
			t.Errorf("%q does not extend the prelude", p)
		}
	}
	if !strings.Contains(bin.ClaimPrelude, "'synchronous_commit', 'off'") || !strings.Contains(bin.DurablePrelude, pgsql.DurableCommit) {
		t.Errorf("claim preludes: %q, %q", bin.ClaimPrelude, bin.DurablePrelude)
	}
	if !strings.Contains(bin.SettleCheck, pgsql.DurableCommit) || !strings.Contains(bin.SettleCheck, pgsql.TxEndedMarker) {
		t.Errorf("settle check: %s", bin.SettleCheck)
	}
	if !strings.Contains(bin.Settle, pgsql.LeaseLostMarker) {
		t.Errorf("settle: %s", bin.Settle)
	}
	named := map[string]string{"Claim": bin.Claim, "ClaimRead": bin.ClaimRead, "Takeover": bin.Takeover, "Replace": bin.Replace,
		"Reuse": bin.Reuse, "Release": bin.Release, "Keep": bin.Keep, "Get": bin.Get, "Purge": bin.Purge,
		"ListStale": bin.ListStale, "Stats": bin.Stats, "Settle": bin.Settle}
	for name, q := range named {
		if !strings.Contains(q, ` "s"."t"`) {
			t.Errorf("%s does not name the table: %s", name, q)
		}
		// The store's own statements are single statements that pass its
		// own guard, whichever quoting the session uses.
		if v := sqlguard.Inspect(sqlguard.PostgreSQL, q); v.Refused != "" || !v.Single || v.Ops != nil {
			t.Errorf("%s reads as %+v", name, v)
		}
	}
	for _, name := range []string{"Takeover", "Replace", "Reuse", "Get", "ListStale"} {
		if !strings.Contains(named[name], pgsql.RecordCols) {
			t.Errorf("%s does not return RecordCols", name)
		}
	}
	for peer, setup := range map[bool]string{false: bin.BeginSetup, true: bin.BeginPeerSetup} {
		if !strings.Contains(setup, "pg_catalog.set_config('"+pgsql.LeaseSetting+"', $1, true)") ||
			strings.Contains(setup, "pg_catalog.set_config('tcp_user_timeout', '15000', false)") != peer || !strings.Contains(setup, pgsql.SyncSetting) {
			t.Errorf("BeginSetup (peer %v): %s", peer, setup)
		}
		if v := sqlguard.Inspect(sqlguard.PostgreSQL, setup); v.Refused != "" || !v.Single || v.Ops != nil {
			t.Errorf("BeginSetup (peer %v) reads as %+v", peer, v)
		}
	}
	if !strings.Contains(bin.SettleCheck, "pg_catalog.set_config('tcp_user_timeout', '15000', false)") {
		t.Errorf("SettleCheck does not set the dead-peer settings: %s", bin.SettleCheck)
	}
}

func TestDeadPeerFor(t *testing.T) {
	for _, c := range []struct {
		statement time.Duration
		want      pgsql.DeadPeer
		total     time.Duration
	}{
		{4 * time.Second, pgsql.DeadPeer{Idle: 4, Interval: 1, Count: 4, UserTimeout: 8000}, 8 * time.Second},
		{time.Millisecond, pgsql.DeadPeer{Idle: 1, Interval: 1, Count: 4, UserTimeout: 5000}, 5 * time.Second},
		{10*time.Second + 1, pgsql.DeadPeer{Idle: 11, Interval: 3, Count: 4, UserTimeout: 23000}, 23 * time.Second},
	} {
		got := pgsql.DeadPeerFor(c.statement)
		if got != c.want || got.Total() != c.total {
			t.Errorf("DeadPeerFor(%v) = %+v (%v), want %+v (%v)", c.statement, got, got.Total(), c.want, c.total)
		}
	}
}

func TestDiagnose(t *testing.T) {
	good := []string{"principal:text", "key:varchar", "fingerprint:bytea", "state:text", "lease_token:text",
		"request_id:text", "nonce:text", "created_at:timestamptz", "locked_at:timestamptz",
		"lease_expires_at:timestamptz", "expires_at:timestamptz", "uncertain:bool", "status:int8",
		"headers:bytea", "body:bytea", "extra:jsonb"}
	if m, w := pgsql.Diagnose(good, true, nil); m != nil || w != nil {
		t.Errorf("a usable table: missing %v, wrong %v", m, w)
	}
	bad := slices.DeleteFunc(slices.Clone(good), func(c string) bool { return strings.HasPrefix(c, "nonce:") })
	for i, c := range bad {
		if c == "headers:bytea" {
			bad[i] = "headers:jsonb"
		}
	}
	m, w := pgsql.Diagnose(bad, false, []string{"DELETE"})
	if want := []string{"column nonce", "unique index on (principal, key)", "privilege DELETE"}; !slices.Equal(m, want) {
		t.Errorf("missing %v, want %v", m, want)
	}
	if want := []string{"headers: jsonb, want bytea"}; !slices.Equal(w, want) {
		t.Errorf("wrong types %v, want %v", w, want)
	}
}

func TestParseLSN(t *testing.T) {
	for _, c := range []struct {
		in   string
		want pgsql.LSN
	}{
		{"0/0", 0}, {"16/B374D848", 0x16_B374D848}, {"FFFFFFFF/FFFFFFFF", 1<<64 - 1},
	} {
		got, err := pgsql.ParseLSN(c.in)
		if err != nil || got != c.want || got.String() != c.in {
			t.Errorf("ParseLSN(%q) = %v (%s), %v; want %v", c.in, uint64(got), got, err, uint64(c.want))
		}
	}
	for _, bad := range []string{"", "16", "16/", "/1", "G/1", "1/100000000", "-1/1"} {
		if got, err := pgsql.ParseLSN(bad); err == nil {
			t.Errorf("ParseLSN(%q) = %v, want an error", bad, got)
		}
	}
}

func TestParseTextArray(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"{}", []string{}},
		{"{a}", []string{"a"}},
		{"{principal:text,key:text,status:int4}", []string{"principal:text", "key:text", "status:int4"}},
		{`{"a b:text","x,y:int4",plain,"q\"uote\\:text",""}`, []string{"a b:text", "x,y:int4", "plain", `q"uote\:text`, ""}},
	} {
		got, err := pgsql.ParseTextArray(c.in)
		if err != nil || !slices.Equal(got, c.want) || got == nil {
			t.Errorf("ParseTextArray(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "{", "}", "a", "{a,}", "{,a}", "{NULL}", `{"a}`, `{"a"b}`, "{{a}}"} {
		if got, err := pgsql.ParseTextArray(bad); err == nil {
			t.Errorf("ParseTextArray(%q) = %q, want an error", bad, got)
		}
	}
}

// TestOneStatementForms: the one-statement forms run their prelude in a CTE
// the statement reads from, keep the statement's text and parameters, and
// refuse a statement of another shape.
func TestOneStatementForms(t *testing.T) {
	s := pgsql.New(pgsql.Table{Schema: "s", Name: "t"}, pgsql.Options{LockTimeout: time.Second, StatementTimeout: time.Second})
	claim := s.OneClaim(s.ClaimPrelude)
	for _, want := range []string{"WITH cfg AS (" + s.ClaimPrelude + "),", "SELECT $1, $2, $3, 'in_progress', $4, $5, $7,",
		" FROM cfg\nON CONFLICT (principal, key) DO NOTHING\nRETURNING 1)",
		"SELECT one.inserted, " + pgsql.RecordCols + ", pg_catalog.now()\nFROM (SELECT EXISTS (SELECT FROM ins) AS inserted) AS one LEFT JOIN \"s\".\"t\" ON principal OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2"} {
		if !strings.Contains(claim, want) {
			t.Errorf("OneClaim lacks %q:\n%s", want, claim)
		}
	}
	for _, c := range []struct{ got, stmt, join, sep string }{
		{pgsql.OneUpdate(s.Prelude, s.Takeover), s.Takeover, "\nFROM cfg\nWHERE ", "\nWHERE "},
		{pgsql.OneUpdate(s.Prelude, s.Release), s.Release, "\nFROM cfg\nWHERE ", "\nWHERE "},
		{pgsql.OneSelect(s.Prelude, s.Get), s.Get, " FROM cfg, ", " FROM "},
		{pgsql.OneSelect(s.Prelude, s.ListStale), s.ListStale, " FROM cfg, ", " FROM "},
	} {
		rest, ok := strings.CutPrefix(c.got, "WITH cfg AS ("+s.Prelude+")\n")
		if !ok || strings.Replace(rest, c.join, c.sep, 1) != c.stmt {
			t.Errorf("one-statement form of\n%s\nis\n%s", c.stmt, c.got)
		}
	}
	settle := s.OneSettle("SELECT " + pgsql.DurableCommit)
	if want := strings.Replace(strings.Replace(s.Settle, "WITH u AS (", "WITH cfg AS (SELECT "+pgsql.DurableCommit+"),\nu AS (", 1),
		"\n\tWHERE ", "\n\tFROM cfg\n\tWHERE ", 1); settle != want {
		t.Errorf("one-statement form of\n%s\nis\n%s", s.Settle, settle)
	}
	if want := "SET LOCAL lock_timeout = '1000ms';\nSET LOCAL statement_timeout = '1000ms'"; s.LocalPins != want {
		t.Errorf("LocalPins = %q, want %q", s.LocalPins, want)
	}
	for name, f := range map[string]func(){
		"OneSettle of another set": func() { pgsql.Statements{Settle: s.Release}.OneSettle(s.Prelude) },
		"OneUpdate of a SELECT":    func() { pgsql.OneUpdate(s.Prelude, s.Get) },
		"OneSelect of an UPDATE":   func() { pgsql.OneSelect(s.Prelude, s.Keep) },
		"OneClaim of another set":  func() { pgsql.Statements{Claim: "INSERT", ClaimRead: "SELECT 1"}.OneClaim(s.Prelude) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s did not panic", name)
				}
			}()
			f()
		}()
	}
}
