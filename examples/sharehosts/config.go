package sharehosts

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v4"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/api"
)

// Setting keys of the config file besides the hosting ones
// (hosting.SettingInterval, SettingTimeout, SettingFailures and
// SettingMaxHosts, under frontdoor's property names). A key may be written dotted
// or nested; both read the same.
const (
	KeyFrontdoorID = "frontdoor-id"
	KeyListen      = "api.listen"
	KeyTokens      = "api.tokens" // api.tokens.<principal>.token and .accounts (see Config.Tokens)
	KeyPostgresDSN = "postgres.dsn"
	KeyAMQPURL     = "amqp.url"
	KeyZitiURL     = "ziti.url"
	KeyZitiUser    = "ziti.username"
	KeyZitiPass    = "ziti.password"
	KeyZitiCert    = "ziti.cert-file" // PEM client certificate, for cert login
	KeyZitiKey     = "ziti.key-file"
	KeyZitiCA      = "ziti.ca-file" // PEM CA bundle of the controller
	// KeyDeploymentID names this deployment on every Ziti object it
	// writes (hosting.TagDeployment); without it the reconciler deletes
	// no orphan.
	KeyDeploymentID = "deployment-id"
	// The reconciler's settings (hosting.ReconcilerOptions); absent means
	// the hosting default.
	KeyReconcileInterval   = "reconcile.interval"
	KeyReconcileGrace      = "reconcile.orphan-grace"
	KeyReconcileMaxRepairs = "reconcile.max-repairs"
	KeyReconcileMinGap     = "reconcile.min-gap"
	// KeyMetricsListen is the loopback address of the Prometheus
	// metrics (GET /metrics); absent serves none.
	KeyMetricsListen = "metrics.listen"
	// KeyIngressURL is the base URL of the ingress service (HTTPIngress);
	// absent means TCP shares have no ingress.
	KeyIngressURL = "ingress.url"
	// KeyNetworkURL is the base URL of the network service
	// (HTTPNetwork); absent means a share delete always cleans Ziti up.
	KeyNetworkURL = "network.url"
)

// ErrConfig means the config file is missing a setting, has one out of range,
// or has a key this program does not know.
var ErrConfig = errors.New("sharehosts: bad config")

// Config is the daemon's configuration.
type Config struct {
	FrontdoorID string
	Listen      string
	// Tokens are the API's bearer tokens, by principal. Each is written
	// as api.tokens.<principal>.token (the secret, 16+ characters) and
	// api.tokens.<principal>.accounts: "all" for every account, or a list
	// of account ids. The older form api.tokens.<principal>: <token> has
	// no accounts and means every account; Unscoped names those tokens.
	Tokens []api.Token
	// Unscoped lists, sorted, the principals whose tokens are written in
	// the older form without accounts; Serve warns about them once at
	// start.
	Unscoped    []string
	PostgresDSN string
	AMQPURL     string
	ZitiURL     string
	ZitiUser    string
	ZitiPass    string
	ZitiCert    string
	ZitiKey     string
	ZitiCA      string
	HealthCheck hosting.HealthCheck
	MaxHosts    int
	// DeploymentID is hosting.ProjectionOptions.DeploymentID ("" turns
	// the orphan clean-up off).
	DeploymentID string
	// MetricsListen is the loopback address of GET /metrics ("" for
	// none).
	MetricsListen string
	// IngressURL and NetworkURL are the gates' services ("" for none).
	IngressURL string
	NetworkURL string
	// Reconcile holds the reconciler's interval, orphan grace, minimum
	// gap and repair bound (0: the hosting defaults).
	Reconcile ReconcileConfig
}

// ReconcileConfig is the reconciler's part of the config.
type ReconcileConfig struct {
	Interval   time.Duration
	Grace      time.Duration
	MinGap     time.Duration
	MaxRepairs int
}

var known = []string{KeyIngressURL, KeyNetworkURL, KeyMetricsListen, KeyDeploymentID, KeyReconcileInterval, KeyReconcileGrace, KeyReconcileMaxRepairs, KeyReconcileMinGap, KeyFrontdoorID, KeyListen, KeyPostgresDSN, KeyAMQPURL, KeyZitiURL, KeyZitiUser, KeyZitiPass, KeyZitiCert, KeyZitiKey, KeyZitiCA,
	hosting.SettingInterval, hosting.SettingTimeout, hosting.SettingFailures, hosting.SettingMaxHosts}

// LoadConfig reads and checks a YAML config file.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return ParseConfig(b)
}

// Fields of a token under api.tokens.<principal>.
const (
	tokenSecret   = "token"
	tokenAccounts = "accounts"
	// AllAccounts is how api.tokens.<principal>.accounts names every
	// account.
	AllAccounts = "all"
)

// isAccountsKey reports whether key is api.tokens.<principal>.accounts,
// the one setting that may be a list.
func isAccountsKey(key string) bool {
	rest, ok := strings.CutPrefix(key, KeyTokens+".")
	p, f, dotted := strings.Cut(rest, ".")
	return ok && dotted && p != "" && f == tokenAccounts
}

