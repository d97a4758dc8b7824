package keelvip

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/vipkit/vipkit/claim"
	"github.com/vipkit/vipkit/claim/etcdkv"
	"github.com/vipkit/vipkit/internal/jsonx"
	"github.com/vipkit/vipkit/internal/syncx"
)

// helperCarrier is the controller's claim.Carrier: every carry and route
// goes to the root helper with the claim that justifies it, which the
// helper checks before it touches the interface. It is also the
// controller's StateStore (wrapping the real one) so that it knows the
// claim held: the controller saves its state before it carries or routes.
type helperCarrier struct {
	hc    *http.Client
	inner claim.StateStore
	// mu guards held.
	mu syncx.Mutex
	// +checklocks:mu
	held *claim.Claim
}

var (
	_ claim.LeasedCarrier = (*helperCarrier)(nil)
	_ claim.StateStore    = (*helperCarrier)(nil)
)

func (h *helperCarrier) Load() (claim.State, error) {
	s, err := h.inner.Load()
	if err == nil {
		h.mu.Lock()
		h.held = s.Held
		h.mu.Unlock()
	}
	return s, err
}

func (h *helperCarrier) Save(s claim.State) error {
	h.mu.Lock()
	h.held = s.Held
	h.mu.Unlock()
	return h.inner.Save(s)
}

func (h *helperCarrier) call(ctx context.Context, op string, vip, holder netip.Addr, until time.Time) error {
	h.mu.Lock()
	c := h.held
	h.mu.Unlock()
	req := carrierRequest{Op: op, VIP: vip.String(), Holder: addrString(holder), Claim: b64Claim(c)}
	if !until.IsZero() {
		req.UntilBootNs = until.UnixNano()
	}
	return callJSON(ctx, h.hc, http.MethodPost, "http://helper"+carrierPath, req, nil, nil)
}

func (h *helperCarrier) Carry(ctx context.Context, vip netip.Addr) error {
	return h.call(ctx, "carry", vip, netip.Addr{}, time.Time{})
}

// CarryUntil implements claim.LeasedCarrier: the deadline is on the
// controller's clock, claim.BootClock, which the helper shares.
func (h *helperCarrier) CarryUntil(ctx context.Context, vip netip.Addr, deadline time.Time) error {
	return h.call(ctx, "carry", vip, netip.Addr{}, deadline)
}

func (h *helperCarrier) Drop(ctx context.Context, vip netip.Addr) error {
	return h.call(ctx, "drop", vip, netip.Addr{}, time.Time{})
}

func (h *helperCarrier) Route(ctx context.Context, vip, holder netip.Addr) error {
	return h.call(ctx, "route", vip, holder, time.Time{})
}

