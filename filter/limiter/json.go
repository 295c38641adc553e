package limiter

import (
	"errors"
	"strconv"
	"unicode/utf8"
)

// A small strict JSON reader (RFC 8259) for the plugin configuration. It
// builds a tree that keeps object fields in order, duplicates included, so
// that the configuration schema can reject duplicate and unknown fields and
// quote the offending value in its error. encoding/json would do the parsing
// but not the messages, and would add reflection to the module
// (filter/RATIONALE.md, "Why a hand-written JSON reader").

type jsonKind uint8

const (
	jsonNull jsonKind = iota
	jsonBool
	jsonNumber
	jsonString
	jsonArray
	jsonObject
)

// jsonValue is one parsed value. text holds a string's decoded value or a
// number's literal text, exactly as written.
type jsonValue struct {
	kind   jsonKind
	text   string
	b      bool
	items  []jsonValue
	fields []jsonField
}

type jsonField struct {
	name  string
	value jsonValue
}

// maxJSONDepth bounds nesting; the configuration needs three levels.
const maxJSONDepth = 16

type jsonParser struct {
	data  []byte
	pos   int
	depth int
}

// parseJSON parses data as exactly one JSON value with optional surrounding
// whitespace.
func parseJSON(data []byte) (jsonValue, error) {
	p := jsonParser{data: data}
	p.space()
	v, err := p.value()
	if err != nil {
		return jsonValue{}, err
	}
	p.space()
	if p.pos != len(p.data) {
		return jsonValue{}, p.fail("unexpected data after the top-level value")
	}
	return v, nil
}

func (p *jsonParser) fail(why string) error {
	return errors.New("invalid JSON at offset " + strconv.Itoa(p.pos) + ": " + why)
}

func (p *jsonParser) space() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *jsonParser) value() (jsonValue, error) {
	if p.pos >= len(p.data) {
		return jsonValue{}, p.fail("unexpected end of input")
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object()
	case c == '[':
		return p.array()
	case c == '"':
		s, err := p.str()
		return jsonValue{kind: jsonString, text: s}, err
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	case c == 't':
		return jsonValue{kind: jsonBool, b: true}, p.literal("true")
	case c == 'f':
		return jsonValue{kind: jsonBool}, p.literal("false")
	case c == 'n':
		return jsonValue{kind: jsonNull}, p.literal("null")
	}
	return jsonValue{}, p.fail("unexpected character " + strconv.QuoteRune(rune(p.data[p.pos])))
}

func (p *jsonParser) literal(word string) error {
	if len(p.data)-p.pos < len(word) || string(p.data[p.pos:p.pos+len(word)]) != word {
		return p.fail("invalid literal, expected " + word)
	}
	p.pos += len(word)
	return nil
}

func (p *jsonParser) enter() error {
	p.depth++
	if p.depth > maxJSONDepth {
		return p.fail("nested deeper than " + strconv.Itoa(maxJSONDepth) + " levels")
	}
	return nil
}

func (p *jsonParser) object() (jsonValue, error) {
	if err := p.enter(); err != nil {
		return jsonValue{}, err
	}
	p.pos++ // '{'
	v := jsonValue{kind: jsonObject}
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		p.depth--
		return v, nil
	}
	for {
		p.space()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return jsonValue{}, p.fail("expected a string as object key")
		}
		name, err := p.str()
		if err != nil {
			return jsonValue{}, err
		}
		p.space()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return jsonValue{}, p.fail("expected ':' after object key")
		}
		p.pos++
		p.space()
		fv, err := p.value()
		if err != nil {
			return jsonValue{}, err
		}
		v.fields = append(v.fields, jsonField{name: name, value: fv})
		p.space()
		if p.pos >= len(p.data) {
			return jsonValue{}, p.fail("unexpected end of input in object")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			p.depth--
			return v, nil
		default:
			return jsonValue{}, p.fail("expected ',' or '}' in object")
		}
	}
}

