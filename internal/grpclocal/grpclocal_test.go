package grpclocal

import (
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
