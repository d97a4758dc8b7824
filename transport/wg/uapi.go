package wg

// The UAPI (https://www.wireguard.com/xplatform/#configuration-protocol) is
// how wireguard-go is configured and read back. This file is the only place
// that writes or reads its text: callers deal in Config values.

import (
	"bufio"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// uapiWriter builds the text of one "set" operation.
type uapiWriter struct{ b strings.Builder }

func (w *uapiWriter) line(key, value string) {
	w.b.WriteString(key)
	w.b.WriteByte('=')
	w.b.WriteString(value)
	w.b.WriteByte('\n')
}

func (w *uapiWriter) key(name string, k Key) { w.line(name, k.hexString()) }

func (w *uapiWriter) String() string { return w.b.String() }

// diffUAPI returns the set operation that turns the device configuration cur
// into want, writing only what changes and never leaving a prefix unrouted
// in between:
//
//  1. the private key, when it changes;
//  2. every wanted peer that is new or changed: its preshared key,
//     endpoint (when given and different), keepalive, and the allowed IPs it
//     gains (an insert takes a prefix from its old owner atomically);
//  3. the allowed IPs each kept peer loses (a no-op if step 2 moved them);
//  4. the removal of peers that are no longer wanted.
//
// The listen port is not part of it (see Device.Configure). want must be
// valid. An empty result means there is nothing to change.
func diffUAPI(cur, want Config) string {
	var w uapiWriter
	if k := want.PrivateKey.clamped(); k != cur.PrivateKey.clamped() {
		w.key("private_key", k)
	}
	curPeers := make(map[Key]*PeerConfig, len(cur.Peers))
	for i := range cur.Peers {
		curPeers[cur.Peers[i].PublicKey] = &cur.Peers[i]
	}
	wanted := make(map[Key]bool, len(want.Peers))
	for _, p := range want.Peers {
		wanted[p.PublicKey] = true
		old := curPeers[p.PublicKey]
		section := false
		open := func() {
			if !section {
				w.key("public_key", p.PublicKey)
				section = true
			}
		}
		if old == nil {
			open()
		}
		if old == nil || !equalPSK(old.PresharedKey, p.PresharedKey) {
			open()
			if p.PresharedKey != nil {
				w.key("preshared_key", *p.PresharedKey)
			} else {
				w.key("preshared_key", Key{})
			}
		}
		if p.Endpoint.IsValid() && (old == nil || old.Endpoint != p.Endpoint) {
			open()
			w.line("endpoint", p.Endpoint.String())
		}
		if old == nil || old.PersistentKeepalive != p.PersistentKeepalive {
			open()
			w.line("persistent_keepalive_interval", strconv.FormatInt(int64(p.PersistentKeepalive/time.Second), 10))
		}
		for _, a := range p.AllowedIPs {
			if old == nil || !slices.Contains(old.AllowedIPs, a) {
				open()
				w.line("allowed_ip", a.String())
			}
		}
	}
	for _, p := range want.Peers {
		old := curPeers[p.PublicKey]
		if old == nil {
			continue
		}
		first := true
		for _, a := range old.AllowedIPs {
			if !slices.Contains(p.AllowedIPs, a) {
				if first {
					w.key("public_key", p.PublicKey)
					w.line("update_only", "true")
					first = false
				}
				w.line("allowed_ip", "-"+a.String())
			}
		}
	}
	for _, p := range cur.Peers {
		if !wanted[p.PublicKey] {
			w.key("public_key", p.PublicKey)
			w.line("remove", "true")
		}
	}
	return w.String()
}

func equalPSK(a, b *Key) bool {
	switch {
	case a == nil || b == nil:
		return a == nil && b == nil
	default:
		return *a == *b
	}
}

// applyUAPI applies UAPI text to base and returns the result, with the
// run-time statistics of the peers that the text reports. It reads both the
// output of a "get" operation (applied to the zero Config) and the text of a
// "set" operation, with wireguard-go's semantics: an allowed IP added to one
// peer is taken from any other, "-prefix" removes a prefix only from the peer
// that has it. Keys it does not know are ignored, so that a newer
// wireguard-go's extra attributes do not break Config. Peers come out in the
// order they first appeared.
func applyUAPI(text string, base Config) (Config, map[Key]PeerStats, error) {
	st := uapiState{cfg: base.Clone(), stats: make(map[Key]PeerStats), index: make(map[Key]int)}
	for i, p := range st.cfg.Peers {
		st.index[p.PublicKey] = i
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		if line == "" {
			break // end of operation
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			return Config{}, nil, fmt.Errorf("%w: line %d %q has no '='", ErrUAPI, lineNo, line)
		}
		if err := st.apply(key, value); err != nil {
			return Config{}, nil, fmt.Errorf("%w: line %d %q: %v", ErrUAPI, lineNo, line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return Config{}, nil, fmt.Errorf("%w: %v", ErrUAPI, err)
	}
	out := st.cfg
	out.Peers = out.Peers[:0:0]
	for _, p := range st.cfg.Peers {
		if !p.PublicKey.IsZero() { // zero marks a removed peer
			out.Peers = append(out.Peers, p)
		}
	}
	return out, st.stats, nil
}

type uapiState struct {
	cfg   Config
	stats map[Key]PeerStats
	index map[Key]int // public key → index in cfg.Peers
	cur   int         // index of the peer being configured, -1 for none
	dummy bool        // the current peer is ignored (removed, or update_only of a new one)
	fresh bool        // the current peer was created by this section
	inDev bool        // still in the device section
	init  bool
}

func (s *uapiState) apply(key, value string) error {
	if !s.init {
		s.init, s.inDev, s.cur = true, true, -1
	}
	if key == "public_key" {
		k, err := parseHexKey(value)
		if err != nil {
			return err
		}
		s.inDev, s.dummy, s.fresh = false, false, false
		if i, ok := s.index[k]; ok {
			s.cur = i
			return nil
		}
		s.fresh = true
		s.index[k] = len(s.cfg.Peers)
		s.cur = len(s.cfg.Peers)
		s.cfg.Peers = append(s.cfg.Peers, PeerConfig{PublicKey: k})
		return nil
	}
	if s.inDev {
		switch key {
		case "private_key":
			k, err := parseHexKey(value)
			if err != nil {
				return err
			}
			s.cfg.PrivateKey = k
		case "listen_port":
			v, err := strconv.ParseUint(value, 10, 16)
			if err != nil {
				return err
			}
			s.cfg.ListenPort = uint16(v)
		case "replace_peers":
			if value != "true" {
				return fmt.Errorf("replace_peers=%q", value)
			}
			s.cfg.Peers = nil
			clear(s.index)
		}
		return nil // fwmark and unknown device keys are ignored
	}
	if s.dummy {
		return nil
	}
	p := &s.cfg.Peers[s.cur]
	switch key {
	case "remove":
		if value != "true" {
			return fmt.Errorf("remove=%q", value)
		}
		s.removePeer(s.cur)
	case "update_only":
		if value != "true" {
			return fmt.Errorf("update_only=%q", value)
		}
		if s.fresh { // update_only never creates a peer
			s.removePeer(s.cur)
		}
	case "preshared_key":
		k, err := parseHexKey(value)
		if err != nil {
			return err
		}
		if k.IsZero() {
			p.PresharedKey = nil
		} else {
			p.PresharedKey = &k
		}
	case "endpoint":
		e, err := netip.ParseAddrPort(value)
		if err != nil {
			return err
		}
		p.Endpoint = e
		st := s.stats[p.PublicKey]
		st.Endpoint = e
		s.stats[p.PublicKey] = st
	case "persistent_keepalive_interval":
		v, err := strconv.ParseUint(value, 10, 16)
		if err != nil {
			return err
		}
		p.PersistentKeepalive = time.Duration(v) * time.Second
	case "replace_allowed_ips":
		if value != "true" {
			return fmt.Errorf("replace_allowed_ips=%q", value)
		}
		p.AllowedIPs = nil
	case "allowed_ip":
		remove := strings.HasPrefix(value, "-")
		a, err := netip.ParsePrefix(strings.TrimPrefix(value, "-"))
		if err != nil {
			return err
		}
		a = a.Masked() // wireguard-go masks what it is given
		if remove {
			p.AllowedIPs = slices.DeleteFunc(p.AllowedIPs, func(b netip.Prefix) bool { return b == a })
			return nil
		}
		for i := range s.cfg.Peers {
			o := &s.cfg.Peers[i]
			if i != s.cur {
				o.AllowedIPs = slices.DeleteFunc(o.AllowedIPs, func(b netip.Prefix) bool { return b == a })
			}
		}
		if !slices.Contains(p.AllowedIPs, a) {
			p.AllowedIPs = append(p.AllowedIPs, a)
		}
	case "protocol_version":
		if value != "1" {
			return fmt.Errorf("protocol version %q", value)
		}
	case "last_handshake_time_sec", "last_handshake_time_nsec":
		v, err := strconv.ParseInt(value, 10, 64)
		if err != nil || v < 0 {
			return fmt.Errorf("bad %s", key)
		}
		st := s.stats[p.PublicKey]
		sec, nsec := int64(0), int64(0)
		if !st.LastHandshake.IsZero() {
			sec, nsec = st.LastHandshake.Unix(), int64(st.LastHandshake.Nanosecond())
		}
		if key == "last_handshake_time_sec" {
			sec = v
		} else {
			nsec = v
		}
		if sec == 0 && nsec == 0 {
			st.LastHandshake = time.Time{}
		} else {
			st.LastHandshake = time.Unix(sec, nsec)
		}
		s.stats[p.PublicKey] = st
	case "tx_bytes", "rx_bytes":
		v, err := strconv.ParseUint(value, 10, 64)
		if err != nil {
			return err
		}
		st := s.stats[p.PublicKey]
		if key == "tx_bytes" {
			st.TxBytes = v
		} else {
			st.RxBytes = v
		}
		s.stats[p.PublicKey] = st
	}
	return nil // unknown peer keys are ignored
}

func (s *uapiState) removePeer(i int) {
	k := s.cfg.Peers[i].PublicKey
	delete(s.index, k)
	delete(s.stats, k)
	s.cfg.Peers[i] = PeerConfig{} // compacted at the end
	s.dummy = true
}
