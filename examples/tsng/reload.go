package tsng

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/vipkit/vipkit/transport/wg"
	"github.com/vipkit/vipkit/vip"
)

// A reload re-reads the config file and applies what changed in the
// networks' peers to the running agent: added peers get a WireGuard
// session and join replication and the control channel; removed peers
// leave all three (their backends show as departed); a peer's changed
// endpoint, address or keys take effect. Unchanged peers keep their
// WireGuard sessions, and so every NAT binding through them. A change of
// a network's backend_ports takes effect at once too: a port added is
// relayed from then on, and a port removed is refused, its relayed
// connections closed. Everything else is read at start only: a reload
// that changes it is refused with ErrRestartNeeded, naming the field, and
// changes nothing.

var (
	// ErrReloadBusy refuses a reload while another one runs.
	ErrReloadBusy = errors.New("tsng: a reload is already in progress; run it again when that one has ended")
	// ErrRestartNeeded refuses a reload that changes a setting read only
	// at start; the message names the field.
	ErrRestartNeeded = errors.New("tsng: restart needed")
	// errNoConfigPath refuses a reload of an agent not started from a
	// config file.
	errNoConfigPath = errors.New("tsng: this agent was not started from a config file; there is nothing to re-read")
)

// ReloadResult says what a reload changed.
type ReloadResult struct {
	// Changed is false when the file's peers were those in force.
	Changed  bool            `json:"changed"`
	Networks []NetworkReload `json:"networks"`
	// Note explains a reload without change that may surprise: a config
	// that is systemd's credential copy, which a reload does not refresh.
	Note string `json:"note,omitempty"`
}

// NetworkReload is one network's part of a reload.
type NetworkReload struct {
	Network string `json:"network"`
	// Added, Removed are the peers (by name) that joined and left.
	Added   []string `json:"added,omitempty"`
	Removed []string `json:"removed,omitempty"`
	// Changed lists a peer that stays with what changed, such as
	// "server2: endpoint".
	Changed []string `json:"changed,omitempty"`
	// BackendPortsChanged says that the reload changed the node's
	// backend_ports; BackendPorts then lists those now in force.
	BackendPortsChanged bool     `json:"backend_ports_changed,omitempty"`
	BackendPorts        []string `json:"backend_ports,omitempty"`
}

// Reloader is implemented by a Manager that can reload its config (the
// Daemon does); the API's reload call needs it.
type Reloader interface {
	Reload(ctx context.Context) (ReloadResult, error)
}

// Reload re-reads the config file the agent started from
// (DaemonOptions.ConfigPath) and applies it (ReloadConfig).
func (d *Daemon) Reload(ctx context.Context) (ReloadResult, error) {
	if d.o.ConfigPath == "" {
		return ReloadResult{}, errNoConfigPath
	}
	cfg, err := LoadConfig(d.o.ConfigPath)
	if err != nil {
		return ReloadResult{}, err
	}
	res, err := d.ReloadConfig(ctx, cfg)
	if err == nil && !res.Changed {
		res.Note = credentialNote(d.o.ConfigPath, os.Getenv("CREDENTIALS_DIRECTORY"))
	}
	return res, err
}

// credentialNote explains, for a config read from systemd's credentials
// directory, that the file is a copy made when the service started.
func credentialNote(path, credDir string) string {
	if credDir == "" {
		return ""
	}
	if rel, err := filepath.Rel(credDir, path); err != nil || strings.HasPrefix(rel, "..") {
		return ""
	}
	return fmt.Sprintf("the config %s is the copy systemd made of the credential when the service started; systemd copies it again only "+
		"at a restart, or at a reload when the unit sets RefreshOnReload=credentials (systemd 260 and later); "+
		"if you edited its source, restart the service (which drops NAT bindings) or use that setting", path)
}

