package keelvip

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vipkit/vipkit/transport/wg"
)

// Key file names keygen writes in its directory: the WireGuard private
// key and the Ed25519 seed, each one line of standard base64, as the mesh
// file's node.wg_private_key and node.sign_private_key hold them (the
// WireGuard one is also what `wg genkey` writes and `wg pubkey` reads).
const (
	WGKeyFile   = "wg.key"
	SignKeyFile = "sign.key"
)

// PeerStanza is a node's entry in the other nodes' mesh files ("peers"):
// only public keys.
type PeerStanza struct {
	ID            string `json:"id"`
	Addr          string `json:"addr"`
	WGPublicKey   string `json:"wg_public_key"`
	SignPublicKey string `json:"sign_public_key"`
	Endpoint      string `json:"endpoint,omitempty"`
}

// Keygen makes a new node's WireGuard key and Ed25519 identity and writes
// them to dir/wg.key and dir/sign.key (dir is made 0700 when missing).
// Each file is created with O_EXCL and mode 0600, so it is never readable
// by others, not even for a moment, and neither an existing file nor a
// symlink is followed or overwritten: if either file exists, Keygen
// writes nothing and returns an error wrapping fs.ErrExist. It returns
// the node's peers stanza, which holds only the public keys.
func Keygen(dir, id string, addr netip.Addr, endpoint netip.AddrPort) (PeerStanza, error) {
	if !validID(id) {
		return PeerStanza{}, fmt.Errorf("keelvip: keygen: --id %q: a-z, 0-9, '-', '_' and '.' only, 1 to 63 bytes", id)
	}
	if !addr.Is6() || addr.Is4In6() || addr.Zone() != "" {
		return PeerStanza{}, fmt.Errorf("keelvip: keygen: --addr %v: want the node's IPv6 overlay address", addr)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return PeerStanza{}, fmt.Errorf("keelvip: keygen: %w", err)
	}
	wgPath, signPath := filepath.Join(dir, WGKeyFile), filepath.Join(dir, SignKeyFile)
	for _, p := range []string{wgPath, signPath} {
		if _, err := os.Lstat(p); err == nil {
			return PeerStanza{}, fmt.Errorf("keelvip: keygen: %s: %w (keygen never overwrites a key)", p, fs.ErrExist)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return PeerStanza{}, fmt.Errorf("keelvip: keygen: %w", err)
		}
	}
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return PeerStanza{}, fmt.Errorf("keelvip: keygen: %w", err)
	}
	wk := wg.GeneratePrivateKey()
	if err := writeKeyFile(wgPath, wk[:]); err != nil {
		return PeerStanza{}, err
	}
	if err := writeKeyFile(signPath, seed); err != nil {
		os.Remove(wgPath) // ours: created above with O_EXCL
		return PeerStanza{}, err
	}
	pub := wk.PublicKey()
	st := PeerStanza{ID: id, Addr: addr.String(), WGPublicKey: base64.StdEncoding.EncodeToString(pub[:]),
		SignPublicKey: base64.StdEncoding.EncodeToString(ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey))}
	if endpoint.IsValid() {
		st.Endpoint = endpoint.String()
	}
	return st, nil
}

// writeKeyFile creates path (O_EXCL: never an existing file or symlink)
// with mode 0600 from the start and writes key to it in base64.
func writeKeyFile(path string, key []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("keelvip: keygen: %w", err)
	}
	_, err = io.WriteString(f, base64.StdEncoding.EncodeToString(key)+"\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("keelvip: keygen: %s: %w", path, err)
	}
	return nil
}

// printKeygen prints what keygen made for the operator: the files, the
// public keys and the stanza to paste; never a private key.
func printKeygen(w io.Writer, dir string, st PeerStanza) {
	b, _ := json.MarshalIndent(st, "", "  ")
	fmt.Fprintf(w, "wrote %s and %s (mode 0600; private: they go into this node's mesh file only)\n",
		filepath.Join(dir, WGKeyFile), filepath.Join(dir, SignKeyFile))
	fmt.Fprintf(w, "wg_public_key: %s\nsign_public_key: %s\n\n", st.WGPublicKey, st.SignPublicKey)
	fmt.Fprintf(w, "Add this node to the \"peers\" of every other node's mesh file:\n%s\n", b)
}
