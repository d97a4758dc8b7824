package keelvip

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vipkit/vipkit/claim"
)

// ProposePair builds the pair record of the node's appliance.vip with the
// peer at other, signed by this node. The other member signs the same
// canonical bytes with SignPair (pair sign), or a trust root signs in its
// place.
func ProposePair(m *Mesh, other netip.Addr) (*claim.PairRecord, error) {
	if !m.VIP.IsValid() {
		return nil, ErrNoVIP
	}
	p, ok := m.PeerByAddr(other)
	if !ok {
		return nil, fmt.Errorf("%w: %v is not a peer", ErrNotPair, other)
	}
	pr, err := claim.NewPairRecord(m.ID, m.VIP,
		claim.Member{Addr: m.Self.Addr, Key: claim.KeyOf(m.Self.SignKey)},
		claim.Member{Addr: p.Addr, Key: p.SignKey})
	if err != nil {
		return nil, err
	}
	if err := pr.Sign(m.Self.SignKey); err != nil {
		return nil, err
	}
	return pr, nil
}

// SignPair checks a proposed record against the mesh file (this mesh, this
// node's VIP, this node as a member with its key, the other member a peer
// with the key the mesh file holds) and adds this node's signature. With
// root non-nil, a trust root's key signs in this node's place (the record
// must still name this node's mesh and VIP).
func SignPair(m *Mesh, pr *claim.PairRecord, root ed25519.PrivateKey) error {
	if !m.VIP.IsValid() {
		return ErrNoVIP
	}
	if pr.Mesh != m.ID || pr.VIP != m.VIP {
		return fmt.Errorf("%w: record for %s %v, this node declares %s %v", ErrNotPair, pr.Mesh, pr.VIP, m.ID, m.VIP)
	}
	self := claim.KeyOf(m.Self.SignKey)
	if !pr.HasMember(m.Self.Addr, self) {
		return fmt.Errorf("%w: record does not name %v with this node's key", ErrNotPair, m.Self.Addr)
	}
	o, _ := pr.Other(m.Self.Addr)
	p, ok := m.PeerByAddr(o.Addr)
	if !ok || p.SignKey != o.Key {
		return fmt.Errorf("%w: other member %v is not a peer with that key", ErrNotPair, o.Addr)
	}
	k := m.Self.SignKey
	if root != nil {
		k = root
	}
	return pr.Sign(k)
}

// EncodePairFile returns the text form of a pair record: its canonical
// bytes in base64 and a newline.
func EncodePairFile(pr *claim.PairRecord) ([]byte, error) {
	b, err := pr.Encode()
	if err != nil {
		return nil, err
	}
	return []byte(base64.StdEncoding.EncodeToString(b) + "\n"), nil
}

// MaxPairFileSize bounds a pair file, in bytes.
const MaxPairFileSize = 4 << 10

// ParsePairFile decodes the text form of a pair record and checks its
// signatures (claim.ParsePairRecord); whether it is complete is the
// policy's business.
func ParsePairFile(b []byte) (*claim.PairRecord, error) {
	if len(b) > MaxPairFileSize {
		return nil, fmt.Errorf("%w: pair file over %d bytes", claim.ErrTooLarge, MaxPairFileSize)
	}
	raw, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(b)))
	if err != nil {
		return nil, fmt.Errorf("%w: pair file: %v", claim.ErrMalformed, err)
	}
	return claim.ParsePairRecord(raw)
}

// LoadPair reads the mesh's pair file and checks that the record is
// complete under the mesh's policy and names this node's VIP and address.
func LoadPair(m *Mesh) (*claim.PairRecord, error) {
	if !m.VIP.IsValid() {
		return nil, ErrNoVIP
	}
	b, err := readSmall(m.PairFile, MaxPairFileSize)
	if err != nil {
		return nil, err
	}
	pr, err := ParsePairFile(b)
	if err != nil {
		return nil, err
	}
	pol, err := m.Policy()
	if err != nil {
		return nil, err
	}
	if err := pol.CheckPair(nil, pr); err != nil {
		return nil, err
	}
	if pr.VIP != m.VIP || !pr.HasMember(m.Self.Addr, claim.KeyOf(m.Self.SignKey)) {
		return nil, fmt.Errorf("%w: %s is not this node's record for %v", ErrNotPair, m.PairFile, m.VIP)
	}
	return pr, nil
}

func readSmall(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("keelvip: %w", err)
	}
	defer f.Close()
	b := make([]byte, limit+1)
	n, err := f.ReadAt(b, 0)
	if n > int(limit) {
		return nil, fmt.Errorf("%w: %s over %d bytes", claim.ErrTooLarge, path, limit)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("keelvip: %w", err)
	}
	return b[:n], nil
}

// writeFileAtomic writes data to path through a temporary file in the same
// directory, fsynced and renamed.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("keelvip: %w", err)
	}
	defer os.Remove(tmp.Name())
	err = tmp.Chmod(perm)
	if err == nil {
		_, err = tmp.Write(data)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("keelvip: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("keelvip: %w", err)
	}
	return nil
}