func (p *jsonParser) array() (jsonValue, error) {
	if err := p.enter(); err != nil {
		return jsonValue{}, err
	}
	p.pos++ // '['
	v := jsonValue{kind: jsonArray}
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		p.depth--
		return v, nil
	}
	for {
		p.space()
		item, err := p.value()
		if err != nil {
			return jsonValue{}, err
		}
		v.items = append(v.items, item)
		p.space()
		if p.pos >= len(p.data) {
			return jsonValue{}, p.fail("unexpected end of input in array")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			p.depth--
			return v, nil
		default:
			return jsonValue{}, p.fail("expected ',' or ']' in array")
		}
	}
}

// number accepts exactly RFC 8259's grammar and keeps the literal text; the
// schema decides which numbers it takes.
func (p *jsonParser) number() (jsonValue, error) {
	start := p.pos
	if p.data[p.pos] == '-' {
		p.pos++
	}
	switch {
	case p.pos < len(p.data) && p.data[p.pos] == '0':
		p.pos++
	case p.digits() == 0:
		return jsonValue{}, p.fail("invalid number")
	}
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		p.pos++
		if p.digits() == 0 {
			return jsonValue{}, p.fail("invalid number: no digits after '.'")
		}
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if p.digits() == 0 {
			return jsonValue{}, p.fail("invalid number: no digits in exponent")
		}
	}
	return jsonValue{kind: jsonNumber, text: string(p.data[start:p.pos])}, nil
}

func (p *jsonParser) digits() int {
	n := 0
	for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
		p.pos++
		n++
	}
	return n
}

// str reads a string starting at its opening quote and returns its decoded
// value. Raw control characters, invalid UTF-8, unknown escapes and unpaired
// surrogates are errors.
func (p *jsonParser) str() (string, error) {
	p.pos++ // opening quote
	start := p.pos
	// Fast path: no escapes, the value is the bytes between the quotes.
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		if c == '"' {
			raw := p.data[start:p.pos]
			if !utf8.Valid(raw) {
				return "", p.fail("invalid UTF-8 in string")
			}
			p.pos++
			return string(raw), nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return "", p.fail("control character in string")
		}
		p.pos++
	}
	buf := append([]byte(nil), p.data[start:p.pos]...)
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			if !utf8.Valid(buf) {
				return "", p.fail("invalid UTF-8 in string")
			}
			p.pos++
			return string(buf), nil
		case c < 0x20:
			return "", p.fail("control character in string")
		case c != '\\':
			buf = append(buf, c)
			p.pos++
			continue
		}
		p.pos++ // backslash
		if p.pos >= len(p.data) {
			break
		}
		e := p.data[p.pos]
		p.pos++
		switch e {
		case '"', '\\', '/':
			buf = append(buf, e)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r, err := p.escapedRune()
			if err != nil {
				return "", err
			}
			buf = utf8.AppendRune(buf, r)
		default:
			p.pos--
			return "", p.fail("invalid escape " + strconv.QuoteRune(rune(e)))
		}
	}
	return "", p.fail("unterminated string")
}

// escapedRune reads the XXXX of \uXXXX (and a following \uXXXX when the first
// is a high surrogate).
func (p *jsonParser) escapedRune() (rune, error) {
	r, ok := p.hex4()
	if !ok {
		return 0, p.fail("invalid \\u escape")
	}
	switch {
	case r >= 0xDC00 && r <= 0xDFFF:
		return 0, p.fail("unpaired surrogate in \\u escape")
	case r >= 0xD800 && r <= 0xDBFF:
		if len(p.data)-p.pos < 2 || p.data[p.pos] != '\\' || p.data[p.pos+1] != 'u' {
			return 0, p.fail("unpaired surrogate in \\u escape")
		}
		p.pos += 2
		lo, ok := p.hex4()
		if !ok {
			return 0, p.fail("invalid \\u escape")
		}
		if lo < 0xDC00 || lo > 0xDFFF {
			return 0, p.fail("unpaired surrogate in \\u escape")
		}
		return 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00), nil
	}
	return r, nil
}

func (p *jsonParser) hex4() (rune, bool) {
	if len(p.data)-p.pos < 4 {
		return 0, false
	}
	var r rune
	for _, c := range p.data[p.pos : p.pos+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	p.pos += 4
	return r, true
}
