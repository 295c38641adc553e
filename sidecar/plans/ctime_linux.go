package plans

import (
	"os"
	"syscall"
	"time"
)

// changeTime is fi's inode change time (ctime): set by the kernel on every
// write, chmod, rename and create, and never set back by a tool, unlike the
// modification time, which cp -p, rsync -t and tar put back to the
// source's.
func changeTime(fi os.FileInfo) time.Time {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return time.Unix(st.Ctim.Sec, st.Ctim.Nsec)
	}
	return fi.ModTime()
}
