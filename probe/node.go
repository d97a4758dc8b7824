package probe

import "encoding/hex"

// NodeID is a node's identity on the overlay: its 32-byte public key, as in
// wireguard-go's NoisePublicKey. It is comparable and used as a map key. The
// zero NodeID is valid as a value but names no real node.
type NodeID [32]byte

// String returns the first 8 bytes in hex, enough to tell nodes apart in
// logs and test failures.
func (id NodeID) String() string { return hex.EncodeToString(id[:8]) }

// compare orders NodeIDs bytewise; it is the selector's tie-break.
func (id NodeID) compare(o NodeID) int {
	for i := range id {
		if id[i] != o[i] {
			if id[i] < o[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}
