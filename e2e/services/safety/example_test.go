package safety_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/edgelimit/edgelimit/e2e/services/bucket"
	"github.com/edgelimit/edgelimit/e2e/services/safety"
)

// A service keeps a backstop of 10x each client's plan in front of its
// handler.
func Example() {
	plans := func(client string) (bucket.Limit, bool) {
		// A burst of 2, then one request every 1000 s.
		return bucket.Limit{Capacity: 2, Rate: 0.001}, client != ""
	}
	limit, err := safety.New(safety.Config{Plans: plans}) // Factor defaults to 10
	if err != nil {
		panic(err)
	}
	h := limit.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
	}))

	codes := map[int]int{}
	for i := 0; i < 25; i++ {
		r := httptest.NewRequest("GET", "/orders", nil)
		r.Header.Set("x-api-key", "client-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		codes[w.Code]++
	}
	fmt.Println("200:", codes[200], "429:", codes[429])
	// Output: 200: 20 429: 5
}
