package main

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

func TestDigestCommand(t *testing.T) {
	mac := hmac.New(sha256.New, []byte("pepper"))
	mac.Write([]byte("abc"))
	salted := "hmac-sha256:" + hex.EncodeToString(mac.Sum(nil)) + "\n"
	// SHA-256("abc"), FIPS 180-2.
	plain := "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n"
	tests := []struct {
		name   string
		args   []string
		env    map[string]string
		stdin  string
		code   int
		stdout string
		stderr string
	}{
		{"argument", []string{"abc"}, nil, "", 0, plain, ""},
		{"salt flag", []string{"-key-salt", "pepper", "abc"}, nil, "", 0, salted, ""},
		{"salt from the environment", []string{"abc"}, map[string]string{"SIDECAR_KEY_SALT": "pepper"}, "", 0, salted, ""},
		{"standard input", nil, nil, "abc\nabc\n", 0, plain + plain, ""},
		{"bad key", nil, nil, "abc\n\nabc\n", 1, plain + plain, "sidecar digest: line 2: empty api key\n"},
		{"nothing", nil, nil, "", 1, "", "sidecar digest: no API key given (arguments or one per line on standard input)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := runDigest(tt.args, envOf(tt.env), strings.NewReader(tt.stdin), &out, &errOut)
			if code != tt.code || out.String() != tt.stdout || errOut.String() != tt.stderr {
				t.Errorf("exit %d\nstdout %q\nstderr %q\nwant %d %q %q", code, out.String(), errOut.String(), tt.code, tt.stdout, tt.stderr)
			}
		})
	}
}
