//go:build !linux

package wasmhost

// socketUnread is 0 where the host does not ask the socket: a timeout then
// goes by what the reader has received.
func socketUnread(int) int { return 0 }

// socketEnded is false where the host does not ask the socket.
func socketEnded(int) bool { return false }
