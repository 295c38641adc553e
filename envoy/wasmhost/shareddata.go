package wasmhost

import "sync"

// SharedData is the key/value store behind proxy_get_shared_data and
// proxy_set_shared_data. As in Envoy it is process-wide and partitioned by
// vm_id, so the VMs of every worker that share a vm_id see one store. Each
// successful set gives the value a new CAS number; a set with a non-zero
// CAS that differs from the stored value's fails with CAS_MISMATCH.
type SharedData struct {
	mu   sync.Mutex
	cas  uint32
	data map[string]map[string]sharedValue
}

type sharedValue struct {
	value []byte
	cas   uint32
}

// DefaultSharedData is the process-wide store VMs use unless
// Options.SharedData says otherwise.
var DefaultSharedData = NewSharedData()

// NewSharedData returns an empty store.
func NewSharedData() *SharedData {
	return &SharedData{cas: 1, data: map[string]map[string]sharedValue{}}
}

// Get returns a copy of the value under key in vmID's partition and its CAS.
func (s *SharedData) Get(vmID, key string) ([]byte, uint32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.data[vmID][key]
	if !ok {
		return nil, 0, false
	}
	return append([]byte(nil), v.value...), v.cas, true
}

// Set stores value under key; cas 0 sets unconditionally.
func (s *SharedData) Set(vmID, key string, value []byte, cas uint32) Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.data[vmID]
	if m == nil {
		m = map[string]sharedValue{}
		s.data[vmID] = m
	}
	if old, ok := m[key]; ok && cas != 0 && cas != old.cas {
		return StatusCASMismatch
	}
	m[key] = sharedValue{value: append([]byte(nil), value...), cas: s.nextCAS()}
	return StatusOK
}

func (s *SharedData) nextCAS() uint32 {
	c := s.cas
	s.cas++
	if s.cas == 0 { // 0 means "no CAS" and is never handed out
		s.cas++
	}
	return c
}
