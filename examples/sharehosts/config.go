package sharehosts

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v4"

	"github.com/vipkit/vipkit/hosting"
)

// Setting keys of the config file besides the hosting ones
// (hosting.SettingInterval, SettingTimeout, SettingFailures and
// SettingMaxHosts, under frontdoor's property names). A key may be written dotted
// or nested; both read the same.
const (
	KeyFrontdoorID = "frontdoor-id"
	KeyListen      = "api.listen"
	KeyTokens      = "api.tokens" // api.tokens.<principal>: <token>
	KeyPostgresDSN = "postgres.dsn"
	KeyAMQPURL     = "amqp.url"
	KeyZitiURL     = "ziti.url"
	KeyZitiUser    = "ziti.username"
	KeyZitiPass    = "ziti.password"
	KeyZitiCert    = "ziti.cert-file" // PEM client certificate, for cert login
	KeyZitiKey     = "ziti.key-file"
	KeyZitiCA      = "ziti.ca-file" // PEM CA bundle of the controller
)

// ErrConfig means the config file is missing a setting, has one out of range,
// or has a key this program does not know.
var ErrConfig = errors.New("sharehosts: bad config")

// Config is the daemon's configuration.
type Config struct {
	FrontdoorID string
	Listen      string
	Tokens      map[string]string // token → principal
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
}

var known = []string{KeyFrontdoorID, KeyListen, KeyPostgresDSN, KeyAMQPURL, KeyZitiURL, KeyZitiUser, KeyZitiPass, KeyZitiCert, KeyZitiKey, KeyZitiCA,
	hosting.SettingInterval, hosting.SettingTimeout, hosting.SettingFailures, hosting.SettingMaxHosts}

// LoadConfig reads and checks a YAML config file.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return ParseConfig(b)
}

// flatten turns nested maps into dotted keys with string values.
func flatten(prefix string, v any, out map[string]string) error {
	switch x := v.(type) {
	case map[string]any:
		for k, vv := range x {
			key := k
			if prefix != "" {
				key = prefix + "." + k
			}
			if err := flatten(key, vv, out); err != nil {
				return err
			}
		}
	case nil:
		out[prefix] = ""
	case []any:
		return fmt.Errorf("%w: %s: a list is not a setting", ErrConfig, prefix)
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
	flat := map[string]string{}
	if err := flatten("", raw, flat); err != nil {
		return Config{}, err
	}
	get := func(k string) (string, bool) { v, ok := flat[k]; return v, ok }
	var errs []error
	c := Config{Tokens: map[string]string{}}
	for k, v := range flat {
		if p, ok := strings.CutPrefix(k, KeyTokens+"."); ok {
			if _, dup := c.Tokens[v]; dup {
				errs = append(errs, fmt.Errorf("%w: %s: a token is given twice", ErrConfig, k))
			}
			c.Tokens[v] = p
			continue
		}
		if !slices.Contains(known, k) {
			errs = append(errs, fmt.Errorf("%w: unknown key %s", ErrConfig, k))
		}
	}
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
	if len(c.Tokens) == 0 {
		errs = append(errs, fmt.Errorf("%w: %s needs at least one <principal>: <token>", ErrConfig, KeyTokens))
	}
	for tok, p := range c.Tokens {
		if len(tok) < 16 {
			errs = append(errs, fmt.Errorf("%w: %s.%s: a token needs at least 16 characters", ErrConfig, KeyTokens, p))
		}
	}
	hc, err := hosting.HealthCheckFromSettings(get)
	if err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
	}
	c.HealthCheck = hc
	if c.MaxHosts, err = hosting.MaxHostsFromSettings(get); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
	}
	if len(errs) > 0 {
		sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
		return Config{}, errors.Join(errs...)
	}
	return c, nil
}
