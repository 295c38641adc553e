package testkit

import (
	"sync"
	"testing"
)

// Load is a number of workers that each call the same function over and
// over until stopped: traffic that runs while a test changes something
// under it.
type Load struct {
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

// StartLoad starts workers goroutines; worker w calls f(w, i) for i = 0, 1,
// 2, … until Stop, which t's cleanup calls too, so that no worker outlives
// the test. f reports a failure with t.Error (never t.Fatal: it does not
// run on the test's goroutine) or by counting it.
func StartLoad(t testing.TB, workers int, f func(w, i int)) *Load {
	l := &Load{stop: make(chan struct{})}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				f(w, i)
			}
		}()
	}
	t.Cleanup(l.Stop)
	return l
}

// Stop ends the load and returns once every worker's last call has
// returned. Calls after the first only wait.
func (l *Load) Stop() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}
