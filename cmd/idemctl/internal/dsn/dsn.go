// Package dsn parses idemctl's --dsn into the store it names and the
// connection string its driver takes, and keeps passwords out of every
// message: Redacted is the DSN to show, Scrub removes the password from an
// error's text, Redact from any text.
//
// The forms accepted, by their shape, or by the kind given explicitly:
//
//	postgres://user:pass@host:5432/db?…, postgresql://…   PostgreSQL (URL)
//	host=h user=u password=p dbname=db …                  PostgreSQL (key=value)
//	mysql://user:pass@host:3306/db?…                      MySQL or MariaDB (URL)
//	user:pass@tcp(host:3306)/db?…                         MySQL or MariaDB (go-sql-driver)
//	sqlite:PATH                                           SQLite
//	redis://:pass@host:6379/0, rediss://…                 Redis
//
// With an explicit Kind, a go-sql-driver DSN needs no protocol or user to
// be recognised, and SQLite also takes a bare PATH.
package dsn

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// Kind is the store a DSN names.
type Kind string

// The kinds of store.
const (
	Postgres Kind = "postgres" // idempgx
	MySQL    Kind = "mysql"    // idemgorm on MySQL or MariaDB
	SQLite   Kind = "sqlite"   // idemgorm on SQLite
	Redis    Kind = "redis"    // idemredis
)

// Kinds lists the kinds in the order the help text names them.
var Kinds = []Kind{Postgres, MySQL, SQLite, Redis}

// ErrInvalid is wrapped by every error of Parse: the DSN is not one of the
// accepted forms, or not the form its kind takes. Its text never holds the
// password.
var ErrInvalid = errors.New("invalid DSN")

// Mask replaces a password in the redacted forms.
const Mask = "xxxxx"

// DSN is a parsed --dsn.
type DSN struct {
	// Kind is the store it names.
	Kind Kind
	// Driver is the connection string in the driver's own form: pgx's URL
	// or key=value string as given, go-sql-driver's DSN (a mysql:// URL
	// converted), the SQLite file path, go-redis's URL.
	Driver string
	// Redacted is the DSN as given with its passwords replaced by Mask,
	// for messages.
	Redacted string
	raw      string
	secrets  []string // the passwords, as written and as decoded
}

// Parse parses raw. kind is the store it names, or empty to recognise it
// by its shape (see the package comment).
func Parse(raw string, kind Kind) (DSN, error) {
	d, err := parse(raw, kind)
	if err != nil {
		// A failed parse may not have found the password: the error is
		// built without raw, and scrubbed of what it did find.
		return DSN{}, fmt.Errorf("%w: %s", ErrInvalid, d.scrub(err.Error()))
	}
	return d, nil
}

func parse(raw string, kind Kind) (DSN, error) {
	d := DSN{raw: raw}
	if strings.TrimSpace(raw) == "" {
		return d, errors.New("empty")
	}
	scheme := ""
	if i := strings.Index(raw, "://"); i > 0 && schemeRE.MatchString(raw[:i]) {
		scheme = strings.ToLower(raw[:i])
	} else if strings.HasPrefix(strings.ToLower(raw), "sqlite:") {
		scheme = "sqlite"
	}
	if kind == "" {
		switch {
		case scheme == "postgres", scheme == "postgresql", scheme == "" && keyValueRE.MatchString(raw):
			kind = Postgres
		case scheme == "mysql", scheme == "" && mysqlShapeRE.MatchString(raw):
			kind = MySQL
		case scheme == "sqlite":
			kind = SQLite
		case scheme == "redis", scheme == "rediss":
			kind = Redis
		case scheme != "":
			return d, fmt.Errorf("scheme %s:// is none of postgres://, postgresql://, mysql://, sqlite:, redis://, rediss://", scheme)
		default:
			return d, errors.New("not a form idemctl recognises (postgres://…, host=… key=value, mysql://…, " +
				"user:pass@tcp(host:3306)/db, sqlite:PATH, redis://…); --store names the kind")
		}
	}
	d.Kind = kind
	var err error
	switch kind {
	case Postgres:
		err = d.postgres(scheme)
	case MySQL:
		err = d.mysql(scheme)
	case SQLite:
		err = d.sqlite(scheme)
	case Redis:
		err = d.redis(scheme)
	default:
		return d, fmt.Errorf("unknown store %q (want %s)", string(kind), kindList())
	}
	return d, err
}

