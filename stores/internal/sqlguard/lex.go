package sqlguard

import "strings"

// tokKind is what the lexer makes of a run of text.
type tokKind uint8

const (
	tokWord   tokKind = iota + 1 // a bare word: keyword or unquoted identifier
	tokQuoted                    // a quoted identifier, text with its quotes
	tokString                    // a string or dollar-quoted literal (no text)
	tokOther                     // a number, a parameter, an operator or punctuation
)

type token struct {
	kind tokKind
	text string // a slice of the query: the word, or the quoted identifier with its quotes
}

// is reports whether t is the bare word w (upper case ASCII), compared
// without regard to ASCII case. Keywords fold ASCII only in every dialect,
// so "COMMİT" or "commıt" are not COMMIT.
func (t token) is(w string) bool {
	if t.kind != tokWord || len(t.text) != len(w) {
		return false
	}
	for i := 0; i < len(w); i++ {
		c := t.text[i]
		if c >= 'a' && c <= 'z' {
			c -= 'a' - 'A'
		}
		if c != w[i] {
			return false
		}
	}
	return true
}

// lexer splits a query into statements under one reading. It is not a
// parser: it finds every ';' the server's own lexer would see outside a
// string, a quoted identifier, a dollar quote or a comment, and the tokens
// between them.
type lexer struct {
	d    Dialect
	r    Reading
	s    string
	i    int
	open bool // the text ended inside a literal or comment
	exec int  // MySQL: depth of /*! … */ comments, whose content the server runs
}

// scanner yields the statements of a query under one reading, each as
// its tokens (white space and comments dropped), empty statements
// skipped. It keeps at most limit tokens of a statement (all when limit is
// 0), in the buffer it was given, so that a caller that only needs the
// first words allocates nothing.
type scanner struct {
	l     lexer
	st    []token
	limit int
	done  bool
}

func newScanner(d Dialect, r Reading, q string, buf []token, limit int) scanner {
	return scanner{l: lexer{d: d, r: r, s: q}, st: buf[:0], limit: limit}
}

// next advances to the next non-empty statement, whose tokens are then in
// s.st until the next call, and reports false after the last one.
func (s *scanner) next() bool {
	s.st = s.st[:0]
	for !s.done {
		t, ok := s.l.next()
		switch {
		case !ok:
			s.done = true
		case t.kind == 0: // white space or a comment
		case t.kind == tokOther && t.text == ";":
			if len(s.st) > 0 {
				return true
			}
		case s.limit == 0 || len(s.st) < s.limit:
			s.st = append(s.st, t)
		}
	}
	return len(s.st) > 0
}

// open reports, once next returned false, whether the query ended inside
// a literal or comment (the server then runs nothing, reporting a syntax
// error; the statements before are reported all the same).
func (s *scanner) open() bool { return s.l.open }

