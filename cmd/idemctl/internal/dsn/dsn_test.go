package dsn_test

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/idemgo/idem/cmd/idemctl/internal/dsn"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		raw      string
		kind     dsn.Kind // given with --store; empty: by shape
		want     dsn.Kind
		driver   string
		redacted string
	}{
		{raw: "postgres://u:s3cret@h:5432/db?sslmode=disable", want: dsn.Postgres,
			driver: "postgres://u:s3cret@h:5432/db?sslmode=disable", redacted: "postgres://u:xxxxx@h:5432/db?sslmode=disable"},
		{raw: "postgresql://u@h/db", want: dsn.Postgres, driver: "postgresql://u@h/db", redacted: "postgresql://u@h/db"},
		{raw: "postgres://h/db?password=s3cret&sslmode=disable", want: dsn.Postgres,
			driver: "postgres://h/db?password=s3cret&sslmode=disable", redacted: "postgres://h/db?password=xxxxx&sslmode=disable"},
		{raw: "host=h user=u password=s3cret dbname=db", want: dsn.Postgres,
			driver: "host=h user=u password=s3cret dbname=db", redacted: "host=h user=u password=xxxxx dbname=db"},
		{raw: "host=h password = 's3 c\\'ret' dbname=db", want: dsn.Postgres,
			driver: "host=h password = 's3 c\\'ret' dbname=db", redacted: "host=h password = xxxxx dbname=db"},
		{raw: "dbname=test", kind: dsn.Postgres, want: dsn.Postgres, driver: "dbname=test", redacted: "dbname=test"},
		{raw: "mysql://root:s3cret@127.0.0.1/test?parseTime=true", want: dsn.MySQL,
			driver: "root:s3cret@tcp(127.0.0.1:3306)/test?parseTime=true", redacted: "mysql://root:xxxxx@127.0.0.1/test?parseTime=true"},
		{raw: "root:s3cret@tcp(127.0.0.1:3306)/test?parseTime=true&loc=UTC", want: dsn.MySQL,
			driver: "root:s3cret@tcp(127.0.0.1:3306)/test?parseTime=true&loc=UTC", redacted: "root:xxxxx@tcp(127.0.0.1:3306)/test?parseTime=true&loc=UTC"},
		{raw: "root@tcp(127.0.0.1:3306)/test", want: dsn.MySQL, driver: "root@tcp(127.0.0.1:3306)/test", redacted: "root@tcp(127.0.0.1:3306)/test"},
		{raw: "app:p@ss:w/rd@unix(/run/mysqld/mysqld.sock)/app", want: dsn.MySQL,
			driver: "app:p@ss:w/rd@unix(/run/mysqld/mysqld.sock)/app", redacted: "app:xxxxx@unix(/run/mysqld/mysqld.sock)/app"},
		{raw: "tcp(db:3306)/app", want: dsn.MySQL, driver: "tcp(db:3306)/app", redacted: "tcp(db:3306)/app"},
		{raw: "/app", kind: dsn.MySQL, want: dsn.MySQL, driver: "/app", redacted: "/app"},
		{raw: "sqlite:/var/lib/idem.db", want: dsn.SQLite, driver: "/var/lib/idem.db", redacted: "sqlite:/var/lib/idem.db"},
		{raw: "sqlite:///var/lib/idem.db", want: dsn.SQLite, driver: "/var/lib/idem.db", redacted: "sqlite:///var/lib/idem.db"},
		{raw: "/var/lib/idem.db", kind: dsn.SQLite, want: dsn.SQLite, driver: "/var/lib/idem.db", redacted: "/var/lib/idem.db"},
		{raw: "redis://:s3cret@127.0.0.1:6379/0", want: dsn.Redis, driver: "redis://:s3cret@127.0.0.1:6379/0", redacted: "redis://:xxxxx@127.0.0.1:6379/0"},
		{raw: "rediss://default:s3cret@cache:6380", want: dsn.Redis, driver: "rediss://default:s3cret@cache:6380", redacted: "rediss://default:xxxxx@cache:6380"},
		{raw: "redis://127.0.0.1:6379/0", want: dsn.Redis, driver: "redis://127.0.0.1:6379/0", redacted: "redis://127.0.0.1:6379/0"},
	} {
		d, err := dsn.Parse(tc.raw, tc.kind)
		if err != nil {
			t.Errorf("Parse(%q, %q): %v", tc.raw, tc.kind, err)
			continue
		}
		if d.Kind != tc.want || d.Driver != tc.driver || d.Redacted != tc.redacted {
			t.Errorf("Parse(%q, %q) = %s %q %q, want %s %q %q", tc.raw, tc.kind, d.Kind, d.Driver, d.Redacted, tc.want, tc.driver, tc.redacted)
		}
		if strings.Contains(d.Redacted, "s3") {
			t.Errorf("Parse(%q).Redacted = %q holds the password", tc.raw, d.Redacted)
		}
		// go-sql-driver reads the password Redacted masked.
		if d.Kind == dsn.MySQL {
			if cfg, err := mysql.ParseDSN(d.Driver); err != nil || strings.Contains(tc.redacted, dsn.Mask) != (cfg.Passwd != "") {
				t.Errorf("the driver DSN %q does not parse with its password: %+v, %v", d.Driver, cfg, err)
			}
		}
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		kind dsn.Kind
	}{
		{raw: ""},
		{raw: "nothing"},
		{raw: "ftp://u:s3cret@host/x"},
		{raw: "sqlite:"},
		{raw: "/var/lib/idem.db"}, // a path needs sqlite: or --store sqlite
		{raw: "postgres://u:s3cret@h:port/db"},
		{raw: "postgres://u:s3cret@h/db%zz"},
		{raw: "mysql://u:s3cret@h:3306/"},
		{raw: "mysql://u:s3cret@h:3306/db", kind: dsn.Postgres},
		{raw: "redis://:s3cret@h:6379/0", kind: dsn.MySQL},
		{raw: "host=h password=s3cret", kind: dsn.Redis},
		{raw: "host=h password=s3cret extra", kind: dsn.Postgres},
		{raw: "host=h password='s3cret", kind: dsn.Postgres},
		{raw: "root:s3cret@tcp(127.0.0.1:3306/test", kind: dsn.MySQL},
		{raw: "root:s3cret@tcp(h)/db?timeout=soon", kind: dsn.MySQL},
		{raw: "postgres://u:s3cret@h/db", kind: "oracle"},
	} {
		_, err := dsn.Parse(tc.raw, tc.kind)
		if !errors.Is(err, dsn.ErrInvalid) {
			t.Errorf("Parse(%q, %q): %v, want ErrInvalid", tc.raw, tc.kind, err)
			continue
		}
		if strings.Contains(err.Error(), "s3") {
			t.Errorf("Parse(%q, %q): %q holds the password", tc.raw, tc.kind, err)
		}
	}
}

