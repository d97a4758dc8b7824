package sharehosts

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/api"
	"github.com/vipkit/vipkit/hosting/events"
	"github.com/vipkit/vipkit/hosting/hostingmetrics"
	"github.com/vipkit/vipkit/hosting/pgstore"
	"github.com/vipkit/vipkit/hosting/ziti"
)

// MinPoolConns is the daemon's smallest PostgreSQL pool, unless its DSN
// sets pool_max_conns.
const MinPoolConns = 8

// ShutdownTimeout bounds the graceful shutdown of the API.
const ShutdownTimeout = 15 * time.Second

// zitiClient builds the controller client with the configured login.
func zitiClient(c Config, onErr func(op string, err error)) (*ziti.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	tr.MaxIdleConnsPerHost = ziti.MaxIdleConnsPerHost
	if c.ZitiCA != "" {
		pem, err := os.ReadFile(c.ZitiCA)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrConfig, KeyZitiCA, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: %s holds no PEM certificate", ErrConfig, KeyZitiCA)
		}
		tr.TLSClientConfig.RootCAs = pool
	}
	login := ziti.PasswordLogin(c.ZitiUser, c.ZitiPass)
	if c.ZitiCert != "" {
		cert, err := tls.LoadX509KeyPair(c.ZitiCert, c.ZitiKey)
		if err != nil {
			return nil, fmt.Errorf("%w: %s/%s: %v", ErrConfig, KeyZitiCert, KeyZitiKey, err)
		}
		tr.TLSClientConfig.Certificates = []tls.Certificate{cert}
		login = ziti.CertLogin()
	}
	return ziti.New(c.ZitiURL, ziti.Options{HTTPClient: &http.Client{Transport: tr, Timeout: 30 * time.Second}, Login: login, OnError: onErr})
}

// newReconciler makes the daemon's reconciler on the store (whose
// advisory lock lets one replica reconcile at a time), logging every drift
// it finds.
// With m (the daemon's metrics), it also counts repairs and shares per
// hosting state, and announces state changes.
func newReconciler(c Config, st *pgstore.Store, proj *hosting.Projection, logf func(string, ...any), m *hostingmetrics.Metrics) (*hosting.Reconciler, error) {
	o := hosting.ReconcilerOptions{Store: st, Projection: proj, Outbox: st,
		Interval: c.Reconcile.Interval, Grace: c.Reconcile.Grace, MinGap: c.Reconcile.MinGap, MaxRepairs: c.Reconcile.MaxRepairs,
		OnDrift: func(d hosting.Drift) { logf("reconciler: %s", FormatDrift(d)) },
		OnError: func(err error) { logf("reconciler: %v", err) }}
	if m != nil {
		o.OnDrift = func(d hosting.Drift) { logf("reconciler: %s", FormatDrift(d)); m.Drift(d) }
		o.OnPass, o.WatchStates = m.Pass, true
		o.OnStateChange = func(sc hosting.StateChange) {
			logf("share %s: hosting state %s -> %s", sc.Share.ID, sc.From, sc.To)
		}
	}
	return hosting.NewReconciler(o)
}

// FormatDrift is a drift on one line, as the log and the reconcile
// command print it.
func FormatDrift(d hosting.Drift) string {
	state := "repaired"
	switch {
	case d.Kind == hosting.DriftBroken:
		state = "not repairable"
	case d.Held != "":
		state = "held: " + d.Held
	case !d.Repaired:
		state = "repair failed"
	}
	s := "share " + d.ShareID + ": " + string(d.Kind)
	if d.AgentID != "" {
		s += " agent " + d.AgentID
	}
	if d.Object != "" {
		s += " object " + d.Object
	}
	return s + ": " + d.Detail + " (" + state + ")"
}

