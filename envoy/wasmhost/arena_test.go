package wasmhost

import (
	"fmt"
	"strings"
	"testing"
)

// Every string the arena handed out stays as it was while later copies
// fill its block and the ones after it, a large copy included.
func TestTextArenaKeepsEveryCopy(t *testing.T) {
	var a textArena
	type kept struct{ got, want string }
	var all []kept
	for i := range 3 * arenaBlock / 16 { // some 3 blocks of small copies
		src := []byte(fmt.Sprintf("value-%d", i))
		all = append(all, kept{a.bytes(src), string(src)})
		clear(src) // the module's memory changes after the call
		k, v := a.pair(fmt.Sprintf("X-Name-%d", i), fmt.Sprintf("V-%d", i))
		all = append(all, kept{k, fmt.Sprintf("x-name-%d", i)}, kept{v, fmt.Sprintf("V-%d", i)})
	}
	large := strings.Repeat("L", arenaLarge+1)
	all = append(all, kept{a.bytes([]byte(large)), large})
	for range 10 {
		a.bytes([]byte("after the large copy"))
	}
	for i, k := range all {
		if k.got != k.want {
			t.Fatalf("copy %d reads %q, want %q", i, k.got, k.want)
		}
	}
	if a.bytes(nil) != "" {
		t.Error("an empty copy is not empty")
	}
}

// pair lower-cases the name's ASCII letters only, as Envoy's
// LowerCaseString does (absl::AsciiStrToLower), and leaves the value as it is.
func TestTextArenaPairLowersASCIIOnly(t *testing.T) {
	var a textArena
	k, v := a.pair("X-RateLimit-\xc3\x9c", "Mixed-Case")
	if k != "x-ratelimit-\xc3\x9c" || v != "Mixed-Case" {
		t.Errorf("pair = %q, %q", k, v)
	}
	if k, v := a.pair("", ""); k != "" || v != "" {
		t.Errorf("empty pair = %q, %q", k, v)
	}
}

// pairs decodes as DecodePairs does, names lower-cased, with the room asked
// for, and a malformed map is empty; encodePairs writes what EncodePairs
// returns.
func TestTextArenaPairs(t *testing.T) {
	var a textArena
	in := []Header{{":Path", "/Orders"}, {"X-API-Key", "K"}, {"empty", ""}}
	enc := EncodePairs(in)
	if n := pairsSize(in); n != len(enc) {
		t.Fatalf("pairsSize = %d, EncodePairs made %d bytes", n, len(enc))
	}
	into := make([]byte, len(enc))
	for i := range into {
		into[i] = 0xff // encodePairs writes every byte, NULs included
	}
	encodePairs(into, in)
	if string(into) != string(enc) {
		t.Fatalf("encodePairs wrote %q, EncodePairs %q", into, enc)
	}
	got := a.pairs(enc, 3)
	want := []Header{{":path", "/Orders"}, {"x-api-key", "K"}, {"empty", ""}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("pairs = %q, want %q", got, want)
	}
	if cap(got) < len(got)+3 {
		t.Errorf("cap %d for %d pairs and room for 3", cap(got), len(got))
	}
	if enc[4+8*3] != ':' || string(enc[4+8*3:4+8*3+5]) != ":Path" {
		t.Error("pairs changed the buffer it decoded")
	}
	if got := a.pairs(enc[:len(enc)-1], 0); got != nil {
		t.Errorf("a truncated map decoded to %q", got)
	}
}