// RunController is `keel-vip control`, the unprivileged controller the
// helper starts: it reads the mesh file from in, tends the node's VIP with
// claim.Controller (over etcd when the mesh file names endpoints), and
// serves the helper on control.sock (0600, in the 0700 directory the helper
// made for it). Every change to the interface goes through the helper.
// It returns when ctx ends, after closing the controller (which drops the
// VIP through the helper).
func RunController(ctx context.Context, in io.Reader, logw io.Writer) error {
	m, err := ParseMesh(in)
	if err != nil {
		return err
	}
	log := newLog(logw, m.Self.ID, "controller")
	warnTimings(log, m)
	// etcd's TLS is checked before anything starts; later contents come
	// from the helper (etcdTLSPath) and apply to new connections.
	tlsIn, err := m.EtcdTLS.load()
	if err != nil {
		return err
	}
	rot, err := newEtcdTLSRotator(tlsIn, wallNow())
	if err != nil {
		return err
	}
	tlsCfg := rot.config()
	go watchCertExpiry(ctx, rot, log, certLogEvery)
	if !m.Tended().IsValid() {
		<-ctx.Done() // no VIP declared or observed: nothing to tend
		return nil
	}
	pol, err := m.Policy()
	if err != nil {
		return err
	}
	var pair *claim.PairRecord
	key := m.Self.SignKey
	if m.VIP.IsValid() {
		if pair, err = LoadPairFromDir(m); err != nil {
			return err
		}
	} else {
		key = nil // an observer: takes claims and routes, never claims
	}
	hc := &helperCarrier{
		hc:    unixHTTP(filepath.Join(ctlDir(m), "helper.sock"), nil, 30*time.Second),
		inner: &claim.FileStore{Path: filepath.Join(m.StateDir, "state.json")},
	}
	cfg := claim.Config{
		Policy: pol, Self: m.Self.Addr, Key: key, VIP: m.Tended(), Pair: pair,
		Carrier: hc, Store: hc,
		Channel: loggedChannel{log: log, Channel: &claim.Client{URL: func(p netip.Addr) string {
			return "http://" + net.JoinHostPort(p.String(), strconv.Itoa(int(m.MembersPort))) + claim.MembersPath
		}}},
		RenewInterval: m.RenewInterval, LeaseTTL: m.LeaseTTL, DropAfter: m.DropAfter, ElectionTimeout: m.ElectionTimeout,
		OnError: func(err error) { log.Warn("controller", "err", err) },
	}
	for _, p := range m.Peers {
		cfg.Peers = append(cfg.Peers, p.Addr)
	}
	var checks *checkAgent
	if m.Checks.Enabled() && key != nil {
		runner := newCheckRunner(m.Checks, claim.BootClock{}, checkEnv(m.ID, m.Self.ID, m.Tended().String()))
		checks = newCheckAgent(runner, nil, claim.BootClock{}, log.With("part", "checks"))
		cfg.Healthy = checks.Healthy
	}
	if len(m.Etcd) > 0 {
		cli, err := clientv3.New(clientv3.Config{Endpoints: m.Etcd, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), AutoSyncInterval: 0, TLS: tlsCfg})
		if err != nil {
			return fmt.Errorf("keelvip: etcd: %w", err)
		}
		defer cli.Close()
		cfg.KV = etcdkv.New(cli)
		if runtime.GOOS == "linux" {
			warnRTOMax(log, "/proc")
		}
		if key != nil {
			// A member's renewals must be confirmed by a quorum (it carries
			// the VIP on their strength); an observer's carry nothing, and
			// skipping the read lets it re-route one round trip sooner.
			cfg.KV = &etcdkv.QuorumKV{KV: cfg.KV, Key: claim.KeysFor(m.ID, m.Tended()).Epoch}
		}
	}
	ctl, err := claim.NewController(cfg)
	if err != nil {
		return err
	}
	sock := filepath.Join(ctlDir(m), "control.sock")
	_ = os.Remove(sock)
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", sock)
	syscall.Umask(old)
	if err != nil {
		ctl.Close()
		return err
	}
	// Only root, the helper, may connect (SO_PEERCRED): the listener, or
	// any other process of any uid (the controller's own included), can
	// neither promote, nor clear the fence, nor pose as a member. The
	// sender header is the helper's statement of the member the request
	// came from, read only on connections that passed that check.
	if l, err = rootOnlyListener(l, func(err error) { log.Warn("control.sock: refused connection", "err", err) }); err != nil {
		ctl.Close()
		return err
	}
	promotes := new(promoteCounts)
	reloads := new(tlsReloads)
	var hooks *hookRunner
	if len(m.Hooks.Command) > 0 {
		hooks = newHookRunner(m.Hooks, m.ID, m.Self.ID, m.Tended().String(), log.With("part", "hooks"))
		// The watch begins before Start, so the first hook sees the role
		// at start; it ends after Close has published the drop.
		changes := ctl.Watch(ctx, 0)
		hdone := make(chan struct{})
		go func() {
			defer close(hdone)
			if err := hooks.run(ctx, changes); err != nil {
				log.Error("hooks: none will run", "err", err)
			}
		}()
		defer func() { <-hdone }()
	}
	if checks != nil {
		checks.ctl = ctl
		// The watch begins before Start: the agent sees the role at start.
		// Its own context ends it if the agent stops early (a watch must
		// be read until it closes or its context ends).
		wctx, wcancel := context.WithCancel(ctx)
		changes := ctl.Watch(wctx, 0)
		cdone := make(chan struct{})
		go func() {
			defer close(cdone)
			defer wcancel()
			if err := checks.run(wctx, changes); err != nil {
				log.Error("checks: none will run", "err", err)
			}
		}()
		defer func() { <-cdone }()
	}
	var metricsSrv *http.Server
	if m.Metrics.IsValid() {
		ttl := m.LeaseTTL
		if ttl == 0 {
			ttl = claim.DefaultLeaseTTL
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(controllerCollector{vip: m.Tended().String(), node: m.Self.ID, observer: key == nil, ttl: ttl,
			status: ctl.Status, stats: ctl.Stats, promotes: promotes, hooks: hooks, checks: checks, tls: rot, tlsReloads: reloads})
		ml, err := net.Listen("tcp", m.Metrics.String())
		if err != nil {
			ctl.Close()
			l.Close()
			return fmt.Errorf("keelvip: metrics: %w", err)
		}
		metricsSrv = metricsServer(reg)
		go func() { _ = metricsSrv.Serve(ml) }()
		defer metricsSrv.Close()
	}
	srv := claim.NewServer(ctl)
	srv.PeerAddr = func(r *http.Request) (netip.Addr, error) { return netip.ParseAddr(r.Header.Get(fromHeader)) }
	mux := http.NewServeMux()
	mux.Handle(claim.MembersPath, srv)
	mux.HandleFunc(etcdTLSPath, serveEtcdTLS(rot, reloads, log))
	mux.HandleFunc(statusPath, func(w http.ResponseWriter, r *http.Request) {
		s := ctl.Status()
		cs := controlStatus{Role: s.Role.String(), Epoch: s.Epoch, Holder: addrString(s.Holder), Fenced: s.Fenced, Released: s.Released,
			RenewalAgeMs: -1, Carried: s.Carried, RoutedTo: addrString(s.RoutedTo)}
		if subject, notAfter := rot.current(); !notAfter.IsZero() {
			cs.EtcdCert = &CertStatus{Subject: subject, NotAfter: notAfter.UTC().Format(time.RFC3339), State: certState(notAfter, wallNow())}
		}
		if s.Lease != 0 {
			cs.Lease = strconv.FormatInt(int64(s.Lease), 16)
		}
		if checks != nil {
			cs.Check = checks.report()
		}
		if s.RenewalAge >= 0 {
			cs.RenewalAgeMs = s.RenewalAge.Milliseconds()
		}
		jsonx.Write(w, http.StatusOK, cs)
	})
	mux.HandleFunc(promotePath, func(w http.ResponseWriter, r *http.Request) {
		body, ok := readBody(w, r, maxPrivateBody)
		if !ok {
			return
		}
		var req promoteRequest
		if err := decodeStrict(body, &req); err != nil {
			writeErr(w, err)
			return
		}
		res, err := ctl.Promote(r.Context(), claim.PromoteOptions{OldPrimaryGone: req.OldPrimaryGone})
		if err != nil {
			promotes.failed.Add(1)
		} else {
			promotes.ok.Add(1)
		}
		rep := PromoteReply{ByController: res.ByController, AlreadyHeld: res.AlreadyHeld, Taken: res.Taken, Answered: res.Answered}
		if res.Claim != nil {
			rep.Epoch, rep.Holder = res.Claim.Epoch, res.Claim.Holder.String()
		}
		if err != nil {
			log.Warn("promote", "err", err)
			writeErr(w, err)
			return
		}
		jsonx.Write(w, http.StatusOK, rep)
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ConnContext: connContext}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(l) }()
	if err := ctl.Start(); err != nil {
		_ = hs.Close()
		return errors.Join(err, ctl.Close())
	}
	log.Info("controller started", "vip", m.Tended(), "etcd", len(m.Etcd) > 0, "uid", os.Getuid())
	select {
	case <-ctx.Done():
	case err = <-done:
	}
	cerr := ctl.Close()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(err, cerr)
}

// LoadPairFromDir loads the pair record for the controller: the mesh's
// pair file is root's, so the controller reads the copy the helper hands
// over in the state directory (pair.rec) when it cannot read the original.
// Under systemd its unit has the record as the credential "pair".
func LoadPairFromDir(m *Mesh) (*claim.PairRecord, error) {
	if f, err := openCredential("pair"); err != nil || f != nil {
		if err != nil {
			return nil, err
		}
		name := f.Name()
		f.Close()
		mm := *m
		mm.PairFile = name
		return LoadPair(&mm)
	}
	pr, err := LoadPair(m)
	if err == nil || !errors.Is(err, os.ErrPermission) {
		return pr, err
	}
	mm := *m
	mm.PairFile = filepath.Join(m.StateDir, "pair.rec")
	return LoadPair(&mm)
}
