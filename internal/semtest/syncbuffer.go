package semtest

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer safe to write from one goroutine (a child
// process's output, a logger) while a test reads it from another.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
