package wasmhost

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// ErrPluginRemoved is returned for a plugin that Remove has ended, or is
// ending.
var ErrPluginRemoved = errors.New("wasm plugin removed")

// Plugin is one plugin configuration running in a VM: its own root
// context, configuration, tick timer and streams. Envoy runs every plugin
// of the same vm_id and code in the same VM on a worker: a listener update
// that changes the plugin's configuration keeps the VM and starts a second
// root context beside the first, which ends once the old listener has
// drained. VM.Configure starts the VM's first plugin; AddPlugin starts
// more. Its methods may be called from any goroutine.
type Plugin struct {
	vm     *VM
	name   string
	rootID string
	id     uint32 // the root context's id, fixed when the plugin is made

	// Touched only by the VM's tasks.
	root        *vmContext
	config      string
	configured  bool // proxy_on_configure accepted a configuration
	draining    bool // Remove was called: it ends once its last stream has
	pendingDone bool // proxy_on_done returned false: proxy_done ends it
	gone        bool // proxy_on_delete ran, or the root context was dropped
	streams     int  // stream contexts alive under it
	tickPeriod  time.Duration
	tickStop    func() bool
	tickGen     int
}

// AddPlugin starts another plugin in this VM, as Envoy does for a plugin
// whose vm_id and code match a running VM's: a new root context, then
// proxy_on_context_create, proxy_on_vm_start and proxy_on_configure with
// its configuration. A false return from either wraps ErrConfigRejected,
// and the plugin is ended again (proxy_on_done, proxy_on_delete); a trap
// fails the VM and is returned. The VM's other plugins are not touched.
func (vm *VM) AddPlugin(name, rootID, config string) (*Plugin, error) {
	var (
		p   *Plugin
		err error
	)
	if e := vm.do(func() {
		if vm.failed.Load() {
			err = vm.Err()
			return
		}
		p = vm.newPlugin(name, rootID)
		if err = p.configure(config); err != nil {
			// Envoy tries a new configuration in a canary VM before its
			// workers get it, so no worker keeps a plugin that refused it.
			vm.shutdown(p)
			p = nil
		}
	}); e != nil {
		return nil, e
	}
	return p, err
}

// Plugin returns the plugin VM.Configure started, or nil before it.
func (vm *VM) Plugin() *Plugin {
	var p *Plugin
	vm.do(func() { p = vm.plugin })
	return p
}

func (vm *VM) newPlugin(name, rootID string) *Plugin {
	p := &Plugin{vm: vm, name: name, rootID: rootID}
	p.root = vm.newContext(0)
	p.root.plugin = p
	p.id = p.root.id
	vm.plugins = append(vm.plugins, p)
	return p
}

// configure starts the plugin's root context as cpp-host's start and
// configure do: proxy_on_context_create (with the plugin configuration
// readable, Envoy's temp_plugin_) and proxy_on_vm_start the first time,
// then proxy_on_configure. On the VM's goroutine.
func (p *Plugin) configure(config string) error {
	vm := p.vm
	if p.draining || p.gone {
		return ErrPluginRemoved
	}
	p.config = config
	root := p.root
	vm.configuring = &p.config
	if !root.created {
		root.created = true
		vm.callDrain(root, onContextCreate, uint64(root.id), 0)
	}
	vm.configuring = nil
	if !p.configured {
		// Not readable here: cpp-host runs on_vm_start without the plugin.
		if r, ok := vm.callDrain(root, onVMStart, uint64(root.id), uint64(len(vm.o.VMConfig))); ok && r == 0 {
			return fmt.Errorf("proxy_on_vm_start returned false: %w", ErrConfigRejected)
		}
	}
	if vm.failed.Load() {
		return vm.Err()
	}
	vm.configuring = &p.config
	r, ok := vm.callDrain(root, onConfigure, uint64(root.id), uint64(len(config)))
	vm.configuring = nil
	if vm.failed.Load() {
		return vm.Err()
	}
	if ok && r == 0 {
		return fmt.Errorf("proxy_on_configure returned false: %w", ErrConfigRejected)
	}
	p.configured = true
	return nil
}

// Configure runs proxy_on_configure on the plugin's root context again,
// with config; VM.Configure for this plugin.
func (p *Plugin) Configure(config string) error {
	var err error
	if e := p.vm.do(func() {
		if p.vm.failed.Load() {
			err = p.vm.Err()
			return
		}
		err = p.configure(config)
	}); e != nil {
		return e
	}
	return err
}

// RootContextID returns the id of the plugin's root context, the parent
// of its streams.
func (p *Plugin) RootContextID() uint32 { return p.id }

// Name returns the plugin's name.
func (p *Plugin) Name() string { return p.name }

// RootID returns the plugin's root_id.
func (p *Plugin) RootID() string { return p.rootID }