// Reconcile makes one reconciler pass against the config's database and
// controller, printing each drift to out on one line; dry lists the drift
// and repairs nothing. A pass that finds another reconciler holding the
// lock returns ErrLocked.
func Reconcile(ctx context.Context, c Config, dry bool, out io.Writer) (hosting.Report, error) {
	pool, err := pgxpool.New(ctx, c.PostgresDSN)
	if err != nil {
		return hosting.Report{}, fmt.Errorf("sharehosts: postgres: %w", err)
	}
	defer pool.Close()
	zc, err := zitiClient(c, nil)
	if err != nil {
		return hosting.Report{}, err
	}
	proj, err := hosting.NewProjection(zc, hosting.ProjectionOptions{FrontdoorID: c.FrontdoorID, HealthCheck: c.HealthCheck, DeploymentID: c.DeploymentID})
	if err != nil {
		return hosting.Report{}, err
	}
	st := pgstore.New(pool, pgstore.Options{})
	rec, err := newReconciler(c, st, proj, func(string, ...any) {}, nil)
	if err != nil {
		return hosting.Report{}, err
	}
	rep, err := rec.Pass(ctx, dry)
	for _, d := range rep.Drifts {
		fmt.Fprintln(out, FormatDrift(d))
	}
	if err == nil && !rep.Locked {
		err = ErrLocked
	}
	if err == nil {
		fmt.Fprintf(out, "%d drift(s) on %d share(s), %d repair(s), %d held\n", len(rep.Drifts), rep.Shares, rep.Repairs, rep.Held)
	}
	return rep, err
}

// InboxRetention is how long the daemon keeps a consumed event's id in
// the inbox; it prunes the older ones every InboxPruneEvery.
const (
	InboxRetention  = 7 * 24 * time.Hour
	InboxPruneEvery = time.Hour
)