// ReloadConfig applies cfg to the running agent: it validates cfg, refuses
// (ErrRestartNeeded) any change but to the networks' peers, backend_ports
// and stopped flags (stopped is read at the next start), refuses a peer address that
// is a VIP's address, and then applies each network's new peers. A
// refused config changes nothing. A second reload while one runs is
// refused with ErrReloadBusy.
func (d *Daemon) ReloadConfig(ctx context.Context, cfg *Config) (ReloadResult, error) {
	if !d.reloading.CompareAndSwap(false, true) {
		return ReloadResult{}, ErrReloadBusy
	}
	defer d.reloading.Store(false)
	d.opMu.Lock()
	defer d.opMu.Unlock()
	if d.closed {
		return ReloadResult{}, errors.New("tsng: the agent is stopping")
	}
	if err := cfg.Validate(); err != nil {
		return ReloadResult{}, err
	}
	plans, err := d.planReload(cfg)
	if err != nil {
		return ReloadResult{}, err
	}
	if d.o.reloadHook != nil {
		d.o.reloadHook()
	}
	res := ReloadResult{Networks: []NetworkReload{}}
	for _, p := range plans {
		res.Networks = append(res.Networks, p.report)
		if p.ports != nil {
			res.Changed = true
			p.n.applyBackendPorts(*p.ports)
		}
		if p.unchanged {
			continue
		}
		res.Changed = true
		if err := p.n.applyReload(ctx, p); err != nil {
			return res, fmt.Errorf("tsng: network %s: %w", p.n.cfg.Name, err)
		}
		d.log.Info("config reloaded", "network", p.n.cfg.Name, "added", p.report.Added, "removed", p.report.Removed, "changed", p.report.Changed,
			"members", len(p.ms.members))
	}
	d.running = cfg
	for i, nc := range cfg.Networks {
		d.Runtime(nc.Name).index.Store(int32(i)) // planReload found each
	}
	if !res.Changed {
		d.log.Info("config reloaded: no change")
	}
	return res, nil
}

// netPlan is what a reload changes in one network.
type netPlan struct {
	n  *netRuntime
	ms *membership // the new member set
	// keep are the peers (by WireGuard key) whose endpoint stays as the
	// device has it (it may have roamed).
	keep map[wg.Key]bool
	// forget are the members whose control-channel state goes: those that
	// left and those whose address or WireGuard key changed.
	forget []vip.NodeID
	report NetworkReload
	// unchanged: the peers stay as they are.
	unchanged bool
	// ports are the new backend_ports; nil when they stay.
	ports *[]string
}

// planReload checks cfg against the config in force and returns each
// network's plan. It changes nothing.
//
// +checklocks:d.opMu
func (d *Daemon) planReload(cfg *Config) ([]*netPlan, error) {
	if f := changedField(*d.running, *cfg, "networks"); f != "" {
		return nil, restart(f)
	}
	byName := map[string]int{}
	for i, nc := range cfg.Networks {
		byName[nc.Name] = i
	}
	for _, n := range d.nets {
		if _, ok := byName[n.cfg.Name]; !ok {
			return nil, fmt.Errorf("%w: network %s is no longer in the config; a reload neither adds nor removes networks: restart the agent to apply it", ErrRestartNeeded, n.cfg.Name)
		}
	}
	var plans []*netPlan
	for i, nc := range cfg.Networks {
		n := d.Runtime(nc.Name)
		where := fmt.Sprintf("networks[%d] (%s)", i, nc.Name)
		if n == nil {
			return nil, fmt.Errorf("%w: %s is a new network; a reload neither adds nor removes networks: restart the agent to apply it", ErrRestartNeeded, where)
		}
		if f := changedField(n.cfg, nc, "peers", "stopped", "backend_ports"); f != "" {
			return nil, restart(where + "." + f)
		}
		p, err := n.planPeers(where, nc)
		if err != nil {
			return nil, err
		}
		if !slices.Equal(n.backendPortsNow(), nc.BackendPorts) {
			p.ports = &nc.BackendPorts
			p.report.BackendPortsChanged = true
			p.report.BackendPorts = nc.BackendPorts
		}
		plans = append(plans, p)
	}
	return plans, nil
}

// restart refuses a reload that changes field, which is read at start
// only.
func restart(field string) error {
	return fmt.Errorf("%w: %s changed; a reload applies only the networks' peers and backend_ports: restart the agent (systemctl restart tsng) to apply it", ErrRestartNeeded, field)
}

