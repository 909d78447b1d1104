package idempgx

import "strings"

// This file finds transaction-control statements in SQL text before it is
// sent, so that the handle a handler gets cannot end the store's
// transaction. It is a lexer, not a parser: it splits the text into
// statements on every ';' that PostgreSQL's own lexer (src/backend/parser/
// scan.l) would see outside a string, a quoted identifier, a dollar quote
// or a comment, and looks at the first words of each statement.
//
// It errs on one side only. Splitting on a ';' the grammar would not treat
// as a separator (one inside parentheses, or inside a BEGIN ATOMIC function
// body) can only add statement starts, so a false alarm is possible and a
// missed statement is not: a CREATE FUNCTION … BEGIN ATOMIC body with more
// than one statement is refused (its "END" looks like a statement). Use
// the AS $$ … $$ form inside a handler instead.
//
// Whether a backslash escapes the next character in a plain '…' string
// depends on standard_conforming_strings, which a handler can change with
// SET. The text is therefore read both ways, and a statement found by
// either reading is refused.

// txControlStatement reports whether sql contains a statement that would
// begin, end or prepare a transaction under either setting of
// standard_conforming_strings, and returns that statement's first words for
// an error message.
func txControlStatement(sql string) (string, bool) {
	for _, backslash := range []bool{false, true} {
		if words, ok := scanTxControl(sql, backslash); ok {
			return words, true
		}
	}
	return "", false
}

// scanTxControl reads sql one way: backslash says whether plain '…' strings
// take backslash escapes (standard_conforming_strings off).
func scanTxControl(sql string, backslash bool) (string, bool) {
	found, words := false, ""
	scanStatements(sql, backslash, func(first []string) bool {
		if isTxControl(first) {
			found, words = true, strings.Join(first, " ")
			return false
		}
		return true
	})
	return words, found
}

// isTxControl classifies a statement by its first (up to three) words, in
// lower case: "" for a token that is not a plain word.
func isTxControl(w []string) bool {
	if len(w) == 0 {
		return false
	}
	switch w[0] {
	case "commit", "end", "abort", "begin", "start":
		// COMMIT [AND [NO] CHAIN], COMMIT PREPARED, END, ABORT, BEGIN,
		// START TRANSACTION. No other statement starts with these words.
		return true
	case "rollback":
		// ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name stays inside
		// the transaction; every other ROLLBACK (plain, AND CHAIN,
		// PREPARED) ends one.
		i := 1
		if i < len(w) && (w[i] == "work" || w[i] == "transaction") {
			i++
		}
		return i >= len(w) || w[i] != "to"
	case "prepare":
		// PREPARE TRANSACTION 'gid' ends the transaction; PREPARE name AS
		// … only plans a statement.
		return len(w) > 1 && w[1] == "transaction"
	}
	return false
}

// maxWords is how many leading words of a statement isTxControl needs.
const maxWords = 3

// scanStatements calls fn with the first words of every statement in sql,
// in order, until fn returns false. A word is an unquoted identifier or
// keyword, lower-cased (ASCII only, as PostgreSQL folds keywords); the
// words stop at the first token that is not one, which is then reported as
// "". When fn never stops it, it reports whether the text ended inside a
// string, quoted identifier, dollar quote or block comment.
func scanStatements(sql string, backslash bool, fn func(first []string) bool) (open bool) {
	l := lexer{s: sql, backslash: backslash}
	var words []string
	wordsDone := false
	emit := func() bool {
		if len(words) == 0 {
			return true
		}
		ok := fn(words)
		words, wordsDone = words[:0:0], false
		return ok
	}
	for {
		tok, ok := l.next()
		if !ok {
			// An unterminated literal or comment is a syntax error on the
			// server, which then runs nothing; the words before it are
			// reported all the same.
			emit()
			return l.open
		}
		switch tok.kind {
		case tokSpace:
			continue
		case tokSemicolon:
			if !emit() {
				return l.open
			}
			continue
		}
		if wordsDone || len(words) >= maxWords {
			continue
		}
		if tok.kind == tokWord {
			words = append(words, lowerASCII(tok.text))
			continue
		}
		words = append(words, "")
		wordsDone = true
	}
}

type tokKind int

const (
	tokSpace     tokKind = iota // white space and comments
	tokSemicolon                // ;
	tokWord                     // unquoted identifier or keyword
	tokOther                    // anything else: strings, numbers, operators, quoted identifiers
)

type token struct {
	kind tokKind
	text string
}

// lexer tokenises PostgreSQL SQL text as far as statement boundaries need.
type lexer struct {
	s         string
	i         int
	backslash bool // plain strings take backslash escapes
	open      bool // the text ended inside a literal or comment
}