func kindList() string {
	s := make([]string, len(Kinds))
	for i, k := range Kinds {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

var (
	schemeRE   = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.\-]*$`)
	keyValueRE = regexp.MustCompile(`^\s*[A-Za-z_][A-Za-z0-9_]*\s*=`)
	// mysqlShapeRE is go-sql-driver's [user[:password]@][net[(addr)]]/dbname[?params]
	// with a user or a protocol before the last slash, which a path has not.
	mysqlShapeRE = regexp.MustCompile(`^(?:.*@(?:tcp[46]?|udp[46]?|unix)?(?:\(.*\))?|(?:tcp[46]?|udp[46]?|unix)\(.*\))/[^/]*$`)
)

// addSecret records a password, as written and in its decoded and
// escaped forms, for scrub.
func (d *DSN) addSecret(written string, more ...string) {
	for _, s := range append([]string{written, url.QueryEscape(written), url.PathEscape(written)}, more...) {
		if s != "" && !slices.Contains(d.secrets, s) {
			d.secrets = append(d.secrets, s)
		}
	}
}

// parseURL parses a URL DSN and records its passwords: the userinfo's and
// a password query parameter's. A url.Parse error is reported without the
// URL, which it quotes.
func (d *DSN) parseURL() (*url.URL, error) {
	// Before parsing, so that even a URL that does not parse is scrubbed
	// of what looks like its password.
	if m := urlPasswordRE.FindStringSubmatch(d.raw); m != nil {
		d.addSecret(m[2])
		if p, err := url.PathUnescape(m[2]); err == nil {
			d.addSecret(p)
		}
	}
	u, err := url.Parse(d.raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("not a URL: %v", err)
	}
	if u.User != nil {
		if p, ok := u.User.Password(); ok {
			d.addSecret(p)
		}
	}
	red := *u
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			red.User = url.UserPassword(u.User.Username(), Mask)
		}
	}
	if q := u.Query(); q.Has("password") {
		for _, p := range q["password"] {
			d.addSecret(p)
		}
		q.Set("password", Mask)
		red.RawQuery = q.Encode()
	}
	d.Redacted = red.String()
	return u, nil
}

func (d *DSN) postgres(scheme string) error {
	switch scheme {
	case "postgres", "postgresql":
		if _, err := d.parseURL(); err != nil {
			return err
		}
		d.Driver = d.raw
		return nil
	case "":
		red, err := d.keyValue()
		if err != nil {
			return err
		}
		d.Driver, d.Redacted = d.raw, red
		return nil
	}
	return fmt.Errorf("a PostgreSQL DSN is postgres://… or key=value, not %s://", scheme)
}

// keyValue parses a libpq key=value connection string (values bare or in
// single quotes with backslash escapes), records its password, and returns
// the string with the password's value replaced by Mask.
func (d *DSN) keyValue() (string, error) {
	s := d.raw
	var b strings.Builder
	i := 0
	for {
		start := i
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if i == len(s) {
			b.WriteString(s[start:])
			return b.String(), nil
		}
		k := i
		for i < len(s) && s[i] != '=' && !isSpace(s[i]) {
			i++
		}
		key := s[k:i]
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if i == len(s) || s[i] != '=' || key == "" {
			// Not naming the word: it may be the rest of a password that
			// was meant to be quoted.
			return "", errors.New("key=value: a word is not followed by = (quote a value with spaces: password='…')")
		}
		i++
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		v := i
		var value strings.Builder
		if i < len(s) && s[i] == '\'' {
			i++
			closed := false
			for i < len(s) {
				c := s[i]
				if c == '\\' && i+1 < len(s) {
					value.WriteByte(s[i+1])
					i += 2
					continue
				}
				i++
				if c == '\'' {
					closed = true
					break
				}
				value.WriteByte(c)
			}
			if !closed {
				if key == "password" {
					d.addSecret(s[v+1:], value.String())
				}
				return "", errors.New("key=value: a quoted value is not closed")
			}
		} else {
			for i < len(s) && !isSpace(s[i]) {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				value.WriteByte(s[i])
				i++
			}
		}
		b.WriteString(s[start:v])
		if key == "password" {
			d.addSecret(s[v:i], value.String())
			b.WriteString(Mask)
		} else {
			b.WriteString(s[v:i])
		}
	}
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func (d *DSN) mysql(scheme string) error {
	switch scheme {
	case "mysql":
		u, err := d.parseURL()
		if err != nil {
			return err
		}
		d.Driver, err = mysqlFromURL(u)
		return err
	case "":
		// The password is what go-sql-driver reads: from the first colon
		// up to the last @ before the last slash.
		cfg, err := mysql.ParseDSN(d.raw)
		if err != nil {
			if user, pass, ok := strings.Cut(d.raw, ":"); ok && !strings.Contains(user, "@") {
				if j := strings.LastIndex(pass, "@"); j > 0 {
					d.addSecret(pass[:j])
				}
			}
			return fmt.Errorf("go-sql-driver DSN: %v", err)
		}
		d.Driver, d.Redacted = d.raw, d.raw
		if cfg.Passwd != "" {
			d.addSecret(cfg.Passwd)
			d.Redacted = cfg.User + ":" + Mask + strings.TrimPrefix(d.raw, cfg.User+":"+cfg.Passwd)
		}
		return nil
	}
	return fmt.Errorf("a MySQL DSN is mysql://… or user:pass@tcp(host:3306)/db, not %s://", scheme)
}

// mysqlFromURL turns mysql://user:pass@host:port/db?params into
// go-sql-driver's user:pass@tcp(host:port)/db?params.
func mysqlFromURL(u *url.URL) (string, error) {
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr = "tcp", u.Host
	if u.Port() == "" {
		cfg.Addr = u.Hostname() + ":3306"
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if cfg.DBName == "" {
		return "", errors.New("no database in the path (mysql://user@host:3306/DB)")
	}
	if len(u.RawQuery) > 0 {
		params := map[string]string{}
		for k, v := range u.Query() {
			params[k] = v[len(v)-1]
		}
		cfg.Params = params
	}
	return cfg.FormatDSN(), nil
}

func (d *DSN) sqlite(scheme string) error {
	path := d.raw
	switch scheme {
	case "sqlite":
		path = strings.TrimPrefix(d.raw[len("sqlite:"):], "//")
	case "":
	default:
		return fmt.Errorf("a SQLite DSN is sqlite:PATH, not %s://", scheme)
	}
	if path == "" {
		return errors.New("sqlite: needs a file path (sqlite:/var/lib/app/idem.db)")
	}
	d.Driver, d.Redacted = path, d.raw
	return nil
}

func (d *DSN) redis(scheme string) error {
	if scheme != "redis" && scheme != "rediss" {
		return errors.New("a Redis DSN is redis://… or rediss://…")
	}
	if _, err := d.parseURL(); err != nil {
		return err
	}
	d.Driver = d.raw
	return nil
}

// Scrub returns err with every password of d taken out of its text, and
// the DSN as given replaced by Redacted; errors.Is and errors.As still see
// err. It returns err itself when its text holds none of them, and nil
// for nil.
func (d DSN) Scrub(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if clean := d.scrub(msg); clean != msg {
		return &scrubbed{msg: clean, err: err}
	}
	return err
}

// scrub does Scrub's work on a text, and Redact's.
func (d DSN) scrub(s string) string {
	if d.raw != "" && d.Redacted != "" {
		s = strings.ReplaceAll(s, d.raw, d.Redacted)
	}
	// Longest first, so that a password's escaped form is not left half
	// replaced by a shorter form it contains.
	secrets := slices.Clone(d.secrets)
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, p := range secrets {
		s = strings.ReplaceAll(s, p, Mask)
	}
	return Redact(s)
}

// ScrubText returns s with every password of d taken out, and the DSN as
// given replaced by Redacted: Scrub for a text, such as a driver's log line.
func (d DSN) ScrubText(s string) string { return d.scrub(s) }

// RedactError returns err with what Redact finds taken out of its text,
// for an error about a DSN that was not parsed; errors.Is and errors.As
// still see err.
func RedactError(err error) error { return DSN{}.Scrub(err) }

// scrubbed is an error whose text had a password taken out.
type scrubbed struct {
	msg string
	err error
}

func (e *scrubbed) Error() string { return e.msg }
func (e *scrubbed) Unwrap() error { return e.err }

var (
	// urlPasswordRE is the password of a URL's userinfo: from the colon
	// after the user up to the last @ of the run of non-space characters.
	urlPasswordRE = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.\-]*://[^\s/?#@:]*):([^\s]*)@`)
	// keyPasswordRE is a password=value pair (key=value DSN, URL query).
	keyPasswordRE = regexp.MustCompile(`(?i)\b(password|passwd|pwd)(\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)`)
	// sqlDriverPasswordRE is the password of a go-sql-driver DSN:
	// user:password@ followed by a protocol and its address, or the slash.
	// A password starting with a slash is left to Scrub: it would match a
	// URL's "scheme://".
	sqlDriverPasswordRE = regexp.MustCompile(`(^|[\s"'=(,\x60])([^\s:@/"'()\x60]*):((?:[^\s/]\S*)?)@((?:tcp[46]?|udp[46]?|unix)?\(|/)`)
)

// Redact replaces, in any text, what looks like a DSN's password by Mask:
// a URL's userinfo password (postgres://u:p@h, redis://:p@h), a
// password=… pair (key=value, a URL's query), and a go-sql-driver DSN's
// (u:p@tcp(h:3306)/db). It is a net for text whose DSN is not known;
// DSN.Scrub, which knows the passwords, is exact.
func Redact(s string) string {
	s = urlPasswordRE.ReplaceAllString(s, "${1}:"+Mask+"@")
	s = keyPasswordRE.ReplaceAllString(s, "${1}${2}"+Mask)
	s = sqlDriverPasswordRE.ReplaceAllString(s, "${1}${2}:"+Mask+"@${4}")
	return s
}
