package limiter

import (
	"errors"
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// A small strict JSON reader (RFC 8259) for the plugin configuration. It
// builds a tree that keeps object fields in order, duplicates included, so
// that the configuration schema can reject duplicate and unknown fields and
// quote the offending value in its error. encoding/json would do the parsing
// but not the messages, and would add reflection to the module
// (filter/RATIONALE.md, "Why a hand-written JSON reader").
//
// It reads a string, and the strings and numbers it returns are substrings
// of it unless they hold escapes: the text is copied once, and a value kept
// from it keeps that copy. Below a chosen depth it builds no tree: an array
// or object there is read in full, so that every syntax error is found
// where it is, but kept only as its text, its number of entries and its
// written size, its strings measured and not decoded; the schema reads the
// entries of the ones it needs one at a time (eachItem), and a list of
// 10,000 canary keys costs no node per key (filter/RATIONALE.md, "Why the
// configuration is at most 1 MiB").

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
// number's literal text, exactly as written. An array or object read
// without its tree (summary) holds its text as written, n its number of
// entries and size its written size (writtenSize), and no items or fields.
// A string within a summary is a summary too: its size only, no text.
type jsonValue struct {
	kind    jsonKind
	b       bool
	summary bool
	text    string
	n       int
	size    int
	items   []jsonValue
	fields  []jsonField
}

type jsonField struct {
	name  string
	value jsonValue
}

// maxJSONDepth bounds nesting; the configuration needs three levels.
const maxJSONDepth = 16

type jsonParser struct {
	data  string
	pos   int
	depth int
	// summarize is the depth from which arrays and objects are kept as
	// summaries (jsonValue.summary); 0 builds the whole tree. The
	// top-level value is at depth 1.
	summarize int
}

// parseJSON parses data as exactly one JSON value with optional surrounding
// whitespace, into a whole tree.
func parseJSON(data []byte) (jsonValue, error) { return parseText(string(data), 0) }

// parseText parses data as parseJSON does, keeping the arrays and objects
// at depth summarize and deeper as summaries (0: none). Its strings and
// numbers are substrings of data unless they hold escapes.
func parseText(data string, summarize int) (jsonValue, error) {
	p := jsonParser{data: data, summarize: summarize}
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
		s, n, err := p.str()
		if p.summarizing() {
			// Within a summary only its written size counts.
			return jsonValue{kind: jsonString, summary: true, size: n + 2}, err
		}
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
	if len(p.data)-p.pos < len(word) || p.data[p.pos:p.pos+len(word)] != word {
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
	start := p.pos
	p.pos++ // '{'
	v := jsonValue{kind: jsonObject}
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return p.leave(v, start), nil
	}
	for {
		p.space()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return jsonValue{}, p.fail("expected a string as object key")
		}
		name, nameLen, err := p.str()
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
		if p.summarizing() {
			v.n++
			v.size += nameLen + 4 + writtenSize(fv)
		} else {
			v.fields = append(v.fields, jsonField{name: name, value: fv})
		}
		p.space()
		if p.pos >= len(p.data) {
			return jsonValue{}, p.fail("unexpected end of input in object")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return p.leave(v, start), nil
		default:
			return jsonValue{}, p.fail("expected ',' or '}' in object")
		}
	}
}

func (p *jsonParser) array() (jsonValue, error) {
	if err := p.enter(); err != nil {
		return jsonValue{}, err
	}
	start := p.pos
	p.pos++ // '['
	v := jsonValue{kind: jsonArray}
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return p.leave(v, start), nil
	}
	for {
		p.space()
		item, err := p.value()
		if err != nil {
			return jsonValue{}, err
		}
		if p.summarizing() {
			v.n++
			v.size += writtenSize(item) + 1
		} else {
			v.items = append(v.items, item)
		}
		p.space()
		if p.pos >= len(p.data) {
			return jsonValue{}, p.fail("unexpected end of input in array")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return p.leave(v, start), nil
		default:
			return jsonValue{}, p.fail("expected ',' or ']' in array")
		}
	}
}

// summarizing reports whether the array or object being read is kept as a
// summary.
func (p *jsonParser) summarizing() bool { return p.summarize > 0 && p.depth >= p.summarize }

// leave ends the array or object v, which started at start: a summary
// gets its text and its size's brackets.
func (p *jsonParser) leave(v jsonValue, start int) jsonValue {
	if p.summarizing() {
		v.summary, v.text = true, p.data[start:p.pos]
		v.size += 2
	}
	p.depth--
	return v
}

// eachItem calls fn with each entry of the array summary v, in order, read
// with its own arrays and objects kept as summaries from depth summarize
// (the entries are at depth 1; 0 builds them whole). v's text was read
// when v was, so it holds no error.
func eachItem(v jsonValue, summarize int, fn func(i int, item jsonValue) error) error {
	p := jsonParser{data: v.text, summarize: summarize}
	p.pos++ // '['
	for i := 0; ; i++ {
		p.space()
		if p.pos >= len(p.data) || p.data[p.pos] == ']' {
			return nil
		}
		item, err := p.value()
		if err != nil {
			return err
		}
		if err := fn(i, item); err != nil {
			return err
		}
		p.space()
		if p.pos < len(p.data) && p.data[p.pos] == ',' {
			p.pos++
		}
	}
}