func isSpace(c byte) bool {
	// PostgreSQL 16 added \v; older servers reject it outside literals,
	// so counting it as space loses nothing.
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isIdentCont(c byte) bool { return isIdentStart(c) || isDigit(c) || c == '$' }

func (l *lexer) peek(k int) byte {
	if l.i+k < len(l.s) {
		return l.s[l.i+k]
	}
	return 0
}

// next returns the next token, or false at the end of the text.
func (l *lexer) next() (token, bool) {
	if l.i >= len(l.s) {
		return token{}, false
	}
	start := l.i
	c := l.s[l.i]
	switch {
	case isSpace(c):
		for l.i < len(l.s) && isSpace(l.s[l.i]) {
			l.i++
		}
		return token{kind: tokSpace}, true
	case c == '-' && l.peek(1) == '-':
		l.lineComment()
		return token{kind: tokSpace}, true
	case c == '/' && l.peek(1) == '*':
		l.blockComment()
		return token{kind: tokSpace}, true
	case c == ';':
		l.i++
		return token{kind: tokSemicolon}, true
	case c == '\'':
		l.i++
		l.quoted(l.backslash, true)
	case c == '"':
		l.i++
		l.identifier()
	case c == '$':
		l.dollar()
	case isDigit(c) || c == '.' && isDigit(l.peek(1)):
		l.number()
	case isIdentStart(c):
		if l.prefixedLiteral() {
			return token{kind: tokOther}, true
		}
		for l.i < len(l.s) && isIdentCont(l.s[l.i]) {
			l.i++
		}
		return token{kind: tokWord, text: l.s[start:l.i]}, true
	default:
		l.i++
	}
	return token{kind: tokOther}, true
}

func (l *lexer) lineComment() {
	for l.i < len(l.s) && l.s[l.i] != '\n' && l.s[l.i] != '\r' {
		l.i++
	}
}

// blockComment skips a /* … */ comment; they nest in PostgreSQL.
func (l *lexer) blockComment() {
	depth := 0
	for l.i < len(l.s) {
		switch {
		case l.s[l.i] == '/' && l.peek(1) == '*':
			depth++
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

// prefixedLiteral consumes E'…', B'…', X'…', N'…', U&'…' or U&"…" when the
// word starting here is such a prefix, as PostgreSQL's lexer does by
// longest match: the prefix counts only at the start of a token.
func (l *lexer) prefixedLiteral() bool {
	c, n := l.s[l.i]|0x20, l.peek(1)
	switch {
	case c == 'e' && n == '\'':
		l.i += 2
		l.quoted(true, true) // escape strings always take backslashes
	case (c == 'b' || c == 'x') && n == '\'':
		l.i += 2
		l.quoted(false, false) // bit strings: no escapes, no doubled quotes
	case c == 'n' && n == '\'':
		l.i += 2
		l.quoted(l.backslash, true) // national: a plain string
	case c == 'u' && n == '&' && l.peek(2) == '\'':
		l.i += 3
		l.quoted(false, true)
	case c == 'u' && n == '&' && l.peek(2) == '"':
		l.i += 3
		l.identifier()
	default:
		return false
	}
	return true
}

// quoted consumes the rest of a '…' literal whose opening quote is already
// consumed, including segments joined to it by PostgreSQL's quote
// continuation ('a' <newline> 'b' is one literal, lexed in the same mode).
// backslash: \ escapes the next byte; doubled: ” is a quote.
func (l *lexer) quoted(backslash, doubled bool) {
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
	l.i = len(l.s)
	l.open = true
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

// identifier consumes the rest of a "…" identifier ("" is a quote).
func (l *lexer) identifier() {
	for l.i < len(l.s) {
		if l.s[l.i] == '"' {
			if l.peek(1) == '"' {
				l.i += 2
				continue
			}
			l.i++
			return
		}
		l.i++
	}
	l.open = true
}

// dollar consumes what starts with '$' at the start of a token: a
// parameter ($1), a dollar-quoted string ($$…$$, $tag$…$tag$), or a lone
// '$'. Inside a word '$' is part of the word and never gets here.
func (l *lexer) dollar() {
	if isDigit(l.peek(1)) {
		l.i++
		for l.i < len(l.s) && isDigit(l.s[l.i]) {
			l.i++
		}
		return
	}
	j := l.i + 1
	if j < len(l.s) && isIdentStart(l.s[j]) {
		for j < len(l.s) && (isIdentStart(l.s[j]) || isDigit(l.s[j])) {
			j++
		}
	}
	if j >= len(l.s) || l.s[j] != '$' {
		l.i++ // a lone '$'; the lexer goes on after it, as PostgreSQL's does
		return
	}
	delim := l.s[l.i : j+1]
	end := strings.Index(l.s[j+1:], delim)
	if end < 0 {
		l.i = len(l.s)
		l.open = true
		return
	}
	l.i = j + 1 + end + len(delim)
}

// number consumes a numeric literal: digits, a fraction, an exponent. An
// 'e' not followed by digits is not consumed, so 1e'…' is 1 followed by an
// escape string, as in PostgreSQL 15 (later versions reject the text).
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

func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