// flatten turns nested maps into dotted keys with string values, and the
// lists of api.tokens.<principal>.accounts into lists.
func flatten(prefix string, v any, out map[string]string, lists map[string][]string) error {
	switch x := v.(type) {
	case map[string]any:
		for k, vv := range x {
			key := k
			if prefix != "" {
				key = prefix + "." + k
			}
			if err := flatten(key, vv, out, lists); err != nil {
				return err
			}
		}
	case nil:
		out[prefix] = ""
	case []any:
		if !isAccountsKey(prefix) {
			return fmt.Errorf("%w: %s: a list is not a setting", ErrConfig, prefix)
		}
		if _, dup := lists[prefix]; dup {
			return fmt.Errorf("%w: %s is set twice", ErrConfig, prefix)
		}
		ids := make([]string, 0, len(x))
		for _, e := range x {
			switch e.(type) {
			case map[string]any, []any, nil:
				return fmt.Errorf("%w: %s: an account id must be a string", ErrConfig, prefix)
			}
			ids = append(ids, fmt.Sprint(e))
		}
		lists[prefix] = ids
	default:
		if _, dup := out[prefix]; dup {
			return fmt.Errorf("%w: %s is set twice", ErrConfig, prefix)
		}
		out[prefix] = fmt.Sprint(x)
	}
	return nil
}

// ParseConfig parses and checks a YAML config. Every missing setting and
// unknown key is reported, sorted, in one error.
func ParseConfig(b []byte) (Config, error) {
	var raw map[string]any
	if err := yaml.Unmarshal(b, &raw); err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	flat, lists := map[string]string{}, map[string][]string{}
	if err := flatten("", raw, flat, lists); err != nil {
		return Config{}, err
	}
	for k := range lists {
		if _, dup := flat[k]; dup {
			return Config{}, fmt.Errorf("%w: %s is set twice", ErrConfig, k)
		}
	}
	get := func(k string) (string, bool) { v, ok := flat[k]; return v, ok }
	var errs []error
	tokenKeys := map[string]string{}
	for k, v := range flat {
		if rest, ok := strings.CutPrefix(k, KeyTokens+"."); ok {
			tokenKeys[rest] = v
			continue
		}
		if k == KeyTokens && v == "" {
			continue // "tokens:" with nothing under it: reported below
		}
		if !slices.Contains(known, k) {
			errs = append(errs, fmt.Errorf("%w: unknown key %s", ErrConfig, k))
		}
	}
	for k := range lists {
		tokenKeys[strings.TrimPrefix(k, KeyTokens+".")] = ""
	}
	var c Config
	c.Tokens, c.Unscoped, errs = parseTokens(tokenKeys, lists, errs)
	need := func(k string) string {
		v, _ := get(k)
		if v == "" {
			errs = append(errs, fmt.Errorf("%w: %s is missing", ErrConfig, k))
		}
		return v
	}
	c.FrontdoorID = need(KeyFrontdoorID)
	c.Listen = need(KeyListen)
	c.PostgresDSN = need(KeyPostgresDSN)
	c.AMQPURL = need(KeyAMQPURL)
	c.ZitiURL = need(KeyZitiURL)
	c.ZitiUser, _ = get(KeyZitiUser)
	c.ZitiPass, _ = get(KeyZitiPass)
	c.ZitiCert, _ = get(KeyZitiCert)
	c.ZitiKey, _ = get(KeyZitiKey)
	c.ZitiCA, _ = get(KeyZitiCA)
	switch {
	case c.ZitiUser != "" && c.ZitiCert == "":
		if c.ZitiPass == "" {
			errs = append(errs, fmt.Errorf("%w: %s is missing", ErrConfig, KeyZitiPass))
		}
	case c.ZitiCert != "" && c.ZitiUser == "":
		if c.ZitiKey == "" {
			errs = append(errs, fmt.Errorf("%w: %s is missing", ErrConfig, KeyZitiKey))
		}
	default:
		errs = append(errs, fmt.Errorf("%w: give either %s and %s, or %s and %s", ErrConfig, KeyZitiUser, KeyZitiPass, KeyZitiCert, KeyZitiKey))
	}
	hc, err := hosting.HealthCheckFromSettings(get)
	if err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
	}
	c.HealthCheck = hc
	if c.MaxHosts, err = hosting.MaxHostsFromSettings(get); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
	}
	c.DeploymentID, _ = get(KeyDeploymentID)
	if v, _ := get(KeyMetricsListen); v != "" {
		host, _, err := net.SplitHostPort(v)
		ip := net.ParseIP(host)
		if err != nil || (host != "localhost" && (ip == nil || !ip.IsLoopback())) {
			errs = append(errs, fmt.Errorf("%w: %s is %q, want a loopback host:port", ErrConfig, KeyMetricsListen, v))
		}
		c.MetricsListen = v
	}
	for _, u := range []struct {
		key string
		to  *string
	}{{KeyIngressURL, &c.IngressURL}, {KeyNetworkURL, &c.NetworkURL}} {
		v, _ := get(u.key)
		if v == "" {
			continue
		}
		pu, err := url.Parse(v)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" || pu.RawQuery != "" || pu.Fragment != "" {
			errs = append(errs, fmt.Errorf("%w: %s is %q, want an http or https URL with no query", ErrConfig, u.key, v))
			continue
		}
		*u.to = strings.TrimRight(v, "/")
	}
	dur := func(k string, least time.Duration) time.Duration {
		v, ok := get(k)
		if !ok || v == "" {
			return 0
		}
		d, err := time.ParseDuration(v)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%w: %s: %v", ErrConfig, k, err))
		case d < least:
			errs = append(errs, fmt.Errorf("%w: %s is %v, under %v", ErrConfig, k, d, least))
		}
		return d
	}
	c.Reconcile.Interval = dur(KeyReconcileInterval, time.Second)
	c.Reconcile.Grace = dur(KeyReconcileGrace, time.Second)
	c.Reconcile.MinGap = dur(KeyReconcileMinGap, 100*time.Millisecond)
	if v, ok := get(KeyReconcileMaxRepairs); ok && v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("%w: %s is %q, want an integer of at least 1", ErrConfig, KeyReconcileMaxRepairs, v))
		}
		c.Reconcile.MaxRepairs = n
	}
	if len(errs) > 0 {
		sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
		return Config{}, errors.Join(errs...)
	}
	return c, nil
}

