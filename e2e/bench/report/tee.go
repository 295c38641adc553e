package report

import (
	"io"
	"os"
	"path/filepath"
)

// Tee returns where a benchmark prints its report: standard output and,
// when path is not empty, also that file (its folder made if need be). The
// caller closes the returned closer when the report is written.
func Tee(path string) (io.Writer, io.Closer, error) {
	if path == "" {
		return os.Stdout, io.NopCloser(nil), nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, nil, err
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, nil, err
	}
	return io.MultiWriter(os.Stdout, f), f, nil
}