// eachField calls fn with each field of the object summary v, in order,
// its value read with its arrays and objects kept as summaries. v's text
// was read when v was, so it holds no error.
func eachField(v jsonValue, fn func(name string, value jsonValue) error) error {
	return readFields(v, false, func(_ int, name string, _ int, value jsonValue) error { return fn(name, value) })
}

// readFields calls fn with each field of the object summary v, in order,
// with where its name starts in v.text and the name's decoded length. When
// measure, the fields' strings, names included, are measured and not
// decoded, as within a summary (a name is then "" if it has escapes;
// strPrefix reads it). v's text was read when v was, so it holds no error:
// not even of depth when measured one level down, since v was at depth 1
// or deeper.
func readFields(v jsonValue, measure bool, fn func(at int, name string, nameLen int, value jsonValue) error) error {
	p := jsonParser{data: v.text, summarize: 1}
	if measure {
		p.depth = 1
	}
	p.pos++ // '{'
	for {
		p.space()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return nil
		}
		at := p.pos
		name, nameLen, err := p.str()
		if err != nil {
			return err
		}
		p.space()
		p.pos++ // ':'
		p.space()
		value, err := p.value()
		if err != nil {
			return err
		}
		if err := fn(at, name, nameLen, value); err != nil {
			return err
		}
		p.space()
		if p.pos < len(p.data) && p.data[p.pos] == ',' {
			p.pos++
		}
	}
}

// strPrefix reads the string at p.pos, which str has read without error,
// and returns at most the first limit bytes of its value, and the value's
// length.
func (p *jsonParser) strPrefix(limit int) (string, int) {
	p.pos++ // opening quote
	buf, n, _ := p.escaped(p.pos, make([]byte, 0, limit))
	return string(buf), n
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
	return jsonValue{kind: jsonNumber, text: p.data[start:p.pos]}, nil
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
// value and the value's length in bytes. Within a summary a string with
// escapes is measured, not decoded: its value is "" (only its written size
// counts there). Raw control characters, invalid UTF-8, unknown escapes
// and unpaired surrogates are errors.
func (p *jsonParser) str() (string, int, error) {
	p.pos++ // opening quote
	start := p.pos
	// Fast path: no escapes, the value is the bytes between the quotes.
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		if c == '"' {
			raw := p.data[start:p.pos]
			if !utf8.ValidString(raw) {
				return "", 0, p.fail("invalid UTF-8 in string")
			}
			p.pos++
			return raw, len(raw), nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return "", 0, p.fail("control character in string")
		}
		p.pos++
	}
	// Escapes: the string is read once to measure it, which finds every
	// error, and a value that is kept is decoded into a buffer of exactly
	// its size, so that a string costs no garbage, kept or not.
	from := p.pos
	_, n, err := p.escaped(start, nil)
	if err != nil || p.summarizing() {
		return "", n, err
	}
	end := p.pos
	p.pos = from
	buf, _, _ := p.escaped(start, make([]byte, 0, n))
	p.pos = end
	// buf is not written again: the value is its bytes, not a copy.
	return unsafe.String(unsafe.SliceData(buf), len(buf)), n, nil
}

// escaped reads the rest of a string that holds escapes, from p.pos to past
// its closing quote; the string's text starts at seg. It returns the
// decoded value's length and appends to buf as much of the value as buf's
// capacity holds (nil: none).
func (p *jsonParser) escaped(seg int, buf []byte) ([]byte, int, error) {
	n, valid := 0, true
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		if c != '"' && c != '\\' {
			if c < 0x20 {
				return nil, 0, p.fail("control character in string")
			}
			p.pos++
			continue
		}
		// A run of bytes as written ends. An escape decodes to valid UTF-8
		// that starts with no continuation byte, so the value is valid
		// UTF-8 exactly when every run is.
		raw := p.data[seg:p.pos]
		valid = valid && utf8.ValidString(raw)
		n += len(raw)
		buf = append(buf, raw[:min(len(raw), cap(buf)-len(buf))]...)
		if c == '"' {
			if !valid {
				return nil, 0, p.fail("invalid UTF-8 in string")
			}
			p.pos++
			return buf, n, nil
		}
		p.pos++ // backslash
		if p.pos >= len(p.data) {
			break
		}
		e := p.data[p.pos]
		p.pos++
		r := rune(e)
		switch e {
		case '"', '\\', '/':
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		case 'u':
			var err error
			if r, err = p.escapedRune(); err != nil {
				return nil, 0, err
			}
		default:
			p.pos--
			return nil, 0, p.fail("invalid escape " + strconv.QuoteRune(rune(e)))
		}
		var enc [utf8.UTFMax]byte
		w := utf8.EncodeRune(enc[:], r)
		n += w
		buf = append(buf, enc[:min(w, cap(buf)-len(buf))]...)
		seg = p.pos
	}
	return nil, 0, p.fail("unterminated string")
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
	for i := p.pos; i < p.pos+4; i++ {
		c := p.data[i]
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