// parseTokens reads the settings under api.tokens (keys without that
// prefix: "<principal>" in the older form, "<principal>.<field>"
// otherwise; lists holds the accounts given as lists, by full key). It
// returns the tokens sorted by principal, the principals written in the
// older form, and errs with every problem appended. Errors name the
// setting, never the secret.
func parseTokens(keys map[string]string, lists map[string][]string, errs []error) ([]api.Token, []string, []error) {
	type fields struct {
		legacy, fielded     bool
		secret              string
		hasSecret, hasScope bool
		scope               api.Scope
	}
	byP := map[string]*fields{}
	at := func(p string) *fields {
		if byP[p] == nil {
			byP[p] = &fields{}
		}
		return byP[p]
	}
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...))
	}
	for rest, v := range keys {
		p, f, fielded := strings.Cut(rest, ".")
		if p == "" {
			bad("%s.%s: a token needs a principal", KeyTokens, rest)
			continue
		}
		t := at(p)
		if !fielded {
			t.legacy, t.secret, t.hasSecret = true, v, true
			continue
		}
		t.fielded = true
		key := KeyTokens + "." + rest
		switch f {
		case tokenSecret:
			t.secret, t.hasSecret = v, true
		case tokenAccounts:
			t.hasScope = true
			ids, isList := lists[key]
			switch {
			case !isList && v == AllAccounts:
				t.scope = api.AllAccounts()
			case !isList && v == "", isList && len(ids) == 0:
				bad("%s is empty: list the accounts, or write %q for every account", key, AllAccounts)
			case slices.Contains(ids, AllAccounts):
				bad("%s: %q is not an account; write %s: %s (not in a list) for every account", key, AllAccounts, key, AllAccounts)
			default:
				if !isList {
					ids = []string{v}
				}
				s, err := api.AccountScope(ids...)
				if err != nil {
					bad("%s: an account id is empty", key)
					continue
				}
				t.scope = s
			}
		default:
			bad("%s: unknown field %q of a token (its fields are %s and %s)", key, f, tokenSecret, tokenAccounts)
		}
	}
	ps := make([]string, 0, len(byP))
	for p := range byP {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	var toks []api.Token
	var unscoped []string
	seen := map[string]string{}
	for _, p := range ps {
		t := byP[p]
		key := KeyTokens + "." + p
		switch {
		case t.legacy && t.fielded:
			bad("%s is given both as a token and with fields; write %s.%s and %s.%s", key, key, tokenSecret, key, tokenAccounts)
			continue
		case !t.hasSecret:
			bad("%s.%s is missing", key, tokenSecret)
			continue
		case t.fielded && !t.hasScope:
			bad("%s.%s is missing: list the accounts, or write %q for every account", key, tokenAccounts, AllAccounts)
			continue
		case len(t.secret) < api.MinTokenLength:
			bad("%s: a token needs at least %d characters", key, api.MinTokenLength)
			continue
		}
		if first, dup := seen[t.secret]; dup {
			bad("%s: the token of %s is given again", key, first)
			continue
		}
		seen[t.secret] = p
		if t.legacy {
			t.scope = api.AllAccounts()
			unscoped = append(unscoped, p)
		}
		if t.scope.Empty() {
			continue // its error is already reported
		}
		toks = append(toks, api.Token{Secret: t.secret, Principal: p, Scope: t.scope})
	}
	if len(byP) == 0 {
		bad("%s needs at least one token: %s.<principal>.%s and .%s", KeyTokens, KeyTokens, tokenSecret, tokenAccounts)
	}
	return toks, unscoped, errs
}
