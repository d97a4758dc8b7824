//go:build linux

package keelvip_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// etcdServerName is the name every etcd member's certificate carries in
// the namespace cluster, and the mesh files' etcd.server_name.
const etcdServerName = "etcd.e2e"

// clusterTLS is the namespace cluster's etcd TLS: one CA made in the
// test; per member a server certificate (its overlay address and
// etcdServerName); per node a client certificate, which the members
// require (--client-cert-auth); and one for the test's own clients.
// Every node's files are root's 0600 in its own etcd-tls directory, where
// its mesh file names them.
type clusterTLS struct {
	ca *testCA
	mu sync.Mutex
	// gen counts the client certificates' issuances (1: the first).
	// +checklocks:mu
	gen  int
	test *tls.Config
}

// tlsDir is n's etcd-tls directory.
func (n *node) tlsDir() string { return filepath.Join(n.dir, "etcd-tls") }

// newClusterTLS makes the CA and every node's certificates.
func newClusterTLS(t *testing.T, nodes []*node) *clusterTLS {
	t.Helper()
	ct := &clusterTLS{ca: newCA(t, "keel-vip e2e etcd ca"), gen: 1}
	now := time.Now()
	for _, n := range nodes {
		d := n.tlsDir()
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		writeFile(t, d, "ca.pem", ct.ca.pem)
		sc, sk := ct.ca.issueFor(t, "etcd-"+n.name, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			now.Add(-time.Hour), now.Add(48*time.Hour), []net.IP{net.IP(n.addr.AsSlice())}, []string{etcdServerName})
		writeFile(t, d, "server.pem", sc)
		writeFile(t, d, "server-key.pem", sk)
		cc, ck := ct.client(t, n.name+"-1")
		writeFile(t, d, "client-key.pem", ck)
		writeFile(t, d, "client.pem", cc)
	}
	cc, ck := ct.client(t, "e2e-test")
	pair, err := tls.X509KeyPair(cc, ck)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ct.ca.cert)
	ct.test = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, ServerName: etcdServerName, Certificates: []tls.Certificate{pair}}
	return ct
}

// client issues a client certificate for cn.
func (ct *clusterTLS) client(t *testing.T, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	now := time.Now()
	return ct.ca.issueFor(t, cn, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, now.Add(-time.Hour), now.Add(48*time.Hour), nil, nil)
}

// meshEtcd is the etcd block of n's mesh file: its own member over https,
// with its client certificate.
func (ct *clusterTLS) meshEtcd(n *node) map[string]any {
	d := n.tlsDir()
	return map[string]any{"endpoints": []string{fmt.Sprintf("https://[%v]:2379", n.addr)},
		"ca_file": filepath.Join(d, "ca.pem"), "cert_file": filepath.Join(d, "client.pem"), "key_file": filepath.Join(d, "client-key.pem"),
		"server_name": etcdServerName}
}

// etcdArgs are the TLS arguments of n's etcd member (etcdChild): its
// server certificate and key and the CA its clients' certificates must
// chain to.
func (ct *clusterTLS) etcdArgs(n *node) []string {
	d := n.tlsDir()
	return []string{filepath.Join(d, "server.pem"), filepath.Join(d, "server-key.pem"), filepath.Join(d, "ca.pem")}
}

// rotate issues every node a new client certificate and puts it on disk
// as a certificate manager does (each file written whole and renamed over
// the old one; the key and the certificate are two renames, so a read in
// between sees a pair that does not match, which the helper refuses and
// reads again). It returns the new certificates' common names by node.
func (ct *clusterTLS) rotate(t *testing.T, nodes []*node) map[string]string {
	t.Helper()
	ct.mu.Lock()
	ct.gen++
	gen := ct.gen
	ct.mu.Unlock()
	cns := map[string]string{}
	for _, n := range nodes {
		cn := fmt.Sprintf("%s-%d", n.name, gen)
		cc, ck := ct.client(t, cn)
		writeFile(t, n.tlsDir(), "client.pem", cc)
		writeFile(t, n.tlsDir(), "client-key.pem", ck)
		cns[n.name] = cn
	}
	return cns
}
