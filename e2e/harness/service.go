package harness

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Service is an upstream HTTP service that answers every request with 200
// and counts what reached it, per client, so a test can prove that a
// rejected request never arrived.
type Service struct {
	Name string
	Addr string

	srv *http.Server
	mu  sync.Mutex
	got map[string]int64
	hdr map[string]map[string]int64 // client → value of the shadow header → count
}

// ShadowHeader is the request header in which the filter tells a service,
// in shadow mode, what it would have decided.
const ShadowHeader = "x-ratelimit-shadow"

// StartService listens on addr ("127.0.0.1:0" for any free port).
func StartService(name, addr string) (*Service, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Service{Name: name, Addr: l.Addr().String(), got: map[string]int64{}, hdr: map[string]map[string]int64{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /_stats", s.stats)
	mux.HandleFunc("/", s.serve)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go s.srv.Serve(l)
	return s, nil
}

// Client names the client of r as the filter does: the x-api-key header,
// else the bearer token.
func Client(r *http.Request) string {
	if k := r.Header.Get("x-api-key"); k != "" {
		return k
	}
	if a := r.Header.Get("authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		return strings.TrimSpace(a[7:])
	}
	return ""
}

func (s *Service) serve(w http.ResponseWriter, r *http.Request) {
	c := Client(r)
	s.mu.Lock()
	s.got[c]++
	if v := r.Header.Get(ShadowHeader); v != "" {
		if s.hdr[c] == nil {
			s.hdr[c] = map[string]int64{}
		}
		s.hdr[c][v]++
	}
	s.mu.Unlock()
	w.Header().Set("content-type", "application/json")
	json.NewEncoder(w).Encode(map[string]string{"service": s.Name, "path": r.URL.Path})
}

func (s *Service) stats(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.Header().Set("content-type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"service": s.Name, "received": s.got})
}

// Received returns how many requests of client reached the service.
func (s *Service) Received(client string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got[client]
}

// Total returns how many requests reached the service.
func (s *Service) Total() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, v := range s.got {
		n += v
	}
	return n
}

// Shadow returns how many requests of client arrived with the shadow
// header set to value.
func (s *Service) Shadow(client, value string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hdr[client][value]
}

// Close stops the service.
func (s *Service) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}
