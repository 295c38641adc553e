package grpclocal

import (
	"encoding/base64"
	"slices"
	"testing"
)

func TestIsGRPC(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/grpc":       true,
		"application/grpc+proto": true,
		"application/grpc+json":  true,
		"application/grpc-web":   false, // Envoy's grpc_web filter's, not a gRPC request
		"application/grpcx":      false,
		"Application/gRPC":       false, // Envoy compares case-sensitively
		"application/json":       false,
		"":                       false,
	} {
		if got := IsGRPC(ct); got != want {
			t.Errorf("IsGRPC(%q) = %t, want %t", ct, got, want)
		}
	}
}

func TestReply(t *testing.T) {
	in := [][2]string{{":status", "429"}, {"retry-after", "1"}, {"content-type", "application/problem+json"}, {"content-length", "12"}}
	body := []byte(`{"a":"50% ~é"}`)
	got := Reply(in, body, -1)
	want := [][2]string{{":status", "200"}, {"retry-after", "1"}, {"content-type", "application/grpc"},
		{"grpc-status", "14"}, {"grpc-message", `{"a":"50%25 %7E%C3%A9"}`}}
	if !slices.Equal(got, want) {
		t.Errorf("Reply with no status named:\n got %v\nwant %v", got, want)
	}
	if in[0][1] != "429" {
		t.Errorf("Reply changed its argument: %v", in)
	}
	got = Reply([][2]string{{":status", "429"}}, nil, ResourceExhausted)
	want = [][2]string{{":status", "200"}, {"content-type", "application/grpc"}, {"grpc-status", "8"}}
	if !slices.Equal(got, want) {
		t.Errorf("Reply with RESOURCE_EXHAUSTED:\n got %v\nwant %v", got, want)
	}
	// A status past the known ones is none: the HTTP status decides.
	if got := Reply([][2]string{{":status", "403"}}, nil, 17); got[2] != [2]string{"grpc-status", "7"} {
		t.Errorf("Reply with grpc_status 17: %v", got)
	}
	// A grpc-status among the plugin's headers wins.
	if got := Reply([][2]string{{":status", "429"}, {"grpc-status", "8"}}, nil, -1); len(got) != 3 || got[1] != [2]string{"grpc-status", "8"} {
		t.Errorf("Reply with the plugin's grpc-status: %v", got)
	}
}

func TestIsGRPCWeb(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/grpc-web":            true,
		"application/grpc-web+proto":      true,
		"application/grpc-web+json":       true,
		"application/grpc-web-text":       true,
		"application/grpc-web-text+proto": true,
		"application/grpc":                false, // gRPC, which Envoy answers itself
		"application/grpc+proto":          false,
		"application/grpc-webx":           false,
		"application/grpc-web-textual":    false,
		"application/grpc-web-text-":      false,
		"Application/grpc-web":            false,
		"":                                false,
	} {
		if got := IsGRPCWeb(ct); got != want {
			t.Errorf("IsGRPCWeb(%q) = %t, want %t", ct, got, want)
		}
	}
}

func TestAppendWebTrailers(t *testing.T) {
	// A frame: 0x80, the block's length (big-endian), the block.
	block := "grpc-status:8\r\ngrpc-message:50%25 %7E\r\ngrpc-retry-pushback-ms:1000\r\n"
	want := append([]byte{0x80, 0, 0, 0, byte(len(block))}, block...)
	got := AppendWebTrailers([]byte("kept"), ResourceExhausted, []byte("50% ~"), false, "grpc-retry-pushback-ms", "1000")
	if string(got) != "kept"+string(want) {
		t.Errorf("binary:\n got %q\nwant %q", got, "kept"+string(want))
	}
	// -text: the frame in base64, after what dst held.
	got = AppendWebTrailers([]byte("kept"), ResourceExhausted, []byte("50% ~"), true, "grpc-retry-pushback-ms", "1000")
	if string(got) != "kept"+base64.StdEncoding.EncodeToString(want) {
		t.Errorf("text:\n got %q\nwant %q", got, "kept"+base64.StdEncoding.EncodeToString(want))
	}
	// No message: no grpc-message; a two-digit status.
	got = AppendWebTrailers(nil, Unauthenticated, nil, false)
	if block := "grpc-status:16\r\n"; string(got) != string(append([]byte{0x80, 0, 0, 0, byte(len(block))}, block...)) {
		t.Errorf("no message: %q", got)
	}
}