// pruneInbox prunes the inbox on start and every InboxPruneEvery until
// ctx is done.
func pruneInbox(ctx context.Context, st *pgstore.Store, logf func(string, ...any)) {
	t := time.NewTicker(InboxPruneEvery)
	defer t.Stop()
	for {
		if n, err := st.PruneInbox(ctx, time.Now().Add(-InboxRetention)); err != nil && ctx.Err() == nil {
			logf("inbox: prune: %v", err)
		} else if n > 0 {
			logf("inbox: pruned %d event id(s) older than %v", n, InboxRetention)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ErrLocked means another reconciler of the deployment holds the lock.
var ErrLocked = errors.New("sharehosts: another reconciler holds the lock; try again later")

// Serve runs the daemon until ctx is done: it migrates the database,
// serves the API on c.Listen (or on l, when not nil), consumes agent
// DELETED events, relays the outbox and runs the reconciler (a pass on
// start, then every reconcile.interval and after a failed compensation); then it shuts down gracefully
// (the API drains its requests, a cascade in progress commits and is
// acked). Log lines go to logw.
func Serve(ctx context.Context, c Config, l net.Listener, logw io.Writer) error {
	logf := func(format string, args ...any) { fmt.Fprintf(logw, format+"\n", args...) }
	auth, err := api.NewBearer(c.Tokens)
	if err != nil {
		return err
	}
	if len(c.Unscoped) > 0 {
		logf("warning: the tokens of %s have no accounts and act on every account; write %s.<principal>.token and .accounts (%q or a list)",
			strings.Join(c.Unscoped, ", "), KeyTokens, AllAccounts)
	}
	pcfg, err := pgxpool.ParseConfig(c.PostgresDSN)
	if err != nil {
		return fmt.Errorf("sharehosts: postgres: %w", err)
	}
	// The reconciler's and the relay's locks each keep a connection:
	// leave room for the transactions (a pool_max_conns in the DSN wins).
	if !strings.Contains(c.PostgresDSN, "pool_max_conns") && pcfg.MaxConns < MinPoolConns {
		pcfg.MaxConns = MinPoolConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("sharehosts: postgres: %w", err)
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool, ""); err != nil {
		return fmt.Errorf("sharehosts: migrate: %w", err)
	}
	logf("database migrated")
	var cons *events.Consumer
	st := pgstore.New(pool, pgstore.Options{})
	met := hostingmetrics.New(hostingmetrics.Options{Outbox: st, DeadLettered: func() int64 {
		if cons == nil {
			return 0
		}
		return cons.Stats().DeadLettered
	}})
	zc, err := zitiClient(c, met.ZitiError)
	if err != nil {
		return err
	}
	proj, err := hosting.NewProjection(zc, hosting.ProjectionOptions{FrontdoorID: c.FrontdoorID, HealthCheck: c.HealthCheck, DeploymentID: c.DeploymentID})
	if err != nil {
		return err
	}
	onErr := func(err error) { logf("%v", err) }
	if c.DeploymentID == "" {
		logf("warning: no %s: the reconciler deletes no orphaned Ziti object", KeyDeploymentID)
	}
	rec, err := newReconciler(c, st, proj, logf, met)
	if err != nil {
		return err
	}
	relay, err := events.NewRelay(events.RelayOptions{URL: c.AMQPURL, Outbox: st, Lock: st, OnError: onErr, OnLock: func(held bool) {
		if held {
			logf("relay: holding the outbox lock")
		} else {
			logf("relay: the outbox lock is released")
		}
	}})
	if err != nil {
		return err
	}
	so := hosting.Options{Store: st, Projection: proj, Outbox: true, OnOutbox: relay.Kick, OnDrift: rec.Kick,
		Validator: hosting.Validator{MaxHosts: c.MaxHosts}}
	if c.IngressURL != "" {
		so.Ingress = HTTPIngress{Base: c.IngressURL}
		logf("ingress gate: %s", c.IngressURL)
	}
	if c.NetworkURL != "" {
		so.Network = HTTPNetwork{Base: c.NetworkURL, FrontdoorID: c.FrontdoorID}
		logf("network gate: %s", c.NetworkURL)
	}
	svc, err := hosting.NewService(so)
	if err != nil {
		return err
	}
	h, err := api.New(api.Options{Service: svc, Reconciler: rec, Observe: met.Request})
	if err != nil {
		return err
	}
	cons, err = events.NewConsumer(events.ConsumerOptions{URL: c.AMQPURL, Handler: svc, OnError: onErr})
	if err != nil {
		return err
	}
	if l == nil {
		if l, err = net.Listen("tcp", c.Listen); err != nil {
			return fmt.Errorf("sharehosts: listen: %w", err)
		}
	}
	srv := &http.Server{Handler: auth.Wrap(h), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 60 * time.Second,
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) }}
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(4)
	go func() { defer wg.Done(); pruneInbox(bg, st, logf) }()
	go func() { defer wg.Done(); _ = cons.Run(bg) }()
	go func() { defer wg.Done(); _ = relay.Run(bg) }()
	go func() { defer wg.Done(); _ = rec.Run(bg) }()
	served := make(chan error, 1)
	var msrv *http.Server
	if c.MetricsListen != "" {
		ml, err := net.Listen("tcp", c.MetricsListen)
		if err != nil {
			stopBG()
			wg.Wait()
			return fmt.Errorf("sharehosts: metrics listen: %w", err)
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(met)
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		msrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = msrv.Serve(ml) }()
		logf("serving metrics on %s", ml.Addr())
	}
	go func() { served <- srv.Serve(l) }()
	logf("serving the API on %s", l.Addr())
	var serr error
	select {
	case <-ctx.Done():
	case serr = <-served:
	}
	logf("shutting down")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	if msrv != nil {
		err = errors.Join(err, msrv.Shutdown(sctx))
	}
	stopBG()
	wg.Wait()
	if errors.Is(serr, http.ErrServerClosed) {
		serr = nil
	}
	logf("stopped")
	return errors.Join(serr, err)
}
