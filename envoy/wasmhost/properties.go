package wasmhost

import (
	"encoding/binary"
	"net"
	"strconv"
	"strings"
)

// property answers proxy_get_property for the attributes this host knows:
// plugin_name, plugin_root_id, plugin_vm_id; for a stream request.path,
// request.url_path, request.host, request.scheme, request.method,
// request.query, request.id, request.useragent, request.referer,
// request.protocol, request.headers (a map, or one header by a further
// segment), source.address, source.port, destination.address,
// destination.port and response.code; and what the plugin stored with
// proxy_set_property. Strings come raw, integers as 8 bytes little-endian,
// as Envoy serializes them. Anything else is NOT_FOUND.
func (vm *VM) property(c *vmContext, path string) ([]byte, Status) {
	parts := strings.Split(strings.TrimSuffix(path, "\x00"), "\x00")
	str := func(s string) ([]byte, Status) { return []byte(s), StatusOK }
	name, rootID := vm.o.PluginName, vm.o.RootID
	if c.plugin != nil {
		name, rootID = c.plugin.name, c.plugin.rootID
	}
	switch parts[0] {
	case "plugin_name":
		return str(name)
	case "plugin_root_id":
		return str(rootID)
	case "plugin_vm_id":
		return str(vm.o.VMID)
	}
	st := c.stream
	if st == nil {
		return nil, StatusNotFound
	}
	if v, ok := c.props[parts[0]]; ok && len(parts) == 1 {
		return v, StatusOK
	}
	if len(parts) < 2 {
		return nil, StatusNotFound
	}
	attr := parts[0] + "." + parts[1]
	// Header-derived attributes exist while the plugin holds the request
	// headers, and in the access-log phase, as in Envoy.
	var req []Header
	if st.reqActive {
		req = st.reqHeaders
	} else if st.logPhase {
		req = st.logRequest
	}
	header := func(name string) ([]byte, Status) {
		for _, h := range req {
			if h[0] == name {
				return []byte(h[1]), StatusOK
			}
		}
		return nil, StatusNotFound
	}
	switch attr {
	case "request.path":
		return header(":path")
	case "request.url_path":
		p, s := header(":path")
		if s != StatusOK {
			return nil, s
		}
		u, _, _ := strings.Cut(string(p), "?")
		return []byte(u), StatusOK
	case "request.query":
		p, s := header(":path")
		if s != StatusOK {
			return nil, s
		}
		_, q, _ := strings.Cut(string(p), "?")
		return []byte(q), StatusOK
	case "request.host":
		return header(":authority")
	case "request.scheme":
		return header(":scheme")
	case "request.method":
		return header(":method")
	case "request.id":
		return header("x-request-id")
	case "request.useragent":
		return header("user-agent")
	case "request.referer":
		return header("referer")
	case "request.protocol":
		return str(st.info.Protocol)
	case "request.headers":
		if req == nil {
			return nil, StatusNotFound
		}
		if len(parts) == 3 {
			return header(strings.ToLower(parts[2]))
		}
		return EncodePairs(req), StatusOK
	case "source.address":
		return str(st.info.SourceAddr)
	case "source.port":
		return port(st.info.SourceAddr)
	case "destination.address":
		return str(st.info.DestinationAddr)
	case "destination.port":
		return port(st.info.DestinationAddr)
	case "response.code":
		if st.respCode == 0 {
			return nil, StatusNotFound
		}
		return int64Bytes(int64(st.respCode)), StatusOK
	}
	return nil, StatusNotFound
}

func port(addr string) ([]byte, Status) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, StatusNotFound
	}
	n, err := strconv.ParseInt(p, 10, 64)
	if err != nil {
		return nil, StatusNotFound
	}
	return int64Bytes(n), StatusOK
}

func int64Bytes(v int64) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, uint64(v))
	return b
}

// setProperty is proxy_set_property: Envoy keeps the value in the stream's
// filter state, so only a stream context has somewhere to put it.
func (vm *VM) setProperty(c *vmContext, key string, value []byte) Status {
	if c.stream == nil {
		return StatusNotFound
	}
	if c.props == nil {
		c.props = map[string][]byte{}
	}
	c.props[key] = value
	return StatusOK
}