// planPeers diffs nc's peers (validated) against the member set in force.
func (n *netRuntime) planPeers(where string, nc NetworkConfig) (*netPlan, error) {
	cur := n.ms()
	members, err := nc.Members()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrConfig, where, err)
	}
	// A new member address that a VIP uses would move that VIP (node
	// addresses win), breaking its flows: refused here, where at start it
	// is only reported.
	res := n.reg.Reservations()
	for i, m := range members[1:] {
		if _, ok := cur.byAddr[m.Addr]; ok {
			continue
		}
		for _, r := range res {
			if r.Addr == m.Addr || r.Reserved == m.Addr {
				return nil, fmt.Errorf("%w: %s.peers[%d] (%s).address %v is the address of VIP %s (id %s): the VIP would move and its flows break; give the node another address",
					ErrConfig, where, i, nc.Peers[i].Name, m.Addr, r.Name, r.Service)
			}
		}
	}
	known := append(slices.Clone(cur.members), cur.former...)
	p := &netPlan{n: n, ms: newMembership(members, nc.Peers, formerNodes(known, members, n.reg.List())), keep: map[wg.Key]bool{},
		report: NetworkReload{Network: nc.Name}}
	for i, pc := range nc.Peers {
		m := members[i+1]
		old, oldInfo, ok := cur.peer(m.ID)
		if !ok {
			p.report.Added = append(p.report.Added, pc.Name)
			continue
		}
		var what []string
		if old.Name != pc.Name {
			what = append(what, "name")
		}
		if oldInfo.Addr != m.Addr {
			what = append(what, "address")
		}
		if old.WireGuardKey != pc.WireGuardKey {
			what = append(what, "wireguard_key")
		}
		if old.Endpoint != pc.Endpoint {
			what = append(what, "endpoint")
		}
		if oldInfo.Addr != m.Addr || old.WireGuardKey != pc.WireGuardKey {
			p.forget = append(p.forget, m.ID)
		}
		if old.WireGuardKey == pc.WireGuardKey && old.Endpoint == pc.Endpoint {
			p.keep[pc.WireGuardKey] = true
		}
		if len(what) > 0 {
			p.report.Changed = append(p.report.Changed, pc.Name+": "+strings.Join(what, ", "))
		}
	}
	for i, m := range cur.members[1:] {
		if _, ok := p.ms.byID[m.ID]; !ok {
			p.report.Removed = append(p.report.Removed, cur.peers[i].Name)
			p.forget = append(p.forget, m.ID)
		}
	}
	p.unchanged = len(p.report.Added)+len(p.report.Removed)+len(p.report.Changed) == 0
	return p, nil
}

// applyReload applies a network's plan. The crdt members change first,
// then the WireGuard peers (a refusal there puts the members back and
// changes nothing else), then the member set in force; the control
// channel forgets the members that left or changed, and the registry and
// the engine follow. Only the device update runs under n.mu (so that a
// concurrent start builds its device from one member set or the other);
// nothing is closed and no callback runs with it held.
func (n *netRuntime) applyReload(ctx context.Context, p *netPlan) error {
	old := n.ms()
	if err := n.replica.SetMembers(ctx, authorsOf(p.ms.members)); err != nil {
		return fmt.Errorf("storing the member set: %w", err)
	}
	n.mu.Lock()
	if n.dev != nil {
		if err := n.dev.Configure(p.ms.wgConfig(n.cfg.Node, func(pc PeerConfig) bool { return p.keep[pc.WireGuardKey] })); err != nil {
			n.mu.Unlock()
			// The members go back as they were; the context may have
			// ended, and the old set must be restored all the same.
			if rerr := n.replica.SetMembers(context.WithoutCancel(ctx), authorsOf(old.members)); rerr != nil {
				return fmt.Errorf("wireguard: %w (and restoring the member set: %v)", err, rerr)
			}
			return fmt.Errorf("wireguard: %w", err)
		}
	}
	n.mship.Store(p.ms)
	control, eng := n.control, n.engine
	n.mu.Unlock()
	if control != nil {
		for _, id := range p.forget {
			control.ForgetPeer(id)
		}
	}
	path := knownNodesPath(n.d.cfg.DataDir, n.cfg.Name)
	if err := saveKnownNodes(path, p.ms.members, p.ms.former); err != nil {
		// Names of departed members only: the reload stands.
		n.d.log.Warn("writing the known-nodes file failed", "network", n.cfg.Name, "path", path, "err", err)
	}
	n.reg.Refresh()
	if eng != nil {
		if err := eng.Apply(); err != nil && !errors.Is(err, vip.ErrEngineClosed) {
			n.d.log.Warn("routing update failed", "network", n.cfg.Name, "err", err)
		}
	}
	n.reportCollisions()
	return nil
}

// changedField returns the JSON name of the first field in which a and b
// (structs of one type) differ, descending into struct fields ("node.
// listen_port"), skipping the fields named in skip; "" if none.
func changedField(a, b any, skip ...string) string {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	t := va.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name // limits' fields are Go names
		}
		if name == "-" || slices.Contains(skip, name) {
			continue
		}
		fa, fb := va.Field(i), vb.Field(i)
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[netip.Addr]() {
			if sub := changedField(fa.Interface(), fb.Interface()); sub != "" {
				return name + "." + sub
			}
			continue
		}
		if !reflect.DeepEqual(fa.Interface(), fb.Interface()) {
			return name
		}
	}
	return ""
}
