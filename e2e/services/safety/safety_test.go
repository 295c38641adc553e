package safety

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/e2e/services/bucket"
)

var testPlans = Plans(func(client string) (bucket.Limit, bool) {
	switch client {
	case "free":
		return bucket.Limit{Capacity: 2, Rate: 1}, true
	case "pro":
		return bucket.Limit{Capacity: 5, Rate: 4}, true
	}
	return bucket.Limit{}, false
})

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestHandler(t *testing.T) {
	tests := []struct {
		name    string
		factor  float64
		client  string
		header  string // where the key goes
		send    int
		passed  int // reach the service
		retry   string
		counted bool
	}{
		// 10x a plan of capacity 2: a burst of 20, then the bucket refills
		// at 10/s, so the next token is 0.1 s away: Retry-After 1.
		{"default factor is 10x the burst", 0, "free", "x-api-key", 25, 20, "1", true},
		{"factor 3", 3, "pro", "x-api-key", 20, 15, "1", true},
		{"bearer keys are limited too", 0, "free", "authorization", 21, 20, "1", true},
		{"a client without a plan passes", 0, "nobody", "x-api-key", 100, 100, "", false},
		{"a request without a key passes", 0, "", "", 100, 100, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &clock{t: time.Unix(1e9, 0)}
			l, err := New(Config{Plans: testPlans, Factor: tt.factor, Clock: clk.now})
			if err != nil {
				t.Fatal(err)
			}
			var reached atomic.Int64
			h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached.Add(1) }))
			var denied int
			for i := 0; i < tt.send; i++ {
				r := httptest.NewRequest("GET", "/orders", nil)
				switch tt.header {
				case "x-api-key":
					r.Header.Set("x-api-key", tt.client)
				case "authorization":
					r.Header.Set("authorization", "Bearer "+tt.client)
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code == http.StatusTooManyRequests {
					denied++
					if got := w.Header().Get("retry-after"); got != tt.retry {
						t.Fatalf("retry-after %q, want %q", got, tt.retry)
					}
					var body struct{ Error string }
					if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body.Error != "safety_limit" {
						t.Fatalf("body %q: want error safety_limit (%v)", w.Body.String(), err)
					}
				}
			}
			if int(reached.Load()) != tt.passed || denied != tt.send-tt.passed {
				t.Fatalf("reached %d, denied %d; want %d and %d", reached.Load(), denied, tt.passed, tt.send-tt.passed)
			}
			c, ok := l.Counts()[tt.client]
			if ok != tt.counted {
				t.Fatalf("counted %v, want %v", ok, tt.counted)
			}
			if ok && (c.Passed != int64(tt.passed) || c.Denied != int64(denied)) {
				t.Fatalf("counts %+v, want passed %d denied %d", c, tt.passed, denied)
			}
		})
	}
}

func TestRefillsAtFactorTimesRate(t *testing.T) {
	clk := &clock{t: time.Unix(1e9, 0)}
	l, err := New(Config{Plans: testPlans, Clock: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		l.Allow("free")
	}
	if d, _ := l.Allow("free"); d.Allowed {
		t.Fatal("allowed past 10x the burst")
	}
	// Plan rate 1/s, so 10/s here: 0.5 s brings back 5 tokens.
	clk.t = clk.t.Add(500 * time.Millisecond)
	n := 0
	for i := 0; i < 10; i++ {
		if d, _ := l.Allow("free"); d.Allowed {
			n++
		}
	}
	if n != 5 {
		t.Fatalf("after 0.5 s %d passed, want 5", n)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		c    Config
		want string
	}{
		{Config{}, "plans: required"},
		{Config{Plans: testPlans, Factor: -1}, "factor: must be a finite number > 0, got -1"},
		{Config{Plans: testPlans, Factor: math.NaN()}, "factor: must be a finite number > 0, got NaN"},
		{Config{Plans: testPlans, Factor: math.Inf(1)}, "factor: must be a finite number > 0, got +Inf"},
	}
	for _, tt := range tests {
		if _, err := New(tt.c); err == nil || err.Error() != tt.want {
			t.Errorf("New(%+v): %v, want %q", tt.c, err, tt.want)
		}
	}
}

func TestDenyNeverHasNoRetryAfter(t *testing.T) {
	w := httptest.NewRecorder()
	Deny(w, bucket.Decision{Never: true}, 10)
	if w.Code != http.StatusTooManyRequests || w.Header().Get("retry-after") != "" || w.Header().Get("x-safety-limit") != "10x" {
		t.Fatalf("got %d, headers %v", w.Code, w.Header())
	}
}
