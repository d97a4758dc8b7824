package claim

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"

	"github.com/vipkit/vipkit/internal/jsonx"
)

// TrustStore maps each node's id and overlay address to its Ed25519 key, and
// holds the trust roots that may sign a pair record in place of a member.
// Implementations are safe for concurrent use.
type TrustStore interface {
	// KeyByAddr returns the key of the node whose overlay address is addr.
	KeyByAddr(addr netip.Addr) (PublicKey, bool)
	// KeyByID returns the key of the node with the given id.
	KeyByID(id string) (PublicKey, bool)
	// IsRoot reports whether k is a trust root.
	IsRoot(k PublicKey) bool
}

// TrustedNode is one entry of a Trust.
type TrustedNode struct {
	ID   string
	Addr netip.Addr
	Key  PublicKey
}

// Trust is a fixed TrustStore built from a list of nodes and roots, or read
// from a file by LoadTrustFile. It is immutable and safe for concurrent use.
type Trust struct {
	byAddr map[netip.Addr]PublicKey
	byID   map[string]PublicKey
	roots  map[PublicKey]bool
}

var _ TrustStore = (*Trust)(nil)

// ErrTrust is returned for an invalid trust store: an address or id listed
// twice, an address that is not IPv6, an empty id, a bad key.
var ErrTrust = errors.New("claim: invalid trust store")

// NewTrust builds a Trust. Every id and address must be unique.
func NewTrust(nodes []TrustedNode, roots []PublicKey) (*Trust, error) {
	t := &Trust{byAddr: map[netip.Addr]PublicKey{}, byID: map[string]PublicKey{}, roots: map[PublicKey]bool{}}
	for _, n := range nodes {
		if n.ID == "" || !validAddr(n.Addr) {
			return nil, fmt.Errorf("%w: node %q at %v", ErrTrust, n.ID, n.Addr)
		}
		if _, dup := t.byAddr[n.Addr]; dup {
			return nil, fmt.Errorf("%w: address %v listed twice", ErrTrust, n.Addr)
		}
		if _, dup := t.byID[n.ID]; dup {
			return nil, fmt.Errorf("%w: id %q listed twice", ErrTrust, n.ID)
		}
		t.byAddr[n.Addr] = n.Key
		t.byID[n.ID] = n.Key
	}
	for _, r := range roots {
		t.roots[r] = true
	}
	return t, nil
}

// KeyByAddr implements TrustStore.
func (t *Trust) KeyByAddr(a netip.Addr) (PublicKey, bool) { k, ok := t.byAddr[a]; return k, ok }

// KeyByID implements TrustStore.
func (t *Trust) KeyByID(id string) (PublicKey, bool) { k, ok := t.byID[id]; return k, ok }

// IsRoot implements TrustStore.
func (t *Trust) IsRoot(k PublicKey) bool { return t.roots[k] }

// trustFile is the JSON form of a trust file:
//
//	{"nodes": [{"id": "a", "addr": "fd7a::1", "key": "<base64 32 bytes>"}],
//	 "roots": ["<base64 32 bytes>"]}
type trustFile struct {
	Nodes []struct {
		ID   string `json:"id"`
		Addr string `json:"addr"`
		Key  string `json:"key"`
	} `json:"nodes"`
	Roots []string `json:"roots"`
}

// MaxTrustFileSize bounds a trust file, in bytes.
const MaxTrustFileSize = 4 << 20

// LoadTrustFile reads a trust file (see ParseTrust for its format).
func LoadTrustFile(path string) (*Trust, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("claim: trust file: %w", err)
	}
	defer f.Close()
	return ParseTrust(f)
}

// ParseTrust reads the JSON trust format:
//
//	{"nodes": [{"id": "a", "addr": "fd7a::1", "key": "<base64 32 bytes>"}],
//	 "roots": ["<base64 32 bytes>"]}
//
// Unknown fields and anything after the object are refused. Errors wrap
// ErrTrust or ErrTooLarge.
func ParseTrust(r io.Reader) (*Trust, error) {
	data, err := jsonx.ReadAll(r, MaxTrustFileSize)
	if errors.Is(err, jsonx.ErrTooLarge) {
		return nil, fmt.Errorf("%w: trust file over %d bytes", ErrTooLarge, MaxTrustFileSize)
	}
	if err != nil {
		return nil, fmt.Errorf("claim: trust file: %w", err)
	}
	var tf trustFile
	if err := jsonx.Decode(data, &tf); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTrust, err)
	}
	var nodes []TrustedNode
	for _, n := range tf.Nodes {
		a, err := netip.ParseAddr(n.Addr)
		if err != nil {
			return nil, fmt.Errorf("%w: node %q: %v", ErrTrust, n.ID, err)
		}
		k, err := parseKey(n.Key)
		if err != nil {
			return nil, fmt.Errorf("%w: node %q: %v", ErrTrust, n.ID, err)
		}
		nodes = append(nodes, TrustedNode{ID: n.ID, Addr: a, Key: k})
	}
	var roots []PublicKey
	for _, s := range tf.Roots {
		k, err := parseKey(s)
		if err != nil {
			return nil, fmt.Errorf("%w: root: %v", ErrTrust, err)
		}
		roots = append(roots, k)
	}
	return NewTrust(nodes, roots)
}

func parseKey(s string) (PublicKey, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return PublicKey{}, err
	}
	if len(b) != len(PublicKey{}) {
		return PublicKey{}, fmt.Errorf("key is %d bytes, want 32", len(b))
	}
	return PublicKey(b), nil
}