// A driver's error may quote the DSN, or the driver's own form of it:
// Scrub takes the password out of either, and keeps the error's chain.
func TestScrub(t *testing.T) {
	sentinel := errors.New("connection refused")
	for _, tc := range []struct{ raw, pw string }{
		{"postgres://u:s3cr%40t@h:5432/db", "s3cr@t"},
		{"postgres://h/db?password=s3cr%40t", "s3cr@t"},
		{"host=h user=u password='s3cr@t x'", "s3cr@t x"},
		{"mysql://root:s3cr%40t@127.0.0.1:3306/test", "s3cr@t"},
		{"root:s3cr@t@tcp(127.0.0.1:3306)/test", "s3cr@t"},
		{"redis://:s3cr%40t@127.0.0.1:6379/0", "s3cr@t"},
	} {
		raw := tc.raw
		d, err := dsn.Parse(raw, "")
		if err != nil {
			t.Fatalf("Parse(%q): %v", raw, err)
		}
		for _, e := range []error{
			fmt.Errorf("connect %s: %w", raw, sentinel),
			fmt.Errorf("dial %q: %w", d.Driver, sentinel),
			fmt.Errorf("auth with %s failed: %w", tc.pw, sentinel),
			&url.Error{Op: "parse", URL: raw, Err: sentinel},
		} {
			got := d.Scrub(e)
			if msg := got.Error(); strings.Contains(msg, "s3cr") {
				t.Errorf("Scrub(%q) = %q holds the password", e, msg)
			}
			if !errors.Is(got, sentinel) {
				t.Errorf("Scrub(%q) lost the chain", e)
			}
		}
		plain := errors.New("no such table")
		if d.Scrub(plain) != plain || d.Scrub(nil) != nil {
			t.Errorf("Scrub changed an error without a password")
		}
	}
}