func isSpace(c byte) bool {
	// PostgreSQL 16 added \v; older servers reject it outside literals, so
	// counting it as space loses nothing.
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

// isWordCont reports whether c continues a word: '$' does on PostgreSQL
// and MySQL, not on SQLite.
func (l *lexer) isWordCont(c byte) bool {
	return isIdentStart(c) || isDigit(c) || c == '$' && l.d != SQLite
}

func (l *lexer) peek(k int) byte {
	if l.i+k < len(l.s) {
		return l.s[l.i+k]
	}
	return 0
}

// next returns the next token (kind 0 for white space and comments), or
// false at the end of the text.
func (l *lexer) next() (token, bool) {
	if l.i >= len(l.s) {
		return token{}, false
	}
	start := l.i
	c := l.s[l.i]
	other := func(kind tokKind) (token, bool) { return token{kind: kind, text: l.s[start:l.i]}, true }
	switch {
	case isSpace(c):
		for l.i < len(l.s) && isSpace(l.s[l.i]) {
			l.i++
		}
		return token{}, true
	case c == '-' && l.peek(1) == '-' && (l.d != MySQL || l.i+2 >= len(l.s) || l.s[l.i+2] <= ' '):
		// MySQL needs a space or control character after "--".
		l.lineComment()
		return token{}, true
	case c == '#' && l.d == MySQL:
		l.lineComment()
		return token{}, true
	case c == '/' && l.peek(1) == '*':
		if l.d == MySQL && l.execComment() {
			return token{}, true
		}
		l.blockComment()
		return token{}, true
	case c == '*' && l.peek(1) == '/' && l.exec > 0:
		l.exec--
		l.i += 2
		return token{}, true
	case c == ';':
		l.i++
		return other(tokOther)
	case c == '\'':
		l.i++
		switch l.d {
		case PostgreSQL:
			l.pgQuoted(l.r.Backslash, true)
		case MySQL:
			l.quoted('\'', l.r.Backslash)
		default:
			l.quoted('\'', false)
		}
		return token{kind: tokString}, true
	case c == '"':
		l.i++
		if l.d == MySQL && !l.r.ANSIQuotes {
			l.quoted('"', l.r.Backslash)
			return token{kind: tokString}, true
		}
		l.quoted('"', false)
		return other(tokQuoted)
	case c == '`' && l.d != PostgreSQL:
		l.i++
		l.quoted('`', false)
		return other(tokQuoted)
	case c == '[' && l.d == SQLite:
		if j := strings.IndexByte(l.s[l.i:], ']'); j >= 0 {
			l.i += j + 1
		} else {
			l.i, l.open = len(l.s), true
		}
		return other(tokQuoted)
	case c == '$' && l.d == PostgreSQL:
		if l.dollar() {
			return token{kind: tokString}, true
		}
		return other(tokOther)
	case l.d == PostgreSQL && (isDigit(c) || c == '.' && isDigit(l.peek(1))):
		l.number()
		return other(tokOther)
	case isDigit(c):
		// MySQL and SQLite: a number, or on MySQL an identifier that
		// starts with digits; neither is a keyword.
		for l.i < len(l.s) && l.isWordCont(l.s[l.i]) {
			l.i++
		}
		return other(tokOther)
	case isIdentStart(c):
		if l.d == PostgreSQL {
			if kind, ok := l.pgPrefixed(); ok {
				return other(kind)
			}
		}
		for l.i < len(l.s) && l.isWordCont(l.s[l.i]) {
			l.i++
		}
		return other(tokWord)
	}
	l.i++
	return other(tokOther)
}

// lineComment skips a comment to the end of its line: \n or \r on
// PostgreSQL (its lexer's newline is either), \n elsewhere.
func (l *lexer) lineComment() {
	for l.i < len(l.s) && l.s[l.i] != '\n' && (l.s[l.i] != '\r' || l.d != PostgreSQL) {
		l.i++
	}
}

// blockComment skips a /* … */ comment. PostgreSQL's nest; MySQL's and
// SQLite's do not.
func (l *lexer) blockComment() {
	depth := 0
	for l.i < len(l.s) {
		switch {
		case l.s[l.i] == '/' && l.peek(1) == '*':
			if depth == 0 || l.d == PostgreSQL {
				depth++
			}
			l.i += 2
		case l.s[l.i] == '*' && l.peek(1) == '/':
			depth--
			l.i += 2
			if depth == 0 {
				return
			}
		default:
			l.i++
		}
	}
	l.open = true
}

// execComment consumes the opening of a MySQL /*! or MariaDB /*M!
// comment, with the server version that may follow, when one starts here:
// the server runs its content as code.
func (l *lexer) execComment() bool {
	j := l.i + 2
	if j+1 < len(l.s) && l.s[j]|0x20 == 'm' && l.s[j+1] == '!' {
		j++
	}
	if j >= len(l.s) || l.s[j] != '!' {
		return false
	}
	j++
	for j < len(l.s) && isDigit(l.s[j]) {
		j++
	}
	l.i = j
	l.exec++
	return true
}

// quoted consumes the rest of a run quoted by q whose opening quote is
// consumed: a doubled quote stays inside, and so does an escaped one when
// backslash is set.
func (l *lexer) quoted(q byte, backslash bool) {
	for l.i < len(l.s) {
		c := l.s[l.i]
		switch {
		case backslash && c == '\\':
			l.i += 2
		case c == q:
			if l.peek(1) == q {
				l.i += 2
				continue
			}
			l.i++
			return
		default:
			l.i++
		}
	}
	l.i, l.open = len(l.s), true
}

// pgPrefixed consumes E'…', B'…', X'…', N'…', U&'…' or U&"…" when the word
// starting here is such a prefix, as PostgreSQL's lexer does by longest
// match: the prefix counts only at the start of a token.
func (l *lexer) pgPrefixed() (tokKind, bool) {
	c, n := l.s[l.i]|0x20, l.peek(1)
	switch {
	case c == 'e' && n == '\'':
		l.i += 2
		l.pgQuoted(true, true) // escape strings always take backslashes
	case (c == 'b' || c == 'x') && n == '\'':
		l.i += 2
		l.pgQuoted(false, false) // bit strings: no escapes, no doubled quotes
	case c == 'n' && n == '\'':
		l.i += 2
		l.pgQuoted(l.r.Backslash, true) // national: a plain string
	case c == 'u' && n == '&' && l.peek(2) == '\'':
		l.i += 3
		l.pgQuoted(false, true)
	case c == 'u' && n == '&' && l.peek(2) == '"':
		l.i += 3
		l.quoted('"', false)
		return tokQuoted, true
	default:
		return 0, false
	}
	return tokString, true
}

// pgQuoted consumes the rest of a PostgreSQL '…' literal whose opening
// quote is consumed, including segments joined to it by quote
// continuation ('a' <newline> 'b' is one literal, lexed in the first
// segment's mode). backslash: \ escapes the next byte; doubled: a
// doubled quote stands for one.
func (l *lexer) pgQuoted(backslash, doubled bool) {
	for l.i < len(l.s) {
		c := l.s[l.i]
		switch {
		case backslash && c == '\\':
			l.i += 2
		case c == '\'':
			if doubled && l.peek(1) == '\'' {
				l.i += 2
				continue
			}
			l.i++
			if j, ok := l.continuation(l.i); ok {
				l.i = j + 1
				continue
			}
			return
		default:
			l.i++
		}
	}
	l.i, l.open = len(l.s), true
}

// continuation reports whether white space with at least one newline (and
// possibly -- comments) followed by a quote starts at j, and where that
// quote is: PostgreSQL then continues the literal.
func (l *lexer) continuation(j int) (int, bool) {
	newline := false
	for j < len(l.s) {
		switch c := l.s[j]; {
		case c == '\n' || c == '\r':
			newline = true
			j++
		case isSpace(c):
			j++
		case c == '-' && j+1 < len(l.s) && l.s[j+1] == '-':
			for j < len(l.s) && l.s[j] != '\n' && l.s[j] != '\r' {
				j++
			}
		default:
			return j, newline && c == '\''
		}
	}
	return j, false
}

// dollar consumes a PostgreSQL dollar-quoted string ($$…$$, $tag$…$tag$)
// and reports true, or consumes a parameter ($1) or a lone '$' and reports
// false. Inside a word '$' is part of the word and never gets here.
func (l *lexer) dollar() bool {
	if isDigit(l.peek(1)) {
		l.i++
		for l.i < len(l.s) && isDigit(l.s[l.i]) {
			l.i++
		}
		return false
	}
	j := l.i + 1
	if j < len(l.s) && isIdentStart(l.s[j]) {
		for j < len(l.s) && (isIdentStart(l.s[j]) || isDigit(l.s[j])) {
			j++
		}
	}
	if j >= len(l.s) || l.s[j] != '$' {
		l.i++ // a lone '$'; the lexer goes on after it, as PostgreSQL's does
		return false
	}
	delim := l.s[l.i : j+1]
	end := strings.Index(l.s[j+1:], delim)
	if end < 0 {
		l.i, l.open = len(l.s), true
		return true
	}
	l.i = j + 1 + end + len(delim)
	return true
}

// number consumes a PostgreSQL numeric literal: digits, a fraction, an
// exponent. An 'e' not followed by digits is not consumed, so 1e'…' is 1
// followed by an escape string, as in PostgreSQL 15 (later versions reject
// the text).
func (l *lexer) number() {
	for l.i < len(l.s) && isDigit(l.s[l.i]) {
		l.i++
	}
	if l.i < len(l.s) && l.s[l.i] == '.' && l.peek(1) != '.' {
		l.i++
		for l.i < len(l.s) && isDigit(l.s[l.i]) {
			l.i++
		}
	}
	if l.i < len(l.s) && l.s[l.i]|0x20 == 'e' {
		j := l.i + 1
		if j < len(l.s) && (l.s[j] == '+' || l.s[j] == '-') {
			j++
		}
		if j < len(l.s) && isDigit(l.s[j]) {
			for j < len(l.s) && isDigit(l.s[j]) {
				j++
			}
			l.i = j
		}
	}
}
