package idemredis

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
)

// IndexShards is the number of in-progress indexes: each record belongs to
// one shard, chosen by a hash of its principal and key, and lives in the
// same Cluster slot as its shard's index, so that the scripts can update
// both atomically. ListStale reads all of them. Changing the number would
// move every record to another key name, so it is fixed.
const IndexShards = 1024

// DefaultPrefix starts every key a Store writes unless WithPrefix says
// otherwise.
const DefaultPrefix = "idem:"

// maxPrefixLen bounds WithPrefix.
const maxPrefixLen = 64

// checkPrefix validates a key prefix: at most maxPrefixLen bytes, without
// '{' or '}', which would make the prefix the key's Cluster hash tag and put
// every record in one slot.
func checkPrefix(p string) error {
	switch {
	case len(p) > maxPrefixLen:
		return fmt.Errorf("idemredis: prefix %q: at most %d bytes", p, maxPrefixLen)
	case strings.ContainsAny(p, "{}"):
		return fmt.Errorf("idemredis: prefix %q: must not contain '{' or '}' (they would set the Cluster hash tag)", p)
	}
	return nil
}

// keys are the names one record's scripts touch. Both carry the same hash
// tag, {s<shard>}, so they hash to one Cluster slot.
type keys struct {
	record string // the record's hash
	index  string // its shard's sorted set of in-progress records
	member string // the record's member in index: escaped principal ':' escaped key
}

// keysFor returns the key names for (principal, key).
func (s *Store) keysFor(principal, key string) keys {
	member := make([]byte, 0, len(principal)+len(key)+8)
	member = appendEscaped(member, principal)
	member = append(member, ':')
	member = appendEscaped(member, key)
	m := string(member)
	shard := shardOf(m)
	return keys{record: s.recordKey(shard, m), index: s.indexKey(shard), member: m}
}

// shardOf returns the index shard of a member.
func shardOf(member string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(member))
	return int(h.Sum32() % IndexShards)
}

// tag returns the hash-tagged part every key of shard starts with, after the
// prefix.
func (s *Store) tag(shard int) string {
	return s.prefix + "{s" + strconv.Itoa(shard) + "}"
}

func (s *Store) recordKey(shard int, member string) string {
	return s.tag(shard) + ":r:" + member
}

func (s *Store) indexKey(shard int) string {
	return s.tag(shard) + ":inprogress"
}

// RecordKey returns the name of the Redis hash that holds the record for
// (principal, key), for operators reading it with redis-cli (HGETALL).
func (s *Store) RecordKey(principal, key string) string {
	return s.keysFor(principal, key).record
}

const hexDigits = "0123456789ABCDEF"

// appendEscaped appends s to b with '%', ':', '{', '}', space, DEL and the
// control bytes written as %XX. The escaping is injective and its output
// holds no ':', so "escaped principal:escaped key" names exactly one pair:
// no two (principal, key) pairs share a key name. Other bytes, UTF-8
// included, are kept as they are, so names stay readable in redis-cli.
func appendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c == 0x7f || c == '%' || c == ':' || c == '{' || c == '}' {
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&0xf])
			continue
		}
		b = append(b, c)
	}
	return b
}

var errBadMember = errors.New("idemredis: malformed index member")

// splitMember reverses keysFor's member: the principal and key it names.
func splitMember(m string) (principal, key string, err error) {
	i := strings.IndexByte(m, ':')
	if i < 0 {
		return "", "", errBadMember
	}
	if principal, err = unescape(m[:i]); err != nil {
		return "", "", err
	}
	if key, err = unescape(m[i+1:]); err != nil {
		return "", "", err
	}
	return principal, key, nil
}

func unescape(s string) (string, error) {
	if strings.IndexByte(s, '%') < 0 {
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b = append(b, s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", errBadMember
		}
		hi, lo := strings.IndexByte(hexDigits, s[i+1]), strings.IndexByte(hexDigits, s[i+2])
		if hi < 0 || lo < 0 {
			return "", errBadMember
		}
		b = append(b, byte(hi<<4|lo))
		i += 2
	}
	return string(b), nil
}
