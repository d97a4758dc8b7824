package tsng

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/vipkit/vipkit/crdt"
	"github.com/vipkit/vipkit/crdt/pebblestore"
	"github.com/vipkit/vipkit/internal/jsonx"
	"github.com/vipkit/vipkit/vip"
)

// ReservationsDoc is the body of GET /v1/networks/{net}/reservations: the
// network's members and VIP address reservations as the agent knows them,
// and the members whose address is a VIP's reservation.
type ReservationsDoc struct {
	Network      string              `json:"network"`
	ID           string              `json:"id"`
	Overlay      string              `json:"overlay"`
	Nodes        []NodeDoc           `json:"nodes"`
	Reservations []vip.Reservation   `json:"reservations"`
	Collisions   []vip.AddrCollision `json:"collisions,omitempty"`
}

func (s *APIServer) reservations(w http.ResponseWriter, r *http.Request) {
	n, err := s.network(r.PathValue("net"))
	if err != nil {
		writeErr(w, err)
		return
	}
	d := ReservationsDoc{Network: n.Name, ID: n.ID, Overlay: n.Registry.Prefix().String(), Nodes: []NodeDoc{},
		Reservations: n.Registry.Reservations(), Collisions: n.Registry.AddrCollisions()}
	for _, m := range n.Registry.Nodes() {
		d.Nodes = append(d.Nodes, NodeDoc{ID: m.ID, Name: m.Name, Addr: m.Addr.String()})
	}
	jsonx.WriteIndent(w, http.StatusOK, d)
}

// collisionOf returns the collision of service id's reservation with a
// member's address, or nil (the API's documents carry it).
func collisionOf(reg *vip.Registry, id vip.ServiceID) *vip.AddrCollision {
	for _, c := range reg.AddrCollisions() {
		if c.Service == id {
			return &c
		}
	}
	return nil
}

// knownState is what a command outside the agent could learn about a
// network's VIP reservations, and from where.
type knownState struct {
	// source says where the reservations come from; empty when nothing
	// was known, and then why says what was tried.
	source       string
	why          []string
	reservations []vip.Reservation
	nodes        []vip.NodeInfo // the agent's members (only from an agent)
	// services are the network's VIPs from the same source; nil when
	// they could not be read.
	services []vip.Service
}

// learnReservations asks the agent on socket for network nc's
// reservations, and without an agent that runs nc reads them from the
// stored state in dataDir (never creating anything there).
func learnReservations(ctx context.Context, socket, dataDir string, nc NetworkConfig) knownState {
	var k knownState
	id, err := nc.NetworkID()
	if err != nil {
		k.why = append(k.why, err.Error())
		return k
	}
	hexID := fmt.Sprintf("%x", id[:])
	var d ReservationsDoc
	err = NewClient(socket).Do(ctx, http.MethodGet, "/v1/networks/"+url.PathEscape(nc.Name)+"/reservations", nil, &d)
	var ae *APIError
	switch {
	case err == nil && d.ID == hexID:
		k.source = "the running agent (" + socket + ")"
		k.reservations = d.Reservations
		for _, n := range d.Nodes {
			a, _ := netip.ParseAddr(n.Addr)
			k.nodes = append(k.nodes, vip.NodeInfo{ID: n.ID, Name: n.Name, Addr: a})
		}
		var docs []ServiceDoc
		if NewClient(socket).Do(ctx, http.MethodGet, "/v1/networks/"+url.PathEscape(nc.Name)+"/vips", nil, &docs) == nil {
			k.services = []vip.Service{}
			for _, d := range docs {
				k.services = append(k.services, d.Service)
			}
		}
		return k
	case err == nil:
		k.why = append(k.why, fmt.Sprintf("the agent on %s runs another network named %s (id %s)", socket, nc.Name, d.ID))
	case errors.As(err, &ae) && ae.Code == CodeNotFound:
		k.why = append(k.why, fmt.Sprintf("the agent on %s does not run network %s", socket, nc.Name))
	case errors.Is(err, ErrAgentUnreachable):
		k.why = append(k.why, "no agent answers on "+socket)
	default:
		k.why = append(k.why, fmt.Sprintf("the agent on %s: %v", socket, err))
	}
	res, svcs, err := storedReservations(ctx, dataDir, nc, id)
	if err != nil {
		k.why = append(k.why, err.Error())
		return k
	}
	k.source = "the stored state in " + filepath.Join(dataDir, nc.Name)
	k.reservations, k.services = res, svcs
	return k
}