func TestRedact(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"connect postgres://u:s3cret@h/db: refused", "connect postgres://u:xxxxx@h/db: refused"},
		{`dial "redis://:s3cret@h:6379/0"`, `dial "redis://:xxxxx@h:6379/0"`},
		{"host=h password=s3cret dbname=db", "host=h password=xxxxx dbname=db"},
		{"host=h PASSWORD = 's3 cret' dbname=db", "host=h PASSWORD = xxxxx dbname=db"},
		{"postgres://h/db?sslmode=disable&password=s3cret", "postgres://h/db?sslmode=disable&password=xxxxx"},
		{"open root:s3cret@tcp(127.0.0.1:3306)/test?parseTime=true", "open root:xxxxx@tcp(127.0.0.1:3306)/test?parseTime=true"},
		{"open root:s3cret@/test", "open root:xxxxx@/test"},
		{"dial tcp 127.0.0.1:5432: connect: connection refused", "dial tcp 127.0.0.1:5432: connect: connection refused"},
		{"password authentication failed for user \"u\"", "password authentication failed for user \"u\""},
	} {
		if got := dsn.Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// FuzzScrub builds each form of DSN around a password and checks that
// neither Redacted nor a scrubbed error quoting the DSN holds it.
func FuzzScrub(f *testing.F) {
	for _, s := range []string{"s3cret", "p@ss/w:rd", "a b'c\\d", "%41", "xxxxx!"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, pw string) {
		if len(pw) < 3 || strings.ContainsAny(pw, "\x00\n") {
			t.Skip()
		}
		quoted := "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw) + "'"
		forms := []string{
			"postgres://" + url.UserPassword("app", pw).String() + "@db.internal:5432/payments?sslmode=disable",
			"postgres://db.internal/payments?" + url.Values{"password": {pw}}.Encode(),
			"host=db.internal user=app password=" + quoted + " dbname=payments",
			"mysql://" + url.UserPassword("app", pw).String() + "@db.internal:3306/payments",
			"redis://" + url.UserPassword("", pw).String() + "@cache.internal:6379/0",
		}
		if !strings.ContainsAny(pw, "/ \t") {
			forms = append(forms, "app:"+pw+"@tcp(db.internal:3306)/payments?parseTime=true")
		}
		for _, raw := range forms {
			template := strings.Replace(raw, pw, "", 1)
			if strings.Contains(template, pw) || strings.Contains(dsn.Mask, pw) {
				continue // the password is part of the rest: nothing to tell apart
			}
			d, err := dsn.Parse(raw, "")
			if err != nil {
				if strings.Contains(err.Error(), pw) {
					t.Fatalf("Parse(%q): %q holds the password", raw, err)
				}
				continue
			}
			if strings.Contains(d.Redacted, pw) {
				t.Fatalf("Parse(%q).Redacted = %q holds the password", raw, d.Redacted)
			}
			for _, e := range []error{fmt.Errorf("connect %s: refused", raw), fmt.Errorf("connect %q: refused", d.Driver)} {
				if msg := d.Scrub(e).Error(); strings.Contains(msg, pw) {
					t.Fatalf("Scrub(%q) = %q holds the password", e, msg)
				}
			}
		}
	})
}
