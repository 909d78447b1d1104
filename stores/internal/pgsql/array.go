package pgsql

import (
	"errors"
	"fmt"
	"strings"
)

// ParseTextArray parses the text form of a one-dimensional text[] (as
// CheckSQL's array columns arrive through a driver that returns them as
// text): "{}", "{a,b}", elements double-quoted where they need it, with
// backslash escapes. A NULL element is an error: CheckSQL returns none.
func ParseTextArray(s string) ([]string, error) {
	body, ok1 := strings.CutPrefix(s, "{")
	body, ok2 := strings.CutSuffix(body, "}")
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("not a text array: %q", s)
	}
	out := []string{}
	if body == "" {
		return out, nil
	}
	for i := 0; ; {
		var elem strings.Builder
		if i < len(body) && body[i] == '"' {
			i++
			for ; i < len(body) && body[i] != '"'; i++ {
				if body[i] == '\\' {
					i++
				}
				if i < len(body) {
					elem.WriteByte(body[i])
				}
			}
			if i >= len(body) {
				return nil, fmt.Errorf("text array %q: unterminated quote", s)
			}
			i++ // the closing quote
		} else {
			j := strings.IndexByte(body[i:], ',')
			if j < 0 {
				j = len(body) - i
			}
			raw := body[i : i+j]
			if raw == "NULL" {
				return nil, errors.New("text array: NULL element")
			}
			if raw == "" || strings.ContainsAny(raw, `"{}\`) {
				return nil, fmt.Errorf("text array %q: malformed element %q", s, raw)
			}
			elem.WriteString(raw)
			i += j
		}
		out = append(out, elem.String())
		if i == len(body) {
			return out, nil
		}
		if body[i] != ',' {
			return nil, fmt.Errorf("text array %q: want a comma at %d", s, i)
		}
		i++
	}
}