// storedReservations reads the reservations and services of a network's
// stored state, holding the data directory's lock meanwhile (an agent that
// holds it is asked instead).
func storedReservations(ctx context.Context, dataDir string, nc NetworkConfig, id crdt.NetworkID) ([]vip.Reservation, []vip.Service, error) {
	dir := filepath.Join(dataDir, nc.Name)
	if ents, err := os.ReadDir(dir); errors.Is(err, fs.ErrNotExist) || (err == nil && len(ents) == 0) {
		return nil, nil, fmt.Errorf("%s holds no stored state for %s", dataDir, nc.Name)
	} else if err != nil {
		return nil, nil, fmt.Errorf("stored state in %s: %w", dir, err)
	}
	// Opening the store may write to it (pebble replays its log): only
	// its owner does, so that no file of another user's agent changes
	// hands.
	if fi, err := os.Stat(dir); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
			return nil, nil, fmt.Errorf("the stored state in %s belongs to uid %d; run this as that user, or with its agent running", dir, st.Uid)
		}
	}
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return nil, nil, fmt.Errorf("stored state in %s: %v", dir, strings.TrimPrefix(err.Error(), "tsng: "))
	}
	defer lock.Close()
	store, err := pebblestore.Open(ctx, dir, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("stored state in %s: %w", dir, err)
	}
	vl := nc.Limits.WithDefaults()
	lim := crdt.Limits{MaxServices: vl.ActiveServices, MaxTombstones: vl.Tombstones, MaxFieldsPerService: vl.FieldsPerService}
	if nc.MaxFrame > 0 {
		lim.MaxSnapshotBytes = nc.MaxFrame
	}
	rep, err := crdt.Open(ctx, crdt.Config{Network: id, Store: store, Limits: lim, Obsolete: vip.Obsolete})
	if err != nil {
		store.Close()
		return nil, nil, fmt.Errorf("stored state in %s: %w", dir, err)
	}
	defer rep.Close()
	members, _ := nc.Members() // nil for `init`'s draft of a config
	prefix, err := netip.ParsePrefix(nc.Overlay)
	if err != nil {
		return nil, nil, fmt.Errorf("overlay %q: %w", nc.Overlay, err)
	}
	reg, err := vip.NewRegistry(vip.RegistryOptions{Network: nc.Name, Prefix: prefix, Replica: rep, Nodes: func() []vip.NodeInfo { return members }})
	if err != nil {
		return nil, nil, err
	}
	svcs := []vip.Service{}
	for _, v := range reg.List() {
		svcs = append(svcs, v.Service)
	}
	return reg.Reservations(), svcs, nil
}

// checkCollisions returns a config network's collisions with what is
// known of its reservations: each member whose address is a VIP's stored
// reservation or the address a VIP uses now.
func checkCollisions(where string, nc NetworkConfig, k knownState) []string {
	members, err := nc.Members()
	if err != nil {
		return nil // Validate reported it
	}
	label := func(i int) string {
		if i == 0 {
			return fmt.Sprintf("%s.node (%s)", where, nc.Node.Name)
		}
		return fmt.Sprintf("%s.peers[%d] (%s)", where, i-1, nc.Peers[i-1].Name)
	}
	var out []string
	for i, m := range members {
		for _, r := range k.reservations {
			switch {
			case r.Reserved.IsValid() && r.Reserved == m.Addr:
				out = append(out, fmt.Sprintf("%s: address %v is the reservation of VIP %s (id %s), known from %s; give the node another address",
					label(i), m.Addr, r.Name, r.Service, k.source))
			case r.Addr.IsValid() && r.Addr == m.Addr:
				out = append(out, fmt.Sprintf("%s: address %v is the address VIP %s (id %s) uses, known from %s; give the node another address",
					label(i), m.Addr, r.Name, r.Service, k.source))
			}
		}
	}
	return out
}

// reportCollisions logs each new collision of the network's members with
// a VIP reservation once, and again after it has gone and come back.
func (n *netRuntime) reportCollisions() {
	cs := n.reg.AddrCollisions()
	n.collMu.Lock()
	defer n.collMu.Unlock()
	seen := map[string]bool{}
	for _, c := range cs {
		key := c.Node.String() + c.Service.String() + c.Addr.String()
		seen[key] = true
		if n.collisions[key] {
			continue
		}
		n.d.log.Warn("node address collides with a VIP reservation: "+c.String(), "network", n.cfg.Name,
			"node", c.NodeName, "addr", c.Addr, "vip", c.Name, "service", c.Service.String(), "effective_addr", c.Effective)
	}
	n.collisions = seen
}
