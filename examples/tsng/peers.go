package tsng

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vipkit/vipkit/internal/jsonx"
)

// maxPeerEntry bounds a peer entry file: an entry is a few hundred bytes.
const maxPeerEntry = 64 << 10

type peerOpts struct {
	endpoint string
}

// peerCommands are `tsng peer add` and `tsng peer remove`: they edit the
// peers list of one network in a config file, the file `init --entry`
// writes being the unit of exchange between members.
func peerCommands() []*command {
	po := &peerOpts{}
	return []*command{{name: "peer", short: "Add or remove a member in a config file's peers list.", sub: []*command{
		{name: "add", args: "NET FILE... [--endpoint IP:PORT] [--config FILE]", short: "Add the members in peer entry files (from `tsng init --entry`) to NET's peers.", min: 2, max: -1,
			long: "Each FILE holds one entry: name, address, identity, wireguard_key and an optional endpoint. The config\n" +
				"is checked as `config check` would with the new peers (duplicate names, keys and addresses are refused)\n" +
				"and replaced atomically, keeping its mode. A running agent applies it on `tsng reload`.",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.StringVar(&po.endpoint, "endpoint", "", "the `IP:PORT` the peer's WireGuard listens on (one FILE only; overrides the entry's)")
				fs.StringVar(&o.config, "config", "", "the config `file` to change (default: the global --config, else "+DefaultConfig+")")
			},
			run: func(_ context.Context, c *cliCtx, o *opts, a []string) error {
				return runPeerAdd(c, o, po, a[0], a[1:])
			}},
		{name: "remove", args: "NET NAME [--config FILE]", short: "Remove a member from NET's peers.", min: 2, max: 2,
			long: "A running agent applies it on `tsng reload`; the removed member's signatures stay honoured up to its\n" +
				"last counter (see docs/tsng-config.md, Removing a node).",
			flags: func(fs *flag.FlagSet, o *opts) {
				fs.StringVar(&o.config, "config", "", "the config `file` to change (default: the global --config, else "+DefaultConfig+")")
			},
			run: func(_ context.Context, c *cliCtx, o *opts, a []string) error { return runPeerRemove(c, o, a[0], a[1]) }},
	}}}
}

// readPeerEntry reads one peer entry file strictly.
func readPeerEntry(path string) (PeerConfig, error) {
	var p PeerConfig
	f, err := os.Open(path)
	if err != nil {
		return p, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPeerEntry+1))
	if err != nil {
		return p, err
	}
	if len(b) > maxPeerEntry {
		return p, fmt.Errorf("%w: %s: more than %d bytes; a peer entry is a few hundred", ErrConfig, path, maxPeerEntry)
	}
	if err := jsonx.Decode(b, &p); err != nil {
		return p, fmt.Errorf("%w: %s: %v", ErrConfig, path, decodeError(b, err))
	}
	return p, nil
}

// networkIndex finds the network named name in cfg.
func networkIndex(cfg *Config, name string) (int, error) {
	for i, n := range cfg.Networks {
		if n.Name == name {
			return i, nil
		}
	}
	return -1, &APIError{Code: CodeNotFound, Message: fmt.Sprintf("no network %q in the config", name)}
}

func runPeerAdd(c *cliCtx, o *opts, po *peerOpts, network string, files []string) error {
	path := c.configFile(o)
	if po.endpoint != "" {
		if len(files) != 1 {
			return usageError{"--endpoint applies to one FILE; put each peer's endpoint in its entry"}
		}
		if _, err := netip.ParseAddrPort(po.endpoint); err != nil {
			return usageError{fmt.Sprintf("--endpoint %q: want IP:PORT", po.endpoint)}
		}
	}
	cfg, err := LoadConfig(path)
	if err != nil {
		return err
	}
	ni, err := networkIndex(cfg, network)
	if err != nil {
		return err
	}
	var added []string
	for _, f := range files {
		p, err := readPeerEntry(f)
		if err != nil {
			return err
		}
		if po.endpoint != "" {
			p.Endpoint = po.endpoint
		}
		for _, q := range cfg.Networks[ni].Peers {
			if q.Name == p.Name {
				return &APIError{Code: CodeExists, Message: fmt.Sprintf("%s: network %s already has a peer named %q (remove it first to replace it)", f, network, p.Name)}
			}
		}
		cfg.Networks[ni].Peers = append(cfg.Networks[ni].Peers, p)
		added = append(added, p.Name)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w (%s not changed)", err, path)
	}
	if err := replaceConfigFile(path, cfg); err != nil {
		return err
	}
	fmt.Fprintf(c.env.Stdout, "added %v to %s's peers in %s; run `tsng reload` if its agent is running\n", added, network, path)
	return nil
}

func runPeerRemove(c *cliCtx, o *opts, network, name string) error {
	path := c.configFile(o)
	cfg, err := LoadConfig(path)
	if err != nil {
		return err
	}
	ni, err := networkIndex(cfg, network)
	if err != nil {
		return err
	}
	peers := cfg.Networks[ni].Peers
	kept := peers[:0:0]
	for _, p := range peers {
		if p.Name != name {
			kept = append(kept, p)
		}
	}
	if len(kept) == len(peers) {
		return &APIError{Code: CodeNotFound, Message: fmt.Sprintf("network %s has no peer named %q", network, name)}
	}
	cfg.Networks[ni].Peers = kept
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w (%s not changed)", err, path)
	}
	if err := replaceConfigFile(path, cfg); err != nil {
		return err
	}
	fmt.Fprintf(c.env.Stdout, "removed %s from %s's peers in %s; run `tsng reload` if its agent is running\n", name, network, path)
	return nil
}

// replaceConfigFile writes cfg to a new file beside path, with path's
// permission bits, syncs it and renames it over path, then syncs the
// directory: a crash leaves the old file or the new one, never a mix.
// It creates the new file itself (O_EXCL, random name) and changes no
// file's owner or mode by path.
func replaceConfigFile(path string, cfg *Config) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	var r [8]byte
	if _, err := rand.Read(r[:]); err != nil {
		return err
	}
	dir := filepath.Dir(path)
	tmp := filepath.Join(dir, "."+filepath.Base(path)+".tmp-"+hex.EncodeToString(r[:]))
	fh, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, st.Mode().Perm()&0o600)
	if err != nil {
		return err
	}
	_, err = fh.Write(append(b, '\n'))
	if err == nil {
		err = fh.Sync()
	}
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if d, err := os.Open(dir); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil && !errors.Is(err, fs.ErrInvalid) {
			return fmt.Errorf("sync %s: %w", dir, err)
		}
	}
	return nil
}