// NewStream opens a stream context under this plugin's root context and
// waits until it exists; ErrPluginRemoved once Remove was called.
func (p *Plugin) NewStream(info StreamInfo) (*Stream, error) {
	s := p.OpenStream(info)
	if err := s.open(); err != nil {
		return nil, err
	}
	return s, nil
}

// OpenStream is VM.OpenStream for a stream of this plugin. A stream whose
// first call comes after Remove is reset without reaching the plugin.
func (p *Plugin) OpenStream(info StreamInfo) *Stream {
	s := p.vm.OpenStream(info)
	s.plugin = p
	return s
}

// Tick runs proxy_on_tick on the plugin's root context now.
func (p *Plugin) Tick() error { return p.vm.do(p.onTick) }

// TickPeriod returns the period the plugin set with
// proxy_set_tick_period_milliseconds (0: none).
func (p *Plugin) TickPeriod() time.Duration {
	var d time.Duration
	p.vm.do(func() { d = p.tickPeriod })
	return d
}

// Remove ends the plugin as Envoy does once nothing uses its configuration
// any more (the listener that had it has drained): when its last stream
// has ended, at once if none is left, proxy_on_done and proxy_on_delete run
// on its root context, its tick stops, and the HTTP calls it still waits
// for are cancelled without a callback. A root context whose
// proxy_on_done returns false stays, ticks and calls included, until it
// calls proxy_done. The VM and its other plugins go on. Safe to call more
// than once.
func (p *Plugin) Remove() error {
	return p.vm.do(func() {
		if p.draining || p.gone {
			return
		}
		p.draining = true
		if p.streams == 0 {
			p.vm.shutdown(p)
		}
	})
}

// Removed reports whether the plugin has ended: its root context deleted.
func (p *Plugin) Removed() bool {
	var gone bool
	if p.vm.do(func() { gone = p.gone }) != nil {
		return true
	}
	return gone
}

// shutdown is cpp-host's startShutdown for one plugin: proxy_on_done, then
// proxy_on_delete unless on_done asked to wait for proxy_done. On the VM's
// goroutine.
func (vm *VM) shutdown(p *Plugin) {
	if p.gone || p.pendingDone {
		return
	}
	root := p.root
	if root.created && !vm.failed.Load() {
		if r, ok := vm.callDrain(root, onDone, uint64(root.id)); ok && r == 0 {
			p.pendingDone = true
			return
		}
		vm.callDrain(root, onDelete, uint64(root.id))
	}
	vm.drop(p)
}

// done is proxy_done from context c: a root context kept after its
// proxy_on_done returned false is deleted once the current call returns,
// as cpp-host defers it; any other context gets NOT_FOUND.
func (vm *VM) done(c *vmContext) Status {
	p := c.plugin
	if p == nil || !p.pendingDone || p.gone {
		return StatusNotFound
	}
	p.pendingDone = false
	vm.defer_(func() {
		if !vm.failed.Load() {
			vm.callDrain(p.root, onDelete, uint64(p.root.id))
		}
		vm.drop(p)
	})
	return StatusOK
}

// drop forgets an ended plugin: its tick, the HTTP calls its root context
// waits for (cancelled, as Envoy's context cancels its requests when it is
// destroyed), the root context itself.
func (vm *VM) drop(p *Plugin) {
	p.gone = true
	p.stopTick()
	for token, c := range vm.calls {
		if c.root == p.root {
			c.finish()
			delete(vm.calls, token)
		}
	}
	delete(vm.contexts, p.root.id)
	vm.plugins = slices.DeleteFunc(vm.plugins, func(q *Plugin) bool { return q == p })
}

// streamEnded counts down the plugin's streams; the last one ends a plugin
// being removed.
func (p *Plugin) streamEnded() {
	p.streams--
	if p.draining && p.streams == 0 {
		p.vm.shutdown(p)
	}
}

func (p *Plugin) onTick() {
	if p.gone || p.vm.failed.Load() {
		return
	}
	p.vm.callDrain(p.root, onTick, uint64(p.root.id))
}

// setTickPeriod is proxy_set_tick_period_milliseconds: Envoy keeps a timer
// per root context.
func (p *Plugin) setTickPeriod(d time.Duration) {
	p.tickPeriod = d
	p.stopTick()
	if d > 0 && !p.vm.o.ManualTicks {
		p.armTick(p.tickGen)
	}
}

func (p *Plugin) stopTick() {
	p.tickGen++
	if p.tickStop != nil {
		p.tickStop()
		p.tickStop = nil
	}
}

// armTick schedules the next tick; like Envoy it re-arms the timer after
// each proxy_on_tick returns, so the period runs from the end of a tick.
func (p *Plugin) armTick(gen int) {
	vm := p.vm
	p.tickStop = vm.o.Clock.AfterFunc(p.tickPeriod, func() {
		vm.post(func() {
			if gen != p.tickGen || vm.failed.Load() {
				return
			}
			p.onTick()
			if gen == p.tickGen && p.tickPeriod > 0 {
				p.armTick(gen)
			}
		})
	})
}
