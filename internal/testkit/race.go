//go:build race

package testkit

// Race is true under the race detector, which makes Go code several times
// slower: a test that holds Go code to a shipped deadline may give it more
// there, saying why beside it.
const Race = true
